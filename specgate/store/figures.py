"""The figures a run's JSON report holds per window, computed in one place for the tables
(:mod:`specgate.report.terminal`) and the plots (:mod:`specgate.report.plots`), so they never show
two numbers for one window.
"""

from __future__ import annotations

import statistics
from typing import Any


def ab_side(window: dict[str, Any] | None) -> str | None:
    """A saved window's A/B side, "candidate" or "reference", or None outside an A/B (older
    reports say "side": "reference" for the reference side only)."""
    if not isinstance(window, dict):
        return None
    if "ab_side" in window:
        return window["ab_side"]
    return "reference" if window.get("side") == "reference" else None


def is_partner(window: dict[str, Any]) -> bool:
    """A saved window that is another's partner (a duet's second server, an A/B's reference)."""
    return window.get("role", window.get("side")) in ("partner", "reference")


def request_rates(measurement: dict[str, Any]) -> list[float]:
    """The window's decode tok/s, one per request that produced tokens."""
    return [r["decode_tokens_per_s"] for r in measurement.get("records", [])
            if r.get("decode_tokens_per_s")]


def median_rate(measurement: dict[str, Any]) -> float | None:
    values = request_rates(measurement)
    return statistics.median(values) if values else None


def gate_ratio(report: dict[str, Any], mode: str, prompt_class: str,
               concurrency: int) -> float | None:
    """The paired ratio the backfire gate measured for this window (the one number its message
    shows), decided or undecided, or None when no such gate ran."""
    window = ("backfire", mode, prompt_class, concurrency)
    for g in [*report.get("gates", []), *report.get("undecided", [])]:
        if ((g.get("gate"), g.get("mode"), g.get("prompt_class"), g.get("concurrency")) == window
                and g.get("details", {}).get("ratio")):
            return float(g["details"]["ratio"])
    return None


def change_percent(report: dict[str, Any], mode: str, prompt_class: str, concurrency: int,
                   median: float, reference_median: float | None) -> float | None:
    """A mode's change against the no-speculation mode on one window, in percent: the backfire
    gate's paired ratio where it ran, else the ratio of the medians; None when neither is known."""
    ratio = gate_ratio(report, mode, prompt_class, concurrency) or (
        median / reference_median if reference_median else None)
    return None if ratio is None else (ratio - 1) * 100
