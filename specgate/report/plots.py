"""Plots of a run, drawn from its JSON report like the tables: :func:`plot_forest`,
:func:`plot_throughput` and :func:`plot_acceptance`, one panel per concurrency; each returns the
path written, or None with nothing to draw (no file then).

matplotlib is imported inside the functions (most of specgate never draws); figures are plain
``Figure`` objects on an Agg canvas: no pyplot, no GUI backend, nothing left open after a save.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from specgate.report.comparisons import ab_reference, gate_comparisons
from specgate.store.figures import change_percent, median_rate, request_rates

REFERENCE_COLOR = "#8c8c8c"
MODE_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
               "#e377c2", "#17becf")
FAIL_COLOR = "#c00000"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")
DPI = 110


# -- data -----------------------------------------------------------------------------------
def _modes(report: dict[str, Any], measurements: list[dict[str, Any]]) -> list[str]:
    """Measured modes, the reference (no speculation) first, then the rig's order."""
    reference = report["rig"]["reference_mode"]
    measured = list(dict.fromkeys(m["mode"] for m in measurements))
    ordered = [m for m in report["rig"].get("modes", {}) if m in measured and m != reference]
    ordered += [m for m in measured if m not in ordered and m != reference]
    return ([reference] if reference in measured else []) + ordered


# -- drawing helpers ----------------------------------------------------------------------------
def new_figure(width: float, height: float):
    """A Figure on an Agg canvas, ``width`` x ``height`` inches at DPI, constrained layout."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, path: Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` (its folder made) and drop its artists."""
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


def _suptitle(fig, width_in: float, title: str, subtitle: str, fontsize: float) -> None:
    """The figure's title and subtitle, the subtitle wrapped to the figure's width (constrained
    layout makes room for a title's height, never its width)."""
    import textwrap

    # an average character of the default sans-serif is about 0.55 of its size wide
    chars = max(40, int(width_in * 72 / (fontsize * 0.56)))
    fig.suptitle("\n".join([title, *textwrap.wrap(subtitle, chars)]), fontsize=fontsize)


# -- throughput -------------------------------------------------------------------------------
def _ab_ratio(report: dict[str, Any], mode: str, prompt_class: str,
              concurrency: int) -> float | None:
    """The A/B throughput gate's paired ratio on this window (decided or undecided), or None."""
    for g in [*report.get("gates", []), *report.get("undecided", [])]:
        where = (g.get("gate"), g.get("mode"), g.get("prompt_class"), g.get("concurrency"))
        if where == ("throughput", mode, prompt_class, concurrency) and (
                (g.get("details") or {}).get("ratio")):
            return float(g["details"]["ratio"])
    return None


def _throughput_series(report: dict[str, Any], measurements: list[dict[str, Any]]
                       ) -> list[tuple[str, str, dict[tuple[str, int], dict[str, Any]]]]:
    """The bars of each prompt class, in order: (label, kind, windows by (class, concurrency));
    kind is "reference" (no speculation), "ab-reference" and "ab-candidate" (an A/B's two sides)
    or "mode"."""
    reference = report["rig"]["reference_mode"]
    series = []
    for mode in _modes(report, measurements):
        own = {(m["prompt_class"], m["concurrency"]): m for m in measurements if m["mode"] == mode}
        sides = {k: ref for k, m in own.items() if (ref := ab_reference(m)) is not None
                 and request_rates(ref)}
        if sides:
            series.append((f"{mode} @ reference side", "ab-reference", sides))
            series.append((f"{mode} @ candidate", "ab-candidate", own))
        else:
            series.append((f"{mode} (no speculation)" if mode == reference else mode,
                           "reference" if mode == reference else "mode", own))
    return series


def plot_throughput(report: dict[str, Any], path: Path) -> Path | None:
    """Grouped bars per prompt class: median decode tok/s per request, IQR as error bars, each
    request as a dot, the change against the reference above the bar (red where a gate failed)."""
    fig = throughput_figure(report)
    return None if fig is None else save_figure(fig, path)


