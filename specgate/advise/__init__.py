"""advise: advice from measured windows: the best k, the speculation schedule, their intervals and
plots.

May import: report and every layer below it.
"""
