"""Plots of a run, drawn from its JSON report (``SpecgateSession.report_data``) like the tables.

- :func:`plot_throughput`: per prompt class and mode, the median decode tok/s per request with its
  interquartile range, and every request as a dot; one panel per concurrency level;
- :func:`plot_acceptance`: per-position acceptance rate (accepted at draft position i / drafts)
  for every (mode, class) of the speculative modes; one panel per concurrency level.

Both return the path written, or None when there is nothing to draw (no file is written then).

matplotlib is imported inside the functions (it costs a few hundred milliseconds, and most of
specgate never draws). Figures are plain ``matplotlib.figure.Figure`` objects on an explicit Agg
canvas: no pyplot, no GUI backend, no global figure registry, so nothing is left open after a
save and the host process's backend is never changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specgate.report_figures import change_percent, median_rate, request_rates

REFERENCE_COLOR = "#8c8c8c"
MODE_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
FAIL_COLOR = "#c00000"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")
DPI = 110


# -- data -----------------------------------------------------------------------------------
def _quartiles(values: list[float]) -> tuple[float, float, float]:
    import numpy as np

    q1, median, q3 = np.percentile(values, [25, 50, 75])
    return float(q1), float(median), float(q3)


def _modes(report: dict[str, Any], measurements: list[dict[str, Any]]) -> list[str]:
    """Measured modes, the reference (no speculation) first, then the rig's order."""
    reference = report["rig"]["reference_mode"]
    measured = list(dict.fromkeys(m["mode"] for m in measurements))
    ordered = [m for m in report["rig"].get("modes", {}) if m in measured and m != reference]
    ordered += [m for m in measured if m not in ordered and m != reference]
    return ([reference] if reference in measured else []) + ordered


def _failed(report: dict[str, Any]) -> set[tuple[str, str, int]]:
    """(mode, class, concurrency) with a failed gate that is not a declared backfire."""
    return {(g["mode"], g["prompt_class"], g["concurrency"]) for g in report.get("gates", [])
            if not g["passed"] and not g.get("declared")}


def _acceptance_lines(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in report.get("measurements", [])
            if m.get("acceptance") and m["acceptance"].get("per_position_rates")]


# -- drawing helpers ----------------------------------------------------------------------------
def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(path, format="png", dpi=DPI)
    finally:
        fig.clear()  # no pyplot: nothing registered; drop the artists now rather than at GC
    return path


def _title(report: dict[str, Any]) -> str:
    rig = report["rig"]
    model = Path(str(rig.get("model", ""))).name
    partial = "" if report.get("complete", True) else "  [partial run]"
    what = f"{rig.get('tier', '?')} tier" + (f", {model}" if model else "")
    return f"specgate: rig {rig['name']} ({what}){partial}"


