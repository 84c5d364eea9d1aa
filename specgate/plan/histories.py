"""A stored history in words (specgate.decide.history computes it): its spread, its sittings, what
its level gate catches and a step in its levels, as ``plan``, ``history`` and a gate's full
statement say them."""

from __future__ import annotations

from collections.abc import Sequence

from specgate.decide.history import StartHistory, step_means
from specgate.decide.paired import spread_quantile

# How far apart sittings can read (docs/statistics.md, the GPU lab): a one-sitting history's words.
LEASES_APART = ("levels of one machine kind have read 1.7-3.7 % apart between leases, "
                "docs/statistics.md")
STEP_RULE = ("the rule: a step only within a sitting, where the mean log levels either side (2+ "
             "starts a side) differ by more than their spread explains: a two-sample t-test at "
             "1 % over every split tried (Bonferroni; binary segmentation); sittings differ "
             "by design, their spread is in the interval and never a step")


def sittings_words(history: StartHistory) -> str:
    """Which sittings the history holds and whether the interval holds the spread between them."""
    k = len(history.groups)
    if not history.recorded:
        return ("sittings not recorded (stored before specgate recorded them): taken as one "
                f"sitting, so the spread between sittings is not in the interval: {LEASES_APART}")
    if k == 1:
        return (f"one sitting: the spread between sittings is not in the interval: {LEASES_APART}; "
                "build-history in a later sitting adds it")
    ones = (" (the starts stored before sittings were recorded count as one)"
            if None in history.sittings else "")
    if history.starts == k:
        return f"{k} sittings{ones}, one start each: the spread is between sittings"
    within, between, _, _ = history.components  # from 3 starts: a spread within and between
    return (f"{k} sittings{ones}: within them {within * 100:.2f} %, between them "
            f"{between * 100:.2f} % (one-way random effects), both in the interval, t at the "
            "smaller df (Hsu)")


def describe_history(history: StartHistory, threshold: float, confidence: float = 0.95) -> str:
    """'6 stored starts, start-to-start spread 1.23 % (...; t, 5 df = 2.57); catches ... 0.951'."""
    return (f"{history.starts} stored starts, start-to-start spread {history.log_sd * 100:.2f} % "
            f"({sittings_words(history)}; t, {history.dof} df = "
            f"{spread_quantile(confidence, history.dof):.2f}); catches a true level ratio <= "
            f"{history.catches(threshold, confidence):.3f}")


def steps_words(levels: Sequence[float], sittings: Sequence[str | None] | None = None) -> str:
    """A stored history's steps within its sittings ("" when none): each step with the mean levels
    either side of it in its sitting, "a drift" when two or more go the same way, and the rule."""
    steps = step_means(levels, sittings)
    if not steps:
        return ""
    parts = [f"at start {i + 1} {a:.1f} -> {b:.1f} tok/s ({(b / a - 1) * 100:+.1f} %)"
             for i, a, b in steps]
    moves = [b > a for _, a, b in steps]
    kind = ("a drift" if len(moves) >= 2 and len(set(moves)) == 1
            else "a step" if len(steps) == 1 else "steps")
    return (f"the stored levels show {kind} ({'; '.join(parts)}): the history's spread holds it, "
            "so the gate is wider than the machine's start noise; if a change caused it, start a "
            f"new history ({STEP_RULE})")