def _bar_change(report: dict[str, Any], series: list, kind: str, m: dict[str, Any],
                median: float) -> float | None:
    """The % change a bar of ``m`` is labelled with: an A/B candidate's paired ratio to its
    reference side, a mode's change against the reference mode; None for the rest."""
    mode, prompt_class, concurrency = m["mode"], m["prompt_class"], m["concurrency"]
    if kind == "ab-candidate":
        ref_side = ab_reference(m)
        ref_median = median_rate(ref_side) if ref_side else None
        ratio = _ab_ratio(report, mode, prompt_class, concurrency) or (
            median / ref_median if ref_median else None)
        return None if ratio is None else (ratio - 1) * 100
    if kind == "mode":
        ref = next((w.get((prompt_class, concurrency)) for _, k, w in series
                    if k == "reference"), None)
        if ref is not None:
            return change_percent(report, mode, prompt_class, concurrency, median, median_rate(ref))
    return None


def throughput_figure(report: dict[str, Any]):
    """:func:`plot_throughput`'s figure, not saved; None when there is nothing to draw."""
    measurements = [m for m in report.get("measurements", []) if request_rates(m)]
    if not measurements:
        return None
    reference = report["rig"]["reference_mode"]
    series = _throughput_series(report, measurements)
    ab = any(kind == "ab-candidate" for _, kind, _ in series)
    concurrencies = sorted({m["concurrency"] for m in measurements})
    classes = list(dict.fromkeys(m["prompt_class"] for m in measurements))
    # windows with a failed gate that is not a declared backfire
    failed = {(g["mode"], g["prompt_class"], g["concurrency"]) for g in report.get("gates", [])
              if not g["passed"] and not g.get("declared")}
    colors: dict[str, str] = {}
    palette = itertools.cycle(MODE_COLORS)
    # an A/B's two sides share their mode's colour (the reference hatched)
    for label, kind, _ in series:
        colors[label] = REFERENCE_COLOR if kind == "reference" else (
            colors[next(reversed(colors))] if kind == "ab-candidate" else next(palette))

    import numpy as np

    width_in = max(7.0, 1.0 + len(classes) * (0.5 + 0.45 * len(series)))
    fig = new_figure(width_in, 0.9 + 3.6 * len(concurrencies))
    axes = fig.subplots(len(concurrencies), 1, squeeze=False)[:, 0]
    bar_w = 0.8 / len(series)
    rng = np.random.default_rng(0)  # fixed jitter: the same report draws the same picture
    for ax, concurrency in zip(axes, concurrencies, strict=True):
        concurrency_classes = [c for c in classes
                               if any((c, concurrency) in w for _, _, w in series)]
        top = 0.0
        for i, (label, kind, windows) in enumerate(series):
            xs, medians, lows, highs = [], [], [], []
            for j, prompt_class in enumerate(concurrency_classes):
                m = windows.get((prompt_class, concurrency))
                if m is None:
                    continue
                values = request_rates(m)
                q1, median, q3 = map(float, np.percentile(values, [25, 50, 75]))
                x = j - 0.4 + bar_w * (i + 0.5)
                xs.append(x)
                medians.append(median)
                lows.append(median - q1)
                highs.append(q3 - median)
                jitter = rng.uniform(-bar_w * 0.22, bar_w * 0.22, len(values))
                ax.scatter(x + jitter, values, s=9, color="black", alpha=0.55,
                           linewidths=0, zorder=3)
                top = max(top, q3, *values)
                mode = m["mode"]
                if (change := _bar_change(report, series, kind, m, median)) is not None:
                    bad = (mode, prompt_class, concurrency) in failed
                    ax.annotate(f"{change:+.0f} %" + (" FAIL" if bad else ""),
                                (x, max(q3, *values)), xytext=(0, 3), textcoords="offset points",
                                ha="center", va="bottom", fontsize=7.5, rotation=90 if bad else 0,
                                color=FAIL_COLOR if bad else "#333333",
                                fontweight="bold" if bad else "normal", zorder=4)
            side = ({"alpha": 0.45, "hatch": "//", "edgecolor": colors[label]}
                    if kind == "ab-reference" else {})
            ax.bar(xs, medians, width=bar_w * 0.92, color=colors[label], label=label, zorder=2,
                   yerr=[lows, highs], **side,
                   error_kw={"elinewidth": 1.2, "capsize": 3, "ecolor": "#222222"})
        ax.set_xticks(range(len(concurrency_classes)))
        ax.set_xticklabels(concurrency_classes, rotation=20 if len(concurrency_classes) > 6 else 0,
                           ha="right" if len(concurrency_classes) > 6 else "center")
        ax.set_xlim(-0.6, len(concurrency_classes) - 0.4)
        ax.set_ylim(0, top * 1.22 if top > 0 else 1)
        ax.set_xlabel("prompt class")
        ax.set_ylabel("decode tok/s per request")
        ax.set_title(f"concurrency {concurrency}", fontsize=10)
        ax.grid(axis="y", alpha=0.3, zorder=0)
        ax.set_axisbelow(True)
        ax.legend(loc="best", fontsize=8.5, frameon=True, framealpha=0.9)
    what = ("label = the A/B throughput gate's paired ratio, candidate to reference side" if ab
            else f"label = the backfire gate's paired ratio to {reference}")
    _suptitle(fig, width_in, _title(report), "decode tok/s per request: bar = median, whiskers = "
              f"IQR, dots = requests; {what}", 10.5)
    return fig


