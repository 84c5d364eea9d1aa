"""report: every sentence, table, plot and page a user reads: the terminal, summary.md, report.html.

May import: plan, decide and every layer below them.
"""
