"""Rendering a run: the terminal tables, the Markdown summary. Input is the run's JSON report
(``SpecgateSession.report_data``), so a saved report renders exactly like a live run."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from tabulate import tabulate


def _median_tps(measurement: dict[str, Any]) -> float | None:
    values = [r["decode_tokens_per_s"] for r in measurement["records"] if r.get("decode_tokens_per_s")]
    return statistics.median(values) if values else None


def _verdicts(report: dict[str, Any]) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
    by_key: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for gate in report["gates"]:
        by_key[(gate["mode"], gate["prompt_class"], gate["concurrency"])].append(gate)
    return by_key


def _verdict_text(gates: list[dict[str, Any]]) -> str:
    if not gates:
        return "-"
    failed = [g["gate"] for g in gates if not g["passed"] and not g.get("declared")]
    declared = [g["gate"] for g in gates if not g["passed"] and g.get("declared")]
    if failed:
        return "FAIL " + ",".join(failed)
    if declared:
        return "declared backfire"
    return "pass"


def speed_table(report: dict[str, Any], fmt: str = "simple") -> str:
    """Per prompt class: no-speculation tok/s, each mode's tok/s and change, and the verdict."""
    reference = report["rig"]["reference_mode"]
    measurements = report["measurements"]
    modes = [m for m in report["rig"]["modes"] if any(x["mode"] == m for x in measurements)]
    levels = sorted({m["concurrency"] for m in measurements})
    verdicts = _verdicts(report)
    tables = []
    for level in levels:
        by = {(m["mode"], m["prompt_class"]): m for m in measurements if m["concurrency"] == level}
        classes = list(dict.fromkeys(m["prompt_class"] for m in measurements if m["concurrency"] == level))
        rows = []
        for prompt_class in classes:
            ref = by.get((reference, prompt_class))
            ref_tps = _median_tps(ref) if ref else None
            row: list[Any] = [prompt_class, f"{ref_tps:.1f}" if ref_tps else "-"]
            verdict_parts = []
            for mode in modes:
                if mode == reference:
                    continue
                m = by.get((mode, prompt_class))
                tps = _median_tps(m) if m else None
                if tps and ref_tps:
                    row.append(f"{tps:.1f} ({(tps / ref_tps - 1) * 100:+.0f} %)")
                else:
                    row.append(f"{tps:.1f}" if tps else "-")
                verdict_parts.append(_verdict_text(verdicts.get((mode, prompt_class, level), [])))
            ref_verdict = _verdict_text(verdicts.get((reference, prompt_class, level), []))
            row.append("; ".join([f"{reference}: {ref_verdict}", *(
                f"{mode}: {v}" for mode, v in zip([m for m in modes if m != reference], verdict_parts))]))
            rows.append(row)
        headers = ["class", f"{reference} tok/s", *(f"{m} tok/s (change)" for m in modes if m != reference),
                   "verdict"]
        title = f"decode tok/s, median per request, concurrency {level}"
        tables.append(title + "\n" + tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True))
    return "\n\n".join(tables)


def acceptance_table(report: dict[str, Any], fmt: str = "simple") -> str:
    rows = []
    for m in report["measurements"]:
        acc = m.get("acceptance")
        if not acc:
            continue
        positions = " ".join(f"{r * 100:.0f}" for r in acc.get("per_position_rates", []))
        rows.append([m["mode"], m["prompt_class"], m["concurrency"], f"{acc['mean_acceptance_length']:.2f}",
                     f"{acc['acceptance_rate'] * 100:.1f} %", positions])
    if not rows:
        return ""
    return "acceptance (from vLLM's spec-decode counters, this run's windows)\n" + tabulate(
        rows, headers=["mode", "class", "conc.", "mean acc. length", "acc. rate", "per-position rate %"],
        tablefmt=fmt, disable_numparse=True)


def failed_gate_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for gate in report["gates"]:
        if not gate["passed"]:
            tag = "DECLARED" if gate.get("declared") else "FAILED"
            lines.append(f"{tag} {gate['gate']} [{gate['mode']}-{gate['prompt_class']}-c{gate['concurrency']}]: "
                         f"{gate['message'].splitlines()[0]}")
    for failure in report.get("failures", []):
        lines.append(f"NOT MEASURED [{failure['mode']}-{failure['prompt_class']}-c{failure['concurrency']}]: "
                     f"{failure['error'].splitlines()[0]}")
    return lines


def render_text(report: dict[str, Any]) -> str:
    if not report["measurements"]:
        return "specgate: nothing was measured" + (
            "\n" + "\n".join(failed_gate_lines(report)) if report.get("failures") else "")
    parts = [f"specgate: rig {report['rig']['name']} ({report['rig']['tier']} tier, model {report['rig']['model']})"
             + ("" if report.get("complete", True) else "  [PARTIAL: the run did not finish]"),
             speed_table(report)]
    acceptance = acceptance_table(report)
    if acceptance:
        parts.append(acceptance)
    lines = failed_gate_lines(report)
    if lines:
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def render_markdown(report: dict[str, Any]) -> str:
    parts = [f"## specgate: rig `{report['rig']['name']}`" +
             ("" if report.get("complete", True) else " (partial run)"), speed_table(report, "github")]
    acceptance = acceptance_table(report, "github")
    if acceptance:
        parts.append(acceptance)
    lines = failed_gate_lines(report)
    parts.append("\n".join(f"- {line}" for line in lines) if lines else "All gates passed.")
    return "\n\n".join(parts) + "\n"
