"""store: what is kept between runs: baselines.json, fingerprints, saved reports, their figures.

May import: measure, serve, config and the bottom modules.
"""
