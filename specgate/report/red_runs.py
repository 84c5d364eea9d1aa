"""A session's chance of a red run with nothing changed (specgate.decide.red_runs) in words, as
``plan`` and the summary print it."""

from __future__ import annotations

import math
import textwrap
from typing import Any

WIDTH = 160  # as the summary's other lines (specgate.report.verdicts.LINE_WIDTH)


def _pct(x: float) -> str:
    if x == 0 or x < 1e-4:
        return "0 %" if x == 0 else "< 0.01 %"
    return f"{x * 100:.2g} %" if x < 0.1 else f"{x * 100:.0f} %"


def how_text(how: str | dict[str, Any]) -> str:
    """How a gate's chance of a red A/A was had (decide.red_runs.GateRisk.how), in words."""
    if not isinstance(how, dict):
        return str(how)
    kind = how["kind"]
    if kind == "history":
        if not how["spread"]:
            return f"{how['starts']} {how['what']}, no spread between them"
        return (f"{how['starts']} {how['what']} at a spread of {how['spread'] * 100:.2f} %: "
                f"prediction interval ±{math.expm1(how['half']) * 100:.2f} % "
                f"(t, {how['dof']} df = {how['q']:.2f})")
    if kind == "start noise":
        return f"{how['starts']} stored start(s): start noise {how['noise'] * 100:g} %"
    if kind == "stored ratio":
        return f"stored ratio {how['ratio']:.3f} to no speculation"
    text = (f"start-pair spread {how['spread'] * 100:g} % folded in "
            f"(±{math.expm1(how['fold']) * 100:.1f} %)"
            if how["spread"] else "no start-pair spread stated")
    text += ("; window noise from the stored window's repeats" if how["noise"] else
             "; window noise not known (not counted)")
    return text + (f"; two looks ({how['looks'][0]} + {how['looks'][1]} pairs), simulated"
                   if how.get("looks") else "")


def red_run_lines(data: dict[str, Any] | None) -> list[str]:
    """One line for the bound (a FAIL or an undecided gate that gates, every gate counted), and one
    for the gates that carry most of it; [] when none was computed."""
    if not data:
        return []
    if not data.get("gates_counted"):
        return ["RED A/A: no gate of this run can turn it red"]
    lines = [f"RED A/A: at most {_pct(data['bound'])} of runs go red with nothing changed "
             f"({data['gates_counted']} gate(s) at {data['confidence'] * 100:.4g} %: a FAIL at "
             f"most {_pct(data['fail_bound'])}, the rest undecided or not stored)"]
    if data["bound"] > data.get("limit", 1.0):
        lines[0] += f"; above {_pct(data['limit'])}: gating = auto holds it there"
    if data.get("not_modelled"):
        lines.append("  their undecided chance not modelled, their interval's FAIL level counted: "
                     + ", ".join(f"{what} x{n}" for what, n in data["not_modelled"].items()))
    shown = [g for g in data.get("largest", [])[:3] if g["red"] > (1 - data["confidence"]) / 2]
    largest = [f"{g['gate']} {g['mode']}/{g['prompt_class']} c{g['concurrency']} {_pct(g['red'])} "
               f"({how_text(g['how'])})" for g in shown]
    if largest and data["bound"] > 0.005:
        lines.append("  most of it: " + "; ".join(largest))
    return [part for line in lines for part in textwrap.wrap(line, WIDTH, subsequent_indent="    ")]
