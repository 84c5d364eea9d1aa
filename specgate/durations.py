"""Durations as specgate prints them (``12m05s``, ``42s``): one format for progress, plans and
verdicts."""


def format_elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    if minutes >= 100:  # hours and minutes past 100 minutes: 2h24m, not 143m36s
        hours, minutes = divmod(minutes, 60)
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
