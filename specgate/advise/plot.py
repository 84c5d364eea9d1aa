"""The advice's picture: per class and concurrency, the predicted tok/s ratio against no
speculation for every k, one colour per mode, one marker per step-cost model, interval bars, the
served k's measured ratio as a star, the break-even line at 1.0 (an Agg canvas, no pyplot)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specgate.report.plots import DPI, save_figure

MEASURED_EDGE = "#111111"
BREAK_EVEN_COLOR = "#c00000"

Interval = tuple[float | None, float, float]  # (estimate or None for a range only, low, high)


@dataclass(frozen=True)
class RatioSeries:
    """One mode under one step-cost model: its predicted ratio at each k."""

    mode: str
    model: str
    color: str
    ks: tuple[int, ...]
    ratios: tuple[Interval, ...]
    anchor: tuple[int, float]  # the measured (k, ratio) the line runs on to


@dataclass(frozen=True)
class RatioPanel:
    title: str
    series: tuple[RatioSeries, ...]
    measured: tuple[tuple[int, Interval, str], ...]  # (served k, measured ratio, colour)


def draw_ratio_panels(panels: list[RatioPanel], *, styles: dict[str, tuple[str, str]], title: str,
                      subtitle: str, path: Path) -> Path | None:
    """The panels as a PNG at ``path`` (``styles``: model -> (marker, line)); None without one."""
    if not panels:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    cols = len(panels) if len(panels) <= 3 else 2 if len(panels) == 4 else 3
    rows = -(-len(panels) // cols)
    fig = Figure(figsize=(4.6 * cols + 0.4, 3.4 * rows + 1.4), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    modes_drawn: dict[str, str] = {}
    models_drawn: dict[str, None] = {}
    for ax, panel in zip(axes, panels, strict=False):
        n = len(panel.series)
        for i, s in enumerate(panel.series):
            marker, line = styles[s.model]
            # side by side, so the bars of one k do not hide each other
            offset = (i - (n - 1) / 2) * 0.08
            xs = [k + offset for k in s.ks]
            points = [v if v is not None else (lo + hi) / 2 for v, lo, hi in s.ratios]
            ax.vlines(xs, [lo for _, lo, _ in s.ratios], [hi for _, _, hi in s.ratios],
                      color=s.color, linewidth=1.6, alpha=0.8)
            # a range only: its middle, drawn hollow
            hollow = any(v is None for v, _, _ in s.ratios)
            ax.plot(xs, points, marker=marker, linestyle="none", color=s.color, markersize=5,
                    markerfacecolor="white" if hollow else s.color)
            ax.plot([*xs, s.anchor[0]], [*points, s.anchor[1]], linestyle=line, color=s.color,
                    linewidth=1.1)
            modes_drawn[s.mode] = s.color
            models_drawn[s.model] = None
        for k, (value, lo, hi), color in panel.measured:
            ax.errorbar([k], [value], yerr=[[value - lo], [hi - value]], marker="*", markersize=13,
                        color=color, markeredgecolor=MEASURED_EDGE, ecolor=MEASURED_EDGE, capsize=4,
                        linestyle="none", zorder=5)
        ax.axhline(1.0, color=BREAK_EVEN_COLOR, linestyle=":", linewidth=1.2)
        k_max = max([k for s in panel.series for k in s.ks] + [k for k, _, _ in panel.measured])
        ax.set_xticks(range(1, k_max + 1))
        ax.set_xlim(0.5, k_max + 0.5)
        ax.set_xlabel("k (num_speculative_tokens)")
        ax.set_ylabel("tok/s ratio vs no speculation")
        ax.set_title(panel.title, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    handles = [Line2D([], [], color=color, linewidth=2, label=mode)
               for mode, color in modes_drawn.items()]
    handles += [Line2D([], [], color="#555555", marker=styles[m][0], linestyle=styles[m][1],
                       label=m) for m in models_drawn]
    handles += [Line2D([], [], color=MEASURED_EDGE, marker="*", markersize=11, linestyle="none",
                       label="measured (the served k)"),
                Line2D([], [], color=BREAK_EVEN_COLOR, linestyle=":",
                       label="1.0: no speculation (break-even)")]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4),
               fontsize=8.5, frameon=False)
    fig.suptitle(f"{title}\n{subtitle}", fontsize=10.5)
    return save_figure(fig, path)
