"""The teeth's A/A with the same environment on both sides (docs/journal/calibration/
cpu-2026-12-05-teeth-symmetry.md): each run's throughput ratio and interval, their mean, and the
shift of the mean log ratio from the A/A runs of the 2026-12-04c campaign (candidate alone with
SPECGATE_SLOWDOWN=0), with a Welch t interval on it.

    python -m specgate_lab.analyses.teeth_symmetry \\
        docs/evidence/calibration/cpu-2026-12-05-teeth-symmetry/runs.json \\
        --before docs/evidence/calibration/cpu-2026-12-04c/teeth.log

``extract RUN_DIR... --out runs.json`` keeps, from each run's report.json, what that needs (the
throughput gate's entry, the start order, and what the slowdown plugin printed in each side's server log).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

from scipy.stats import t as student_t

from specgate_lab.analyses.teeth_campaign import runs as campaign_runs

MODE, CLASS = "no_spec", "coding"
RATIO = re.compile(r"^(\d+\.\d+)x")
MARK = "[specgate_lab.inject]"
PID = re.compile(r" pid \d+:")


def throughput_gate(report: dict) -> dict:
    for entry in [*report.get("gates", []), *report.get("undecided", [])]:
        if (entry.get("gate"), entry.get("mode"), entry.get("prompt_class")) == ("throughput", MODE, CLASS):
            return entry
    raise ValueError("no throughput gate for no_spec on coding in the report")


def injector_lines(report: dict, run_dir: Path) -> dict[str, list[str]]:
    """Per side, what the slowdown plugin printed in that side's server log (pids dropped, each line once)."""
    found: dict[str, list[str]] = {}
    for server in (report.get("servers") or {}).values():
        log = Path(server.get("log") or "")
        log = log if log.is_file() else run_dir / log.name
        lines = found.setdefault(server.get("side") or "?", [])
        if log.is_file():
            for line in log.read_text(errors="replace").splitlines():
                if MARK in line:
                    line = PID.sub("", line[line.index(MARK):]).strip()
                    if line not in lines:
                        lines.append(line)
    return found


def extract(run_dirs: list[Path]) -> list[dict]:
    kept = []
    for run_dir in run_dirs:
        report = json.loads((run_dir / "report.json").read_text())
        gate = throughput_gate(report)
        details = {k: v for k, v in (gate.get("details") or {}).items() if not isinstance(v, list)}
        window = next((m for m in report.get("measurements", [])
                       if (m.get("mode"), m.get("prompt_class")) == (MODE, CLASS)), {})
        telemetry = (window.get("telemetry") or {}).get("window") or {}
        kept.append({"run": run_dir.name, "written_at": report.get("written_at"),
                     # the machine during the window (min, median, max of its samples) and vLLM's own decode rates
                     "window": {"load_1min": telemetry.get("load_1min"), "cpu_busy_pct": telemetry.get("cpu_busy_pct"),
                                "vllm_decode_tok_s": {"candidate": window.get("server_decode_tokens_per_s"),
                                                      "reference": (window.get("partner") or {}).get(
                                                          "server_decode_tokens_per_s")}},
                     "start_order": report.get("start_order"), "injector": injector_lines(report, run_dir),
                     "gate": {**{k: gate.get(k) for k in ("gate", "mode", "prompt_class", "outcome", "message")},
                              "details": details}})
    return kept


def _welch(after: list[float], before: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Difference of means (after - before) with a Welch t interval."""
    va, vb = statistics.variance(after) / len(after), statistics.variance(before) / len(before)
    df = (va + vb) ** 2 / (va ** 2 / (len(after) - 1) + vb ** 2 / (len(before) - 1))
    diff = statistics.fmean(after) - statistics.fmean(before)
    half = float(student_t.ppf(0.5 + confidence / 2, df)) * math.sqrt(va + vb)
    return diff, diff - half, diff + half


def _machine(window: dict | None) -> str:
    if not window or not window.get("load_1min"):
        return ""
    rates = window.get("vllm_decode_tok_s") or {}
    own = (f", vLLM's own decode rate {rates['candidate'] / rates['reference']:.3f}x"
           if rates.get("candidate") and rates.get("reference") else "")
    return f"; load (1 min) median {window['load_1min'][1]:g} (max {window['load_1min'][2]:g}){own}"


def summary(kept: list[dict], before_log: Path | None = None) -> str:
    lines, ratios = [], []
    for i, run in enumerate(kept, 1):
        d = run["gate"]["details"]
        first = (run.get("start_order") or {}).get("first", {}).get(MODE, "?")
        hooked = sorted(side for side, lines in run.get("injector", {}).items() if any("slowed by" in x for x in lines))
        quiet = sorted(side for side, lines in run.get("injector", {}).items() if any("no hook" in x for x in lines))
        plugin = f"plugin: no hook on {'/'.join(quiet) or 'no side'}, hooked on {'/'.join(hooked) or 'no side'}"
        what = "slowdown" if run.get("run") == "slowdown" else "A/A"  # .ci/teeth.py's run folders: aa, slowdown
        if what == "A/A":
            ratios.append(d["ratio"])
        lines.append(f"run {i}: {what} {run['gate']['outcome']} {d['ratio']:.3f}x "
                     f"({d['ci_low']:.3f}-{d['ci_high']:.3f}, "
                     f"{d['n']} pairs), {first} started first; {plugin}" + _machine(run.get("window")))
    logs = [math.log(r) for r in ratios]
    aa = [r for r in kept if r.get("run") != "slowdown"]
    lines.append(f"A/A: mean ratio {statistics.fmean(ratios):.3f}x (geometric {math.exp(statistics.fmean(logs)):.3f}x) "
                 f"over {len(ratios)} runs; red (FAIL) {sum(r['gate']['outcome'] == 'fail' for r in aa)} of {len(aa)}")
    if before_log is not None:
        before = [float(RATIO.match(text).group(1)) for _, text in campaign_runs(before_log.read_text())["A/A"]]
        before_logs = [math.log(r) for r in before]
        lines.append(f"before (candidate alone with SPECGATE_SLOWDOWN=0): mean ratio {statistics.fmean(before):.3f}x "
                     f"(geometric {math.exp(statistics.fmean(before_logs)):.3f}x) over {len(before)} runs, "
                     f"log-ratio SD {statistics.stdev(before_logs):.4f}")
        if len(logs) > 1:
            diff, low, high = _welch(logs, before_logs)
            lines.append(f"shift of the mean log ratio, after - before: {diff:+.4f} (95 % Welch t interval "
                         f"{low:+.4f} to {high:+.4f}), i.e. x{math.exp(diff):.3f} "
                         f"({math.exp(low):.3f}-{math.exp(high):.3f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["extract"]:
        parser = argparse.ArgumentParser(prog="teeth_symmetry extract")
        parser.add_argument("run_dirs", nargs="+", type=Path)
        parser.add_argument("--out", type=Path, required=True)
        args = parser.parse_args(argv[1:])
        args.out.write_text(json.dumps(extract(args.run_dirs), indent=1, sort_keys=True) + "\n")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="runs.json (from extract)")
    parser.add_argument("--before", type=Path, help="the 2026-12-04c campaign's teeth.log")
    args = parser.parse_args(argv)
    print(summary(json.loads(args.runs.read_text()), args.before))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
