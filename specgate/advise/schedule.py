"""The speculation schedule (issue 64): the k to speculate with per batch-size range, for vLLM's
``speculative_config.num_speculative_tokens_per_batch_size`` (inclusive ``[first, last, k]`` ranges
from 1, k = 0 allowed). Each concurrency stands for the batch sizes nearer it on a log scale; there
the k of the best predicted ratio (the classes' geometric mean) wins, k = 0 where none beats 1."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from pathlib import Path
from statistics import geometric_mean
from typing import TYPE_CHECKING, Any

from specgate.advise.spans import CONSTANT, FITTED, LINEAR, Span, simple_table
from specgate.files import atomic_write_json

if TYPE_CHECKING:
    from specgate.advise.advice import WindowAdvice

SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"
DEFAULT_MAX_BATCH = 1024  # the last range's end where the rig sets no --max-num-seqs (vLLM clamps)


@dataclass(frozen=True)
class Choice:
    """One concurrency's k: its batch sizes, every k's combined ratio, each class's at best k."""

    concurrency: int
    batch_sizes: tuple[int, int]
    k: int  # 0: no speculation at these batch sizes
    combined: dict[int, Span]  # k -> the classes' geometric mean of the predicted ratio
    per_class: dict[str, Span]  # at the best k (the chosen one, or the best rejected one)
    best: int  # the k of the highest combined estimate (k is it, or 0 where it does not beat 1)
    measured: bool  # best is the served k: its ratio is measured, not predicted
    linear_best: tuple[int, Span] | None = None  # the other bound's best k, where it differs


@dataclass(frozen=True)
class Schedule:
    rig: str
    mode: str
    model: str
    served_k: int
    static_config: dict[str, Any]
    choices: tuple[Choice, ...]
    classes: tuple[str, ...]
    confidence: float

    def ranges(self) -> list[list[int]]:
        """[first, last, k] per range, neighbours of the same k merged."""
        out: list[list[int]] = []
        for c in self.choices:
            if out and out[-1][2] == c.k:
                out[-1][1] = c.batch_sizes[1]
            else:
                out.append([c.batch_sizes[0], c.batch_sizes[1], c.k])
        return out

    def speculative_config(self) -> dict[str, Any] | None:
        """What to paste: the served config with the schedule and num_speculative_tokens its
        largest k; None where k = 0 everywhere (no speculation at all)."""
        top = max(c.k for c in self.choices)
        return {**self.static_config, "num_speculative_tokens": top,
                SCHEDULE_KEY: self.ranges()} if top else None

    def to_dict(self, source: str) -> dict[str, Any]:
        ranges = [{"batch_sizes": list(c.batch_sizes), "concurrency": c.concurrency, "k": c.k,
                   "best_k": c.best, "measured": c.measured,
                   "ratio": list(astuple(c.combined[c.best])),
                   "classes": {name: list(astuple(s)) for name, s in c.per_class.items()}}
                  for c in self.choices]
        return {"specgate_schedule": 1, "rig": self.rig, "mode": self.mode, "source": source,
                "model": self.model, "served_k": self.served_k, "confidence": self.confidence,
                "static_config": self.static_config,
                "speculative_config": self.speculative_config(), "ranges": ranges}


def batch_ranges(levels: Sequence[int], max_batch: int) -> list[tuple[int, int]]:
    """Each concurrency's batch sizes: from the geometric middle with the one below (rounded up)
    to just below the next one's; the first from 1, the last to ``max_batch``."""
    starts = [1] + [math.ceil(math.sqrt(a * b)) for a, b in itertools.pairwise(levels)]
    ends = [s - 1 for s in starts[1:]] + [max(max_batch, starts[-1])]
    return list(zip(starts, ends, strict=True))


def _combined(spans: Sequence[Span]) -> Span:
    """Each figure's geometric mean over ``spans`` (0 where one is not positive)."""
    figures = zip(*((s.value or 0.0, s.low, s.high) for s in spans), strict=True)
    return Span(*(geometric_mean(f) if all(v > 0 for v in f) else 0.0 for f in figures))