# -- acceptance -------------------------------------------------------------------------------
def plot_acceptance(report: dict[str, Any], path: Path) -> Path | None:
    """Per-position acceptance rate (accepted at draft position i / drafts): one line per (mode,
    class) of the speculative modes; colour = class, line style and marker = mode."""
    lines = [m for m in report.get("measurements", [])
             if m.get("acceptance") and m["acceptance"].get("per_position_rates")]
    if not lines:
        return None
    concurrencies = sorted({m["concurrency"] for m in lines})
    modes = _modes(report, lines)
    classes = list(dict.fromkeys(m["prompt_class"] for m in lines))
    class_color = {c: MODE_COLORS[i % len(MODE_COLORS)] for i, c in enumerate(classes)}
    mode_style = {mode: (LINESTYLES[i % len(LINESTYLES)], MARKERS[i % len(MARKERS)])
                  for i, mode in enumerate(modes)}
    k_max = max(len(m["acceptance"]["per_position_rates"]) for m in lines)

    width_in = max(9.5, 6.5 + 0.5 * k_max)
    fig = new_figure(width_in, 0.6 + 3.6 * len(concurrencies))
    axes = fig.subplots(len(concurrencies), 1, squeeze=False)[:, 0]
    for ax, concurrency in zip(axes, concurrencies, strict=True):
        for m in sorted((m for m in lines if m["concurrency"] == concurrency),
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
        ax.set_title(f"concurrency {concurrency}", fontsize=9.5)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    _suptitle(fig, width_in, _title(report),
              "per-position acceptance rate (vLLM spec-decode counters)", 11)
    return save_figure(fig, path)


# -- forest: every gate's ratio -----------------------------------------------------------------
OUTCOME_COLORS = {"pass": "#2a9d3f", "fail": FAIL_COLOR, "declared backfire": "#e08a00",
                  "undecided": "#6a51a3", "not stored": "#8c8c8c", "other machine": "#8c8c8c",
                  "not run": "#8c8c8c"}
FAIL_SHADE = "#f3c9c9"


def plot_forest(report: dict[str, Any], path: Path) -> Path | None:
    """The run's main picture: one row per gate, its ratio with the interval, the fail region shaded
    up to its threshold, coloured by outcome, the figures on the right. None when no gate ran."""
    fig = forest_figure(report)
    return None if fig is None else save_figure(fig, path)


def forest_figure(report: dict[str, Any]):
    """:func:`plot_forest`'s figure, not saved (None: no gate); y tick labels: the rows' labels."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    rows = gate_comparisons(report)
    if not rows:
        return None
    xs = [v for c in rows for v in (c.ratio, c.ci_low, c.ci_high, c.threshold)
          if v is not None and v > 0]
    lo, hi = min([1.0, *xs]), max([1.0, *xs])
    lo, hi = lo / (hi / lo) ** 0.06 / 1.02, hi * (hi / lo) ** 0.06 * 1.02

    label_chars = max(len(c.label) for c in rows)
    right = [f"{c.ratio_text}  {c.n}  {c.outcome_text}" if c.ratio is not None
             else f"{c.measured if c.measured != '-' else 'no ratio'}  {c.outcome_text}"
             for c in rows]
    width_in = min(22.0, 5.5 + 0.066 * label_chars + 0.066 * max(len(t) for t in right))
    fig = new_figure(width_in, 2.2 + 0.3 * len(rows))
    ax = fig.subplots()
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first row on top
    for y, c in enumerate(rows):
        color = OUTCOME_COLORS.get(c.outcome.value, "#8c8c8c")
        if c.threshold is not None:
            on_fail = (c.threshold, hi) if c.fails_above else (lo, c.threshold)
            ax.fill_betweenx([y - 0.42, y + 0.42], *on_fail, color=FAIL_SHADE, linewidth=0,
                             zorder=0)
            ax.plot([c.threshold, c.threshold], [y - 0.42, y + 0.42], color=FAIL_COLOR,
                    linewidth=1.6, zorder=2)
        if c.ratio is None:  # written mid-axis (axes x, data y): it never runs past the axis's edge
            ax.text(0.5, y, f"no ratio: {c.tag}", transform=ax.get_yaxis_transform(), va="center",
                    ha="center", fontsize=8, color=color, style="italic", zorder=3,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0, "alpha": 0.85})
            continue
        if c.ci_low is not None and c.ci_high is not None:
            ax.plot([c.ci_low, c.ci_high], [y, y], color=color, linewidth=2.4,
                    solid_capstyle="butt", zorder=3)
            ax.plot([c.ci_low, c.ci_high], [y, y], linestyle="none", marker="|", markersize=9,
                    color=color, zorder=3)
        ax.plot([c.ratio], [y], marker="D", markersize=6.5, color=color, markeredgecolor="white",
                markeredgewidth=0.7, zorder=4)
    for y in range(1, len(rows)):  # a rule between modes (and concurrencies)
        if (rows[y].concurrency, rows[y].mode) != (rows[y - 1].concurrency, rows[y - 1].mode):
            ax.axhline(y - 0.5, color="#555555", linewidth=0.6, zorder=1)
    ax.axvline(1.0, color="#333333", linestyle="--", linewidth=0.9, zorder=1)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([c.label for c in rows], fontsize=8.5)
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="x", alpha=0.25)
    ax.set_xlabel("ratio this run / reference (log scale); TTFT: this run's TTFT / reference's, "
                  "higher is worse")
    _ratio_ticks(ax, lo, hi)
    twin = ax.twinx()
    twin.set_ylim(ax.get_ylim())
    twin.set_yticks(range(len(rows)))
    twin.set_yticklabels(right, fontsize=8.5)
    twin.tick_params(axis="y", length=0)
    for tick, c in zip(twin.get_yticklabels(), rows, strict=True):
        tick.set_color(OUTCOME_COLORS.get(c.outcome.value, "#555555"))
    present = list(dict.fromkeys(c.outcome for c in rows))
    handles = [Line2D([], [], marker="D", linestyle="-", label=o.value,
                      color=OUTCOME_COLORS.get(o.value, "#8c8c8c")) for o in present]
    handles += [Patch(facecolor=FAIL_SHADE, label="fails there (interval wholly inside)"),
                Line2D([], [], color=FAIL_COLOR, linewidth=1.6, label="threshold")]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 5),
               fontsize=8.5, frameon=False)
    _suptitle(fig, width_in, _title(report),
              "every gate: the ratio this run / what it compared against (the A/B's reference "
              "side, no speculation, or stored figures), diamond = estimate, bar = interval; on "
              "the right the ratio (interval), what it rests on and the outcome", 10.5)
    return fig


def _ratio_ticks(ax, lo: float, hi: float) -> None:
    """Plain ratio ticks (0.9, 1, 1.1 ...) on the log axis instead of powers of ten."""
    import numpy as np
    from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullLocator

    span = np.log10(hi / lo)
    step = (0.02 if span < 0.08 else 0.05 if span < 0.25 else 0.1 if span < 0.5
            else 0.25 if span < 1 else 0.5)
    ticks = [t for t in np.arange(np.floor(lo / step) * step, hi + step, step)
             if lo <= t <= hi and t > 0]
    if len(ticks) > 14:
        ticks = ticks[:: int(np.ceil(len(ticks) / 14))]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FormatStrFormatter("%.2f" if step < 0.1 else "%.1f"))
    ax.xaxis.set_minor_locator(NullLocator())
