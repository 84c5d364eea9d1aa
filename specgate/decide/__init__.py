"""decide: gates, statistics and outcomes: numbers in, structured verdicts out.

May import: store, measure, serve, config and the bottom modules; never report, plan or the plugin.
"""
