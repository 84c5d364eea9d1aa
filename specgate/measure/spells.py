"""A slow spell inside one window: a stretch in which one server's requests ran slower than the
same prompts' other requests, while its partner's did not (a host-bound engine core on a slowed
vCPU), which the pairs do not cancel. The statistic: the contiguous run of requests (in start
order) with the largest sum of negative log-rate residuals against their prompt's median; its
p-value from permuting each prompt's requests among its own places in time (MIN_PER_PROMPT each).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_PER_PROMPT = 3
PERMUTATIONS = 999


@dataclass(frozen=True)
class Spell:
    start: int  # index of the first request of the run (in start order)
    stop: int  # one past its last
    of: int  # requests in the window
    mean_residual: float  # mean log residual of the run's requests (negative: slower)
    p_value: float  # permutation p-value of a run this slow (one-sided)
    started_s: tuple[float, float]  # first and last start, seconds from the window's first request

    @property
    def requests(self) -> int:
        return self.stop - self.start


def residuals(started_at: Sequence[float], rates: Sequence[float], prompts: Sequence[str]
              ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Start times, log residuals against each prompt's median log rate, and prompts, by start."""
    logs = [math.log(r) for r in rates]
    by_prompt: dict[str, list[float]] = defaultdict(list)
    for prompt, value in zip(prompts, logs):
        by_prompt[prompt].append(value)
    medians = {prompt: statistics.median(values) for prompt, values in by_prompt.items()}
    order = sorted(range(len(logs)), key=lambda i: started_at[i])
    return (np.array([started_at[i] for i in order], dtype=float),
            np.array([logs[i] - medians[prompts[i]] for i in order], dtype=float),
            [prompts[i] for i in order])


def _slowest_runs(x: np.ndarray) -> np.ndarray:
    """Per row of ``x`` (residuals), the largest sum of negated residuals over a contiguous run."""
    prefix = np.concatenate([np.zeros((x.shape[0], 1)), np.cumsum(-x, axis=1)], axis=1)
    return (prefix - np.minimum.accumulate(prefix, axis=1)).max(axis=1)


def slow_spell(started_at: Sequence[float], rates: Sequence[float], prompts: Sequence[str], *,
               seed: int = 0, permutations: int = PERMUTATIONS) -> Spell | None:
    """The slowest contiguous run of a window's requests and its (seeded) permutation p-value, or
    None (fewer than MIN_PER_PROMPT requests of a prompt, or none below its median)."""
    counts = Counter(prompts)
    if not counts or min(counts.values()) < MIN_PER_PROMPT:
        return None
    times, x, ordered = residuals(started_at, rates, prompts)
    prefix = np.concatenate([[0.0], np.cumsum(-x)])
    lows = np.minimum.accumulate(prefix)
    stop = int(np.argmax(prefix - lows))
    observed = float(prefix[stop] - lows[stop])
    if observed <= 0:
        return None
    start = int(np.flatnonzero(prefix[: stop + 1] == lows[stop])[-1])
    rng = np.random.default_rng(seed)
    shuffled = np.tile(x, (permutations, 1))
    slots: dict[str, list[int]] = defaultdict(list)
    for i, prompt in enumerate(ordered):
        slots[prompt].append(i)
    for places in slots.values():
        idx = np.array(places)
        picks = np.argsort(rng.random((permutations, len(idx))), axis=1)
        shuffled[:, idx] = x[idx][picks]
    as_slow = int(np.count_nonzero(_slowest_runs(shuffled) >= observed - 1e-12))
    return Spell(start=start, stop=stop, of=len(x), mean_residual=float(np.mean(x[start:stop])),
                 p_value=(1 + as_slow) / (1 + permutations),
                 started_s=(float(times[start] - times[0]), float(times[stop - 1] - times[0])))


def span_mean_residual(started_at: Sequence[float], rates: Sequence[float], prompts: Sequence[str],
                       t0: float, t1: float) -> float | None:
    """The mean log residual of the requests started within [t0, t1] (absolute times), or None."""
    times, x, _ = residuals(started_at, rates, prompts)
    inside = x[(times >= t0) & (times <= t1)]
    return float(np.mean(inside)) if inside.size else None
