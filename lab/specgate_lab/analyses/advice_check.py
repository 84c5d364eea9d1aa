"""The config advice checked against measured configs (issue 54), from one kept run of a rig that serves
one drafter at several k, each in a duet with no speculation (rig cpu-smollm2-advice: ngram at k = 1..5).

    python -m specgate_lab.analyses.advice_check docs/evidence/calibration/cpu-2026-12-04-advice/report.json.gz

The advice is made as a user would get it from a run at the served k alone: the report cut to the k = 5
mode and no speculation, through specgate.advise.advice.advise_report. Each smaller k's own window of the same
session then gives the measured ratio (its backfire gate), and the table says whether it lies inside the
predicted interval under each bound of the step cost (k-independent; linear from no cost at k = 0), and
the prediction from the step costs fitted over every k measured (c0 + s k)."""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any

from specgate.advise.advice import CONSTANT, FITTED, LINEAR, Span, WindowAdvice, advise_report

SERVED = "ngram"  # the mode served at the largest k; the others are SERVED_k<k> (--served: another)


def _load(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _cut(report: dict[str, Any], modes: set[str]) -> dict[str, Any]:
    """The report as a run of ``modes`` alone would have written it (its windows and gates)."""
    rig = dict(report["rig"])
    rig["modes"] = {k: v for k, v in rig.get("modes", {}).items() if k in modes}
    keep = [m for m in report["measurements"] if m["mode"] in modes]
    gates = [g for g in report.get("gates", []) if g["mode"] in modes]
    undecided = [g for g in report.get("undecided", []) if g["mode"] in modes]
    return {**report, "rig": rig, "measurements": keep, "gates": gates, "undecided": undecided}


def _measured(report: dict[str, Any], mode: str, prompt_class: str) -> Span | None:
    for g in [*report.get("gates", []), *report.get("undecided", [])]:
        d = g.get("details") or {}
        if (g["gate"], g["mode"], g["prompt_class"]) == ("backfire", mode, prompt_class) and d.get("ci_low"):
            return Span(d["ratio"], d["ci_low"], d["ci_high"])
    return None


def _inside(value: float, span: Span) -> str:
    if span.low <= value <= span.high:
        return "inside"
    off = value / span.high - 1 if value > span.high else value / span.low - 1
    return f"outside ({off * 100:+.1f} %)"


def rows(report: dict[str, Any], served: str = SERVED) -> list[dict[str, Any]]:
    """One row per class and smaller k: predicted (two bounds, and fitted over every k) and measured."""
    served_modes = {served, report["rig"]["reference_mode"]}
    from_served: dict[str, WindowAdvice] = {w.prompt_class: w for w in advise_report(_cut(report, served_modes)).windows
                                            if w.mode == served}
    fitted = {w.prompt_class: w for w in advise_report(report).windows if w.mode == served}
    out = []
    for prompt_class, advice in sorted(from_served.items()):
        for row in advice.rows:
            if row.measured:
                continue
            measured = _measured(report, f"{served}_k{row.k}", prompt_class)
            if measured is None:
                continue
            const, linear = row.predictions[CONSTANT].ratio, row.predictions[LINEAR].ratio
            fit_row = next((r for r in fitted[prompt_class].rows if r.k == row.k), None) if prompt_class in fitted \
                else None
            fit = fit_row.predictions[FITTED].ratio if fit_row and FITTED in fit_row.predictions else None
            out.append({"class": prompt_class, "k": row.k, "al": row.acceptance_length, "const": const,
                        "linear": linear, "fitted": fit, "measured": measured,
                        "in_const": _inside(measured.value, const), "in_linear": _inside(measured.value, linear),
                        "in_fitted": _inside(measured.value, fit) if fit else "-"})
    return out


def table(report: dict[str, Any], served: str = SERVED) -> str:
    lines = ["| class | k | AL(k) predicted | ratio, cost k-independent | ratio, cost linear | ratio, cost fitted "
             "(every k) | measured ratio (95 % CI) | measured in: k-independent / linear / fitted |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows(report, served):
        fit = r["fitted"].text(3) if r["fitted"] else "-"
        lines.append(f"| {r['class']} | {r['k']} | {r['al'].text(2)} | {r['const'].text(3)} | {r['linear'].text(3)} | "
                     f"{fit} | {r['measured'].text(3)} | {r['in_const']} / {r['in_linear']} / {r['in_fitted']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--served", default=SERVED, help="the mode served at the largest k (default %(default)s)")
    args = parser.parse_args(argv)
    print(table(_load(args.report), args.served))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