# -- throughput -------------------------------------------------------------------------------
def plot_throughput(report: dict[str, Any], path: Path) -> Path | None:
    """Grouped bars per prompt class (one per mode, reference first): median decode tok/s per
    request, IQR as error bars, each request as a dot, the change against the reference above
    the speculative bars (red where a gate failed). One panel per concurrency level."""
    measurements = [m for m in report.get("measurements", []) if request_rates(m)]
    if not measurements:
        return None
    reference = report["rig"]["reference_mode"]
    modes = _modes(report, measurements)
    levels = sorted({m["concurrency"] for m in measurements})
    classes = list(dict.fromkeys(m["prompt_class"] for m in measurements))
    failed = _failed(report)
    speculative = [m for m in modes if m != reference]
    colors = {mode: MODE_COLORS[i % len(MODE_COLORS)] for i, mode in enumerate(speculative)}
    colors[reference] = REFERENCE_COLOR

    import numpy as np

    width_in = max(7.0, 1.0 + len(classes) * (0.5 + 0.45 * len(modes)))
    fig = _figure(width_in, 0.6 + 3.6 * len(levels))
    axes = fig.subplots(len(levels), 1, squeeze=False)[:, 0]
    bar_w = 0.8 / len(modes)
    rng = np.random.default_rng(0)  # fixed jitter: the same report draws the same picture
    for ax, level in zip(axes, levels, strict=True):
        by = {(m["mode"], m["prompt_class"]): m for m in measurements if m["concurrency"] == level}
        level_classes = [c for c in classes if any((mode, c) in by for mode in modes)]
        top = 0.0
        for i, mode in enumerate(modes):
            xs, medians, lows, highs = [], [], [], []
            for j, prompt_class in enumerate(level_classes):
                m = by.get((mode, prompt_class))
                if m is None:
                    continue
                values = request_rates(m)
                q1, median, q3 = _quartiles(values)
                x = j - 0.4 + bar_w * (i + 0.5)
                xs.append(x)
                medians.append(median)
                lows.append(median - q1)
                highs.append(q3 - median)
                jitter = rng.uniform(-bar_w * 0.22, bar_w * 0.22, len(values))
                ax.scatter(x + jitter, values, s=9, color="black", alpha=0.55, linewidths=0, zorder=3)
                top = max(top, q3, *values)
                ref = by.get((reference, prompt_class))
                if mode != reference and ref is not None:
                    change = change_percent(report, mode, prompt_class, level, median, median_rate(ref))
                    bad = (mode, prompt_class, level) in failed
                    ax.annotate(f"{change:+.0f} %" + (" FAIL" if bad else ""),
                                (x, max(q3, *values)), xytext=(0, 3), textcoords="offset points",
                                ha="center", va="bottom", fontsize=7.5, rotation=90 if bad else 0,
                                color=FAIL_COLOR if bad else "#333333",
                                fontweight="bold" if bad else "normal", zorder=4)
            label = f"{mode} (no speculation)" if mode == reference else mode
            ax.bar(xs, medians, width=bar_w * 0.92, color=colors[mode], label=label, zorder=2,
                   yerr=[lows, highs], error_kw={"elinewidth": 1.2, "capsize": 3, "ecolor": "#222222"})
        ax.set_xticks(range(len(level_classes)))
        ax.set_xticklabels(level_classes, rotation=20 if len(level_classes) > 6 else 0,
                           ha="right" if len(level_classes) > 6 else "center")
        ax.set_xlim(-0.6, len(level_classes) - 0.4)
        ax.set_ylim(0, top * 1.18 if top > 0 else 1)
        ax.set_xlabel("prompt class")
        ax.set_ylabel("decode tok/s per request")
        ax.set_title(f"concurrency {level}", fontsize=10)
        ax.grid(axis="y", alpha=0.3, zorder=0)
        ax.set_axisbelow(True)
        ax.legend(loc="best", fontsize=8.5, frameon=True, framealpha=0.9)
    fig.suptitle(f"{_title(report)}\ndecode tok/s per request: bar = median, whiskers = IQR, "
                 f"dots = requests, label = the backfire gate's paired ratio to {reference}", fontsize=10.5)
    return _save(fig, path)


# -- acceptance -------------------------------------------------------------------------------
def plot_acceptance(report: dict[str, Any], path: Path) -> Path | None:
    """Per-position acceptance rate (x: draft position 1..k, y: accepted at that position / drafts,
    in [0, 1]): one line per (mode, class) of the speculative modes; colour = class, line style
    and marker = mode. One panel per concurrency level."""
    lines = _acceptance_lines(report)
    if not lines:
        return None
    levels = sorted({m["concurrency"] for m in lines})
    modes = _modes(report, lines)
    classes = list(dict.fromkeys(m["prompt_class"] for m in lines))
    class_color = {c: MODE_COLORS[i % len(MODE_COLORS)] for i, c in enumerate(classes)}
    mode_style = {mode: (LINESTYLES[i % len(LINESTYLES)], MARKERS[i % len(MARKERS)])
                  for i, mode in enumerate(modes)}
    k_max = max(len(m["acceptance"]["per_position_rates"]) for m in lines)

    fig = _figure(max(9.5, 6.5 + 0.5 * k_max), 0.6 + 3.6 * len(levels))
    axes = fig.subplots(len(levels), 1, squeeze=False)[:, 0]
    for ax, level in zip(axes, levels, strict=True):
        for m in sorted((m for m in lines if m["concurrency"] == level),
                        key=lambda m: (modes.index(m["mode"]), classes.index(m["prompt_class"]))):
            acc = m["acceptance"]
            rates = acc["per_position_rates"]
            style, marker = mode_style[m["mode"]]
            label = f"{m['mode']} / {m['prompt_class']}"
            if acc.get("mean_acceptance_length") is not None:
                label += f"  (mean acc. length {acc['mean_acceptance_length']:.2f})"
            ax.plot(range(1, len(rates) + 1), rates, linestyle=style, marker=marker, markersize=5,
                    linewidth=1.6, color=class_color[m["prompt_class"]], label=label)
        ax.set_xlim(0.7, k_max + 0.3)
        ax.set_xticks(range(1, k_max + 1))
        ax.set_ylim(0, 1)
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance rate\n(accepted at position / drafts)")
        ax.set_title(f"concurrency {level}", fontsize=9.5)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.suptitle(f"{_title(report)}\nper-position acceptance rate (vLLM spec-decode counters)", fontsize=11)
    return _save(fig, path)