def _best(spans: dict[int, Span]) -> int:
    return max(spans, key=lambda k: (spans[k].value or 0.0, -k))


def _choice(level: int, batch: tuple[int, int], windows: Sequence[WindowAdvice],
            model: str) -> Choice:
    ks = range(1, min(w.served_k for w in windows) + 1)

    def combined(m: str) -> dict[int, Span]:
        return {k: _combined([w.rows[k - 1].predictions[m].ratio for w in windows]) for k in ks}

    spans = combined(model)
    best = _best(spans)
    linear = None
    if model == CONSTANT:
        other = combined(LINEAR)
        top = _best(other)
        linear = (top, other[top]) if top != best else None
    per_class = {w.prompt_class: w.rows[best - 1].predictions[model].ratio for w in windows}
    measured = all(w.rows[best - 1].measured for w in windows)
    chosen = best if (spans[best].value or 0.0) > 1 else 0
    return Choice(level, batch, chosen, spans, per_class, best, measured, linear)


def build_schedules(windows: Sequence[WindowAdvice], configs: dict[str, dict[str, Any]], *,
                    rig: str, max_batch: int = DEFAULT_MAX_BATCH) -> list[Schedule]:
    """One schedule per speculative mode measured at two or more concurrencies."""
    out = []
    for mode in dict.fromkeys(w.mode for w in windows):
        mine = [w for w in windows if w.mode == mode]
        levels = sorted({w.concurrency for w in mine})
        if len(levels) < 2:
            continue
        model = FITTED if all(FITTED in w.models for w in mine) else CONSTANT
        ranges = zip(levels, batch_ranges(levels, max_batch), strict=True)
        choices = tuple(_choice(level, batch, [w for w in mine if w.concurrency == level], model)
                        for level, batch in ranges)
        config = {k: v for k, v in (configs.get(mode) or {}).items() if k != SCHEDULE_KEY}
        out.append(Schedule(rig, mode, model, max(w.served_k for w in mine), config, choices,
                            tuple(dict.fromkeys(w.prompt_class for w in mine)),
                            min(w.confidence for w in mine)))
    return out


def schedule_text(s: Schedule) -> str:
    rows = []
    for c in s.choices:
        ratio, (first, last) = c.combined[c.best], c.batch_sizes
        what = "measured" if c.measured else "predicted"
        rows.append([f"{first}" if first == last else f"{first}-{last}", f"c{c.concurrency}",
                     str(c.k), f"k={c.best}: {ratio.text(2, 'x')} {what}, {ratio.verdict}"])
    per_class = [[name, *(f"k={c.best}: {c.per_class[name].text(2, 'x')}" for c in s.choices)]
                 for name in s.classes]
    lines = [f"schedule for {s.mode} (served k={s.served_k}; {s.model}; {s.confidence * 100:g} % "
             "intervals): k = 0 where no k's estimate beats no speculation",
             simple_table(rows, ["batch sizes", "measured at", "k",
                                 "best k, classes combined (geometric mean)"]),
             simple_table(per_class, ["class", *(f"c{c.concurrency}" for c in s.choices)])]
    for c in s.choices:
        if c.linear_best is not None:
            k, ratio = c.linear_best
            lines.append(f"c{c.concurrency}: a {LINEAR} would pick k={k} "
                         f"({ratio.text(2, 'x')}); a second served k of the drafter settles it")
    config = s.speculative_config()
    pasted = json.dumps(config) if config else "none (no k beats no speculation anywhere)"
    lines.append(f"speculative_config to paste: {pasted}")
    return "\n".join(lines)


def write_schedule(s: Schedule, folder: Path, *, source: str) -> Path:
    """``<folder>/schedule-<mode>.json``: what --specgate-advise-confirm serves."""
    path = folder / f"schedule-{s.mode}.json"
    atomic_write_json(path, s.to_dict(source))
    return path
