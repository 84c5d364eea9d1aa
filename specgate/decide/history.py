"""A rig's history of server starts: the figures of N fresh-start sessions, stored one after the
other, and what a plain run's stored-level gate can catch with them (the commands that build and
show one: specgate.report.history_view).

``python -m specgate build-history --rig NAME --starts N`` runs N perf sessions of the rig back to
back, each starting its servers afresh and storing its windows (``--specgate-regen-baselines``).
Each stored window keeps its level (the window's median decode tok/s) as one stored start of a
history (specgate.store.baselines: one machine's and one build's), so the level gate of a later plain run
compares with the history's mean and allows for the spread between starts that the history measured:
Student's t at n - 1 degrees of freedom, scaled by sqrt(1 + 1/n) (a new start against the mean of n
stored ones), that prediction interval alone. ``python -m specgate history --rig NAME`` shows every
machine's histories: the levels over time (a table and a PNG), the spread, what the gate catches, and
a step or a drift in the levels (change-points, ruptures' PELT).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from specgate.decide.paired import spread_quantile

# A history needs at least this many starts before its spread is used (two degrees of freedom).
MIN_STARTS = 3


@dataclass(frozen=True)
class StartHistory:
    """The levels of one window over its stored starts (oldest first)."""

    levels: tuple[float, ...]

    @property
    def starts(self) -> int:
        return len(self.levels)

    @property
    def usable(self) -> bool:
        return self.starts >= MIN_STARTS

    @property
    def center(self) -> float:
        """The geometric mean level: what a new start is compared with."""
        return math.exp(sum(math.log(v) for v in self.levels) / self.starts)

    @property
    def log_sd(self) -> float:
        """The start-to-start spread: the SD of the log levels (n - 1 degrees of freedom)."""
        logs = [math.log(v) for v in self.levels]
        mean = sum(logs) / len(logs)
        return math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))

    @property
    def dof(self) -> int:
        return self.starts - 1

    def half_width(self, confidence: float) -> float:
        """How far (log units) a new start's level may lie from the history's mean at ``confidence``
        (two-sided): the prediction interval t(n-1) x sd x sqrt(1 + 1/n)."""
        return spread_quantile(confidence, self.dof) * self.log_sd * math.sqrt(1 + 1 / self.starts)

    def catches(self, threshold: float, confidence: float = 0.95) -> float:
        """The true level ratio a plain run catches 95 % of the time with this history alone: the
        threshold lowered by the interval's half-width and the one-sided 95 % quantile of the same
        t, each on the prediction's scale."""
        one_sided = spread_quantile(0.90, self.dof)  # the one-sided 95 % point of t(n-1)
        scale = self.log_sd * math.sqrt(1 + 1 / self.starts)
        return threshold * math.exp(-(self.half_width(confidence) + one_sided * scale))

    def describe(self, threshold: float, confidence: float = 0.95) -> str:
        return (f"{self.starts} stored starts, start-to-start spread {self.log_sd * 100:.2f} % "
                f"(t, {self.dof} df = {spread_quantile(confidence, self.dof):.2f}); catches a true level ratio "
                f"<= {self.catches(threshold, confidence):.3f}")


def change_points(levels: Sequence[float]) -> list[int]:
    """Where the mean of the log levels steps (indices of the first start after each step): PELT
    (ruptures) on the log levels with a BIC-like penalty, 3 x sigma^2 x ln n, sigma the noise read
    robustly from successive differences (so a step does not inflate it); at least 2 starts a side."""
    if len(levels) < 4:
        return []
    # lazily: ruptures brings scipy's numpy.fft, which a process can load only once, and pytest's
    # in-process runs (pytester) unload what a run imported; only a history with 4+ starts needs it
    import ruptures

    x = np.log(np.asarray(levels, dtype=float))
    sigma = 1.4826 * float(np.median(np.abs(np.diff(x)))) / math.sqrt(2)
    if sigma <= 0:
        sigma = max(float(np.std(x)), 1e-12) / 4  # most successive starts equal: any step stands out
    found = ruptures.Pelt(model="l2", min_size=2, jump=1).fit(x).predict(pen=3 * sigma**2 * math.log(len(x)))
    return [i for i in found if i < len(x)]


def history_steps(levels: Sequence[float]) -> str:
    """The words for a stored history's change-points ("" when none): each step with its size, and
    "a drift" when two or more steps go the same way."""
    points = change_points(levels)
    if not points:
        return ""
    bounds = [0, *points, len(levels)]
    means = [math.exp(float(np.mean(np.log(levels[a:b])))) for a, b in pairwise(bounds)]
    parts = [f"at start {i + 1} {means[k]:.1f} -> {means[k + 1]:.1f} tok/s "
             f"({(means[k + 1] / means[k] - 1) * 100:+.1f} %)" for k, i in enumerate(points)]
    moves = [b > a for a, b in pairwise(means)]
    kind = "a drift" if len(moves) >= 2 and len(set(moves)) == 1 else "a step" if len(points) == 1 else "steps"
    return (f"the stored levels show {kind} ({'; '.join(parts)}): the history's spread holds it, so the gate "
            "is wider than the machine's start noise; if a change caused it, start a new history")
