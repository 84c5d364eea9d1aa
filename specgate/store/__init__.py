"""store: what is kept between runs: baselines.json, fingerprints, saved reports and the figures read from them.

May import: measure, serve, config and the bottom modules.
"""
