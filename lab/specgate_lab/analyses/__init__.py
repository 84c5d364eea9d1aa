"""One-off analyses of lab runs (standard library, numpy/scipy at most): ``python -m specgate_lab.analyses.NAME``."""
