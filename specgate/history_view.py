"""``python -m specgate history --rig NAME``: the stored histories of a rig as a user reads them.

Per window (mode, prompt class, concurrency) and per history (one machine's, one build's): every stored
start as a table row (its date, level, suite commit), the history's spread and what its level gate
catches, whether it gates (superseded and unknown-machine histories never do), and a step or a drift
in its levels (change-points, specgate.history.change_points). A PNG draws the levels over the starts,
one panel per window, one line per history, the gating history's prediction band shaded.
"""

from __future__ import annotations

import math
from pathlib import Path

from tabulate import tabulate

from specgate.baselines import BaselineEntry, BaselineFile, histories
from specgate.config import Rig
from specgate.history import MIN_STARTS, StartHistory, change_points, history_steps

DPI = 110


def _windows(store: BaselineFile, rig: str) -> list[tuple[str, str, int]]:
    return sorted((mode, prompt_class, int(concurrency))
                  for mode, classes in store.rigs.get(rig, {}).items()
                  for prompt_class, levels in classes.items() for concurrency in levels)


def _status(entry: BaselineEntry) -> str:
    if entry.superseded:
        return f"superseded {entry.superseded}: never gates"
    if entry.machine is None:
        return ("machine unknown (stored before machines were recorded, or unreadable): never gates; start this "
                "machine's history with build-history")
    return "gates runs on this machine"


def history_text(store: BaselineFile, rig: Rig) -> str:
    """The histories of ``rig`` as text: a block per window and history, its starts as a table."""
    blocks = []
    for mode, prompt_class, concurrency in _windows(store, rig.name):
        gates = rig.gates.for_class(prompt_class)
        threshold, confidence = 1 - gates.level_gate_tolerance, gates.confidence
        for entry in histories(store, rig.name, mode, prompt_class, concurrency):
            history = StartHistory(tuple(entry.level_history))
            head = f"{mode} / {prompt_class} / concurrency {concurrency}: {entry.describe()}; {_status(entry)}"
            rows = [[i + 1, s.date or "-", f"{s.level:.2f}", f"{s.ratio:.3f}" if s.ratio else "-",
                     s.suite_commit or "-"] for i, s in enumerate(entry.starts)]
            lines = [head, tabulate(rows, headers=["start", "date", "tok/s", "ratio to no_spec", "suite commit"],
                                    tablefmt="simple")]
            if history.usable:
                half = math.expm1(history.half_width(confidence))
                lines.append(f"mean {history.center:.2f} tok/s; {history.describe(threshold, confidence)}; a new "
                             f"start lands within ±{half * 100:.2f} % of the mean {confidence * 100:g} % of the time")
            else:
                lines.append(f"{history.starts} start(s): the level gate uses a history from {MIN_STARTS} on")
            steps = history_steps(entry.level_history)
            lines.append(steps[0].upper() + steps[1:] if steps else "no step or drift in the stored levels")
            blocks.append("\n".join(lines))
    if not blocks:
        return f"no stored history of rig {rig.name}"
    return "\n\n".join(blocks)


def plot_history(store: BaselineFile, rig: str, out: Path, confidence: float = 0.95) -> Path | None:
    """Levels over the stored starts, one panel per window, one line per history; the gating
    history's prediction band shaded and its change-points marked. None when nothing is stored."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    windows = _windows(store, rig)
    if not windows:
        return None
    fig = Figure(figsize=(9, 3.2 * len(windows)), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(windows), 1, squeeze=False)[:, 0]
    for ax, (mode, prompt_class, concurrency) in zip(axes, windows):
        for k, entry in enumerate(histories(store, rig, mode, prompt_class, concurrency)):
            levels = entry.level_history
            x = list(range(1, len(levels) + 1))
            gates = entry.superseded is None and entry.machine is not None
            label = f"{entry.machine or 'unknown machine'} · {entry.build.describe()}" + (
                "" if gates else " (never gates)")
            ax.plot(x, levels, marker="o", linestyle="-" if gates else ":", label=label, color=f"C{k}")
            history = StartHistory(tuple(levels))
            if history.usable:
                factor = math.exp(history.half_width(confidence))
                ax.axhline(history.center, color=f"C{k}", linewidth=0.8)
                ax.fill_between([0.5, len(levels) + 0.5], history.center / factor, history.center * factor,
                                color=f"C{k}", alpha=0.12, label=f"{confidence * 100:g} % prediction band")
            for point in change_points(levels):
                ax.axvline(point + 0.5, color=f"C{k}", linestyle="--", linewidth=1.0)
        ax.set_title(f"{rig}: {mode} / {prompt_class} / concurrency {concurrency}", fontsize=10)
        ax.set_xlabel("stored start")
        ax.set_ylabel("decode tok/s (window median)")
        ax.legend(fontsize=8, loc="best")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"history-{rig}.png"
    fig.savefig(path)
    return path
