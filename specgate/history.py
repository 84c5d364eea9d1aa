"""A rig's history of server starts: the figures of N fresh-start sessions, stored one after the
other, and what a plain run's stored-level gate can catch with them.

``python -m specgate build-history --rig NAME --starts N`` runs N perf sessions of the rig back to
back, each starting its servers afresh and storing its windows (``--specgate-regen-baselines``).
Each stored window keeps its level (the window's median decode tok/s) in ``level_history``, one
entry per start, so the level gate of a later plain run compares with the history's mean and
allows for the spread between starts that the history measured: Student's t at n - 1 degrees of
freedom, scaled by sqrt(1 + 1/n) (a new start against the mean of n stored ones). A history
belongs to the machine it was measured on (the fingerprint's machine check).
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specgate.durations import format_elapsed
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


def history_lines(store, rig: str, threshold: float) -> list[str]:
    """One line per stored window of ``rig``: its starts, spread and what its level gate catches."""
    lines = []
    for mode, classes in sorted(store.rigs.get(rig, {}).items()):
        for prompt_class, levels in sorted(classes.items()):
            for concurrency, entry in sorted(levels.items()):
                history = StartHistory(tuple(entry.level_history))
                where = f"{mode} / {prompt_class} / c{concurrency}"
                if history.usable:
                    lines.append(f"  {where}: {history.describe(threshold)}")
                else:
                    lines.append(f"  {where}: {history.starts} stored start(s); the level gate uses a history "
                                 f"from {MIN_STARTS} on")
    return lines


def build_history(rig_name: str, starts: int, *, fixtures_dir: Path, baselines: Path, runs_dir: Path,
                  pytest_args: Sequence[str] = ()) -> int:
    """Run ``starts`` fresh-start sessions of the rig one after the other, each storing its windows.
    Stops at the first session that fails (its exit code is returned); what earlier sessions
    stored stays stored (each writes baselines.json once, atomically, at its end)."""
    from specgate.baselines import load_baselines
    from specgate.config import load_rig

    rig = load_rig(rig_name, fixtures_dir)
    threshold = 1 - (rig.gates.level_tolerance if rig.gates.level_tolerance is not None
                     else rig.gates.throughput_tolerance)
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
        for line in history_lines(load_baselines(baselines), rig_name, threshold):
            print(line, flush=True)
    return 0
