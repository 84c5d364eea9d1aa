"""Durations as specgate prints them (``12m05s``, ``42s``): one format for progress, plans and verdicts."""


def format_elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
