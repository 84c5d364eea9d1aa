"""A rig's history of server starts: the figures of N fresh-start sessions, stored one after the
other, and what a plain run's stored-level gate can catch with them.

``python -m specgate build-history --rig NAME --starts N`` runs N perf sessions of the rig back to
back, each starting its servers afresh and storing its windows (``--specgate-regen-baselines``).
Each stored window keeps its level (the window's median decode tok/s) as one stored start of a
history (specgate.baselines: one machine's and one build's), so the level gate of a later plain run
compares with the history's mean and allows for the spread between starts that the history measured:
Student's t at n - 1 degrees of freedom, scaled by sqrt(1 + 1/n) (a new start against the mean of n
stored ones), that prediction interval alone. ``python -m specgate history --rig NAME`` shows every
machine's histories: the levels over time (a table and a PNG), the spread, what the gate catches, and
a step or a drift in the levels (change-points, ruptures' PELT).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

from specgate.baselines import BaselineFile, histories, load_baselines
from specgate.config import Rig, load_rig
from specgate.durations import format_elapsed
from specgate.fingerprint import machine_id
from specgate.paired import spread_quantile

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


def session_command(rig: str, tier: str, *, baselines: Path, run_dir: Path, pytest_args: Sequence[str]) -> list[str]:
    """The pytest command of one start: the rig's perf tests, its windows stored (and passed)."""
    return [sys.executable, "-m", "pytest", "-m", tier, f"--specgate-rig={rig}", f"--specgate-baselines={baselines}",
            "--specgate-regen-baselines", f"--specgate-run-dir={run_dir}", "-p", "no:cacheprovider", *pytest_args]


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


def history_lines(store: BaselineFile, rig: Rig, machine: str | None = None) -> list[str]:
    """One line per stored window of ``rig`` and history (of ``machine`` only, when given): its
    starts, spread and what its level gate catches (at its class's tolerance)."""
    lines = []
    for mode, classes in sorted(store.rigs.get(rig.name, {}).items()):
        for prompt_class, levels in sorted(classes.items()):
            threshold = 1 - rig.gates.for_class(prompt_class).level_gate_tolerance
            for concurrency in sorted(levels):
                for entry in histories(store, rig.name, mode, prompt_class, int(concurrency)):
                    if machine is not None and entry.machine != machine:
                        continue
                    history = StartHistory(tuple(entry.level_history))
                    where = f"{mode} / {prompt_class} / c{concurrency} [{entry.describe()}]"
                    if history.usable:
                        lines.append(f"  {where}: {history.describe(threshold)}")
                    else:
                        lines.append(f"  {where}: the level gate uses a history from {MIN_STARTS} starts on")
    return lines


def build_history(rig_name: str, starts: int, *, fixtures_dir: Path, baselines: Path, runs_dir: Path,
                  pytest_args: Sequence[str] = ()) -> int:
    """Run ``starts`` fresh-start sessions of the rig one after the other, each storing its windows.
    Stops at the first session that fails (its exit code is returned); what earlier sessions
    stored stays stored (each writes baselines.json once, atomically, at its end)."""
    rig = load_rig(rig_name, fixtures_dir)
    machine = machine_id(rig.tier, os.environ.get("CUDA_VISIBLE_DEVICES"))
    print(f"specgate build-history: {whose_history(load_baselines(baselines), rig_name, machine)}", flush=True)
    started = time.monotonic()
    for k in range(1, starts + 1):
        run_dir = runs_dir / f"start-{k:02d}"
        print(f"specgate build-history: start {k}/{starts} of rig {rig_name} (run folder {run_dir})", flush=True)
        code = subprocess.run(session_command(rig_name, rig.tier, baselines=baselines, run_dir=run_dir,
                                              pytest_args=pytest_args)).returncode
        if code != 0:
            print(f"specgate build-history: start {k}/{starts} ended with pytest exit code {code}; the "
                  f"{k - 1} start(s) before it stay stored in {baselines}", file=sys.stderr)
            return code
        elapsed = time.monotonic() - started
        print(f"specgate build-history: {k}/{starts} starts stored in {baselines} after "
              f"{format_elapsed(elapsed)} (~{format_elapsed(elapsed / k * (starts - k))} left)", flush=True)
        for line in history_lines(load_baselines(baselines), rig, machine=machine):
            print(line, flush=True)
    return 0


def whose_history(store: BaselineFile, rig: str, machine: str | None) -> str:
    """What a build-history on ``machine`` does to the stored histories of ``rig``, in one sentence."""
    if machine is None:
        return ("this machine cannot be identified (no GPU UUID, /etc/machine-id or host name): each start is "
                "stored as a history of its own, which never gates")
    found = [(key, h) for key, h in _all_histories(store, rig)]
    own = [h for _, h in found if h.machine == machine and h.superseded is None]
    others = {h.machine for _, h in found if h.machine != machine}
    apart = (f"; the histories of {len(others)} other machine(s) (unknown included) are kept apart and never "
             "appended to" if others else "")
    if not own:
        return f"no history of rig {rig} on this machine ({machine}): this starts this machine's history{apart}"
    starts = max(len(h.starts) for h in own)
    return (f"this machine ({machine}) has {len(own)} window history(ies) of rig {rig} (up to {starts} starts): "
            f"each new start extends the one of its window and build, and a window whose build changed starts "
            f"a new history (the old one kept, superseded){apart}")


def _all_histories(store: BaselineFile, rig: str):
    for mode, classes in store.rigs.get(rig, {}).items():
        for prompt_class, levels in classes.items():
            for concurrency in levels:
                for entry in histories(store, rig, mode, prompt_class, int(concurrency)):
                    yield (mode, prompt_class, int(concurrency)), entry
