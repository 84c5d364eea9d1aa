"""A rig's history of server starts (``python -m specgate build-history``: N sessions back to back,
each storing its windows): the level gate of a later run compares with the history's mean within its
prediction interval. Each start names its sitting (specgate.store.fingerprint.sitting_id); from two
sittings on the interval holds the spread between sittings too (:attr:`StartHistory.components`).
Shown by specgate.report.history_view."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from specgate.decide.paired import spread_quantile

if TYPE_CHECKING:
    from specgate.store.baselines import BaselineEntry

MIN_STARTS = 3  # a history's spread is used from this many starts (two degrees of freedom)
STEP_ALPHA = 0.01  # a history with no step shows one at most this often (normal levels)


@dataclass(frozen=True)
class StartHistory:
    """One window's stored levels (oldest first) and each start's sitting (None: unknown)."""

    levels: tuple[float, ...]
    sittings: tuple[str | None, ...] | None = None

    @classmethod
    def of(cls, entry: BaselineEntry | None, *, ratios: bool = False) -> StartHistory:
        """A stored history's levels (``ratios``: its ratios to no speculation), sittings."""
        starts = [s for s in (entry.starts if entry is not None else ()) if not ratios
                  or s.ratio is not None]
        return cls(tuple(s.ratio if ratios else s.level for s in starts),
                   tuple(s.sitting for s in starts))

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
        """The SD of the log levels, the starts as one sample (n - 1 df)."""
        logs = [math.log(v) for v in self.levels]
        mean = sum(logs) / len(logs)
        return math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))

    @property
    def groups(self) -> list[list[float]]:
        """The log levels by sitting, in the order the sittings began."""
        found: dict[str | None, list[float]] = {}
        for level, sitting in zip(self.levels, self.sittings or [None] * self.starts):
            found.setdefault(sitting, []).append(math.log(level))
        return list(found.values())

    @property
    def recorded(self) -> bool:
        """Whether any start's sitting is recorded."""
        return any(s is not None for s in self.sittings or ())

    @cached_property
    def components(self) -> tuple[float, float, float, int]:
        """(within-sitting SD, between-sitting SD, a new start's SD in a new sitting, its df), log
        units: one-way random effects on the log levels, a new start's variance estimated without
        bias as a MSW + b MSB with t at the smaller df (Hsu; tests/test_sittings.py). One sitting,
        or one start a sitting: the starts as one sample, t(N - 1) x sd x sqrt(1 + 1/N)."""
        n, sd = self.starts, self.log_sd
        groups = self.groups
        k = len(groups)
        if k < 2 or n == k:
            return sd, 0.0, sd * math.sqrt(1 + 1 / n), n - 1
        means = [sum(g) / len(g) for g in groups]
        grand = sum(sum(g) for g in groups) / n
        msw = sum((x - m) ** 2 for g, m in zip(groups, means) for x in g) / (n - k)
        msb = sum(len(g) * (m - grand) ** 2 for g, m in zip(groups, means)) / (k - 1)
        n0 = (n - sum(len(g) ** 2 for g in groups) / n) / (k - 1)
        b = (1 + sum(len(g) ** 2 for g in groups) / n**2) / n0
        variance = max(0.0, 1 + 1 / n - b) * msw + b * msb
        between = math.sqrt(max(0.0, msb - msw) / n0)
        return math.sqrt(msw), between, math.sqrt(variance), min(n - k, k - 1)

    @property
    def prediction_sd(self) -> float:
        """The SD (log units) of a new start around the history's mean (:attr:`components`)."""
        return self.components[2]

    @property
    def dof(self) -> int:
        return self.components[3]

    def half_width(self, confidence: float) -> float:
        """How far (log units) a new start may lie from the mean at ``confidence``."""
        return spread_quantile(confidence, self.dof) * self.prediction_sd

    def catches(self, threshold: float, confidence: float = 0.95) -> float:
        """The true level ratio a plain run catches 95 % of the time with this history alone."""
        one_sided = spread_quantile(0.90, self.dof)  # the one-sided 95 % point of t
        return threshold * math.exp(-(self.half_width(confidence) + one_sided * self.prediction_sd))


def _splits(x: np.ndarray, offset: int, alpha: float) -> list[int]:
    """Binary segmentation of one sitting's log levels: the split (2 starts a side at least) with
    the largest two-sample t, kept above t(m - 2) at 1 - alpha / (m - 3), then each side alike."""
    m = len(x)
    if m < 4:
        return []
    best, at = -1.0, 0
    for i in range(2, m - 1):
        a, b = x[:i], x[i:]
        squares = float(((a - a.mean()) ** 2).sum()) + float(((b - b.mean()) ** 2).sum())
        sd = math.sqrt(squares / (m - 2))
        diff = abs(float(b.mean() - a.mean()))
        t = (diff / (sd * math.sqrt(1 / i + 1 / (m - i))) if sd > 0
             else math.inf if diff > 0 else 0.0)
        if t > best:
            best, at = t, i
    if best <= spread_quantile(1 - alpha / (m - 3), m - 2):
        return []
    return [*_splits(x[:at], offset, alpha), offset + at, *_splits(x[at:], offset + at, alpha)]


def change_points(levels: Sequence[float],
                  sittings: Sequence[str | None] | None = None) -> list[int]:
    """Indices of the first start after each step within a sitting (STEP_RULE)."""
    x = np.log(np.asarray(levels, dtype=float))
    labels = list(sittings) if sittings is not None else [None] * len(x)
    runs = [[i for i, s in enumerate(labels) if s == label] for label in dict.fromkeys(labels)]
    alpha = STEP_ALPHA / max(1, sum(len(run) >= 4 for run in runs))  # over the sittings searched
    return sorted(run[i] for run in runs for i in _splits(x[run], 0, alpha))


def step_means(levels: Sequence[float], sittings: Sequence[str | None] | None = None
               ) -> list[tuple[int, float, float]]:
    """Each step's index and the mean levels either side in its sitting; [] when none."""
    points = change_points(levels, sittings)
    labels = list(sittings) if sittings is not None else [None] * len(levels)
    edges = sorted({0, len(levels), *points,
                    *(i for i in range(1, len(levels)) if labels[i] != labels[i - 1])})
    steps = []
    for i in points:  # the means either side of the step, inside its sitting
        lo, hi = edges[edges.index(i) - 1], edges[edges.index(i) + 1]
        a, b = (math.exp(float(np.mean(np.log(levels[x:y])))) for x, y in ((lo, i), (i, hi)))
        steps.append((i, a, b))
    return steps
