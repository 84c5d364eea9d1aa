"""The commands over a rig's stored histories: ``build-history --rig NAME --starts N`` runs N
fresh-start sessions back to back, each storing its windows; ``history --rig NAME`` shows the
stored histories (per window and history: its starts, sittings, spread, what its level gate
catches, whether it gates, any step or drift) and draws their levels as a PNG.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tabulate import tabulate

from specgate.config.rig import Rig, load_rig
from specgate.decide.history import MIN_STARTS, StartHistory, change_points
from specgate.decide.settings import window_settings
from specgate.durations import format_elapsed
from specgate.plan.histories import STEP_RULE, describe_history, sittings_words, steps_words
from specgate.report.plots import new_figure, save_figure
from specgate.store.baselines import BaselineEntry, BaselineFile, histories, load_baselines
from specgate.store.fingerprint import SITTING_ENV, machine_id, sitting_id


def _windows(store: BaselineFile, rig: str) -> list[tuple[str, str, int]]:
    return sorted((mode, prompt_class, int(concurrency))
                  for mode, classes in store.rigs.get(rig, {}).items()
                  for prompt_class, levels in classes.items() for concurrency in levels)


def _status(entry: BaselineEntry) -> str:
    if entry.superseded:
        return f"superseded {entry.superseded}: never gates"
    if entry.machine is None:
        return ("machine unknown (stored before machines were recorded, unreadable, or a schema-1 "
                "history of several starts, whose machines cannot be told apart): never gates; "
                "start this machine's history with build-history")
    return "gates runs on this machine"


def history_text(store: BaselineFile, rig: Rig) -> str:
    """The histories of ``rig`` as text: a block per window and history, its starts as a table."""
    blocks = []
    for mode, prompt_class, concurrency in _windows(store, rig.name):
        window = window_settings(rig, mode, prompt_class, concurrency)
        threshold, confidence = 1 - window.level_tolerance, window.confidence
        for entry in histories(store, rig.name, mode, prompt_class, concurrency):
            history = StartHistory.of(entry)
            head = (f"{mode} / {prompt_class} / concurrency {concurrency}: {entry.describe()}; "
                    f"{_status(entry)}")
            rows = [[i + 1, s.date or "-", s.sitting or "-", f"{s.level:.2f}",
                     f"{s.ratio:.3f}" if s.ratio else "-", s.suite_commit or "-"]
                    for i, s in enumerate(entry.starts)]
            lines = [head, tabulate(rows, headers=["start", "date", "sitting", "tok/s",
                                                   "ratio to no_spec", "suite commit"],
                                    tablefmt="simple")]
            if history.usable:
                half = math.expm1(history.half_width(confidence))
                said = describe_history(history, threshold, confidence)
                lines.append(f"mean {history.center:.2f} tok/s; {said}; a new start lands within "
                             f"±{half * 100:.2f} % of the mean {confidence * 100:g} % of the time")
            else:
                lines.append(f"{history.starts} start(s), {sittings_words(history)}: the level "
                             f"gate uses a history from {MIN_STARTS} on")
            steps = steps_words(history.levels, history.sittings)
            lines.append(steps[0].upper() + steps[1:] if steps else
                         f"no step or drift in the stored levels ({STEP_RULE})")
            blocks.append("\n".join(lines))
    return "\n\n".join(blocks) or f"no stored history of rig {rig.name}"


def plot_history(store: BaselineFile, rig: str, out: Path, confidence: float = 0.95) -> Path | None:
    """Levels over the stored starts, one panel per window, one line per history; the gating
    history's prediction band shaded and its change-points marked. None when nothing is stored."""
    windows = _windows(store, rig)
    if not windows:
        return None
    fig = new_figure(9, 3.2 * len(windows))
    axes = fig.subplots(len(windows), 1, squeeze=False)[:, 0]
    for ax, (mode, prompt_class, concurrency) in zip(axes, windows):
        for k, entry in enumerate(histories(store, rig, mode, prompt_class, concurrency)):
            levels = entry.level_history
            x = list(range(1, len(levels) + 1))
            gates = entry.superseded is None and entry.machine is not None
            label = f"{entry.machine or 'unknown machine'} · {entry.build.describe()}" + (
                "" if gates else " (never gates)")
            ax.plot(x, levels, marker="o", linestyle="-" if gates else ":", label=label,
                    color=f"C{k}")
            history = StartHistory.of(entry)
            if history.usable:
                factor = math.exp(history.half_width(confidence))
                ax.axhline(history.center, color=f"C{k}", linewidth=0.8)
                ax.fill_between([0.5, len(levels) + 0.5], history.center / factor,
                                history.center * factor, color=f"C{k}", alpha=0.12,
                                label=f"{confidence * 100:g} % prediction band")
            for point in change_points(levels, history.sittings):
                ax.axvline(point + 0.5, color=f"C{k}", linestyle="--", linewidth=1.0)
        ax.set_title(f"{rig}: {mode} / {prompt_class} / concurrency {concurrency}", fontsize=10)
        ax.set_xlabel("stored start")
        ax.set_ylabel("decode tok/s (window median)")
        ax.legend(fontsize=8, loc="best")
    return save_figure(fig, out / f"history-{rig}.png")


