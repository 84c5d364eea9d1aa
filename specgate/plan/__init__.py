"""plan: what a run will cost before it starts, and its progress while it runs.

May import: decide and every layer below it.
"""