# -- build-history: N fresh-start sessions, each storing its windows ------------------------------
def session_command(rig: str, tier: str, *, baselines: Path, run_dir: Path,
                    pytest_args: Sequence[str]) -> list[str]:
    """The pytest command of one start: the rig's perf tests, its windows stored (and passed)."""
    return [sys.executable, "-m", "pytest", "-m", tier, f"--specgate-rig={rig}",
            f"--specgate-baselines={baselines}", "--specgate-regen-baselines",
            f"--specgate-run-dir={run_dir}", "-p", "no:cacheprovider", *pytest_args]


def history_lines(store: BaselineFile, rig: Rig, machine: str | None = None) -> list[str]:
    """One line per stored window of ``rig`` and history (of ``machine`` only, when given): its
    starts, spread and what its level gate catches (at its class's tolerance)."""
    lines = []
    # the stored keys' order: a concurrency as text
    for window in sorted(_windows(store, rig.name), key=lambda w: (w[0], w[1], str(w[2]))):
        mode, prompt_class, concurrency = window
        threshold = 1 - window_settings(rig, *window).level_tolerance
        for entry in histories(store, rig.name, *window):
            if machine is not None and entry.machine != machine:
                continue
            history = StartHistory.of(entry)
            where = f"{mode} / {prompt_class} / c{concurrency} [{entry.describe()}]"
            if history.usable:
                lines.append(f"  {where}: {describe_history(history, threshold)}")
            else:
                lines.append(f"  {where}: {sittings_words(history)}; the level gate uses a "
                             f"history from {MIN_STARTS} starts on")
    return lines


def build_history(rig_name: str, starts: int, *, fixtures_dir: Path, baselines: Path,
                  runs_dir: Path, pytest_args: Sequence[str] = ()) -> int:
    """Run ``starts`` fresh-start sessions of the rig, each storing its windows, all of one sitting
    (``SPECGATE_SITTING``: the caller's, else minted here); stop at the first that fails (its exit
    code returned)."""
    rig = load_rig(rig_name, fixtures_dir)
    machine = machine_id(rig.tier, os.environ.get("CUDA_VISIBLE_DEVICES"))
    sitting = sitting_id()
    print(f"specgate build-history: {whose_history(load_baselines(baselines), rig_name, machine)}; "
          f"these starts are one sitting ({sitting})", flush=True)
    started = time.monotonic()
    for k in range(1, starts + 1):
        run_dir = runs_dir / f"start-{k:02d}"
        print(f"specgate build-history: start {k}/{starts} of rig {rig_name} "
              f"(run folder {run_dir})", flush=True)
        command = session_command(rig_name, rig.tier, baselines=baselines, run_dir=run_dir,
                                  pytest_args=pytest_args)
        code = subprocess.run(command, env={**os.environ, SITTING_ENV: sitting}).returncode
        if code != 0:
            print(f"specgate build-history: start {k}/{starts} ended with pytest exit code {code}; "
                  f"the {k - 1} start(s) before it stay stored in {baselines}", file=sys.stderr)
            return code
        elapsed = time.monotonic() - started
        print(f"specgate build-history: {k}/{starts} starts stored in {baselines} after "
              f"{format_elapsed(elapsed)} (~{format_elapsed(elapsed / k * (starts - k))} "
              "left)", flush=True)
        for line in history_lines(load_baselines(baselines), rig, machine=machine):
            print(line, flush=True)
    return 0


def whose_history(store: BaselineFile, rig: str, machine: str | None) -> str:
    """What a build-history on ``machine`` does to ``rig``'s stored histories, in one sentence."""
    if machine is None:
        return ("this machine cannot be identified (no GPU UUID, /etc/machine-id or host name): "
                "each start is stored as a history of its own, which never gates")
    found = [h for window in _windows(store, rig) for h in histories(store, rig, *window)]
    own = [h for h in found if h.machine == machine and h.superseded is None]
    others = {h.machine for h in found if h.machine != machine}
    apart = (f"; the histories of {len(others)} other machine(s) (unknown included) are kept apart "
             "and never appended to" if others else "")
    if not own:
        return (f"no history of rig {rig} on this machine ({machine}): this starts this "
                f"machine's history{apart}")
    starts = max(len(h.starts) for h in own)
    return (f"this machine ({machine}) has {len(own)} window history(ies) of rig {rig} (up to "
            f"{starts} starts): each new start extends the one of its window and build, and a "
            "window whose build changed starts a new history (the old one kept, "
            f"superseded){apart}")
