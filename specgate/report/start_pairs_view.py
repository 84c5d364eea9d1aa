"""The start-pairs command (``python -m specgate start-pairs --rig NAME --pairs K -- ARGS``): run
the K sessions, the first side alternating, and print and write their combined verdicts
(specgate.decide.start_pairs decides them; the words are specgate.report.verdicts')."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specgate.config.rig import Rig
from specgate.decide.start_pairs import ORDERS, combine_reports, session_command
from specgate.report.verdicts import statement, terminal_line
from specgate.store.saved_report import load_report


def run_start_pairs(rig: Rig, pairs: int, *, runs_dir: Path,
                    pytest_args: Sequence[str] = ()) -> int:
    """Run ``pairs`` A/B sessions of ``rig``, the first side alternating, then combine their
    throughput gates (combined.json beside the sessions' folders); the exit code."""
    reports = []
    for k in range(pairs):
        first = ORDERS[k % 2]
        run_dir = runs_dir / f"pair-{k + 1:02d}"
        print(f"specgate start-pairs: start pair {k + 1}/{pairs} of rig {rig.name}, the {first} "
              f"side first (run folder {run_dir})", flush=True)
        code = subprocess.run(session_command(rig, first, run_dir, pytest_args)).returncode
        if code not in (0, 1):
            print(f"specgate start-pairs: start pair {k + 1} ended with exit code {code}: "
                  "nothing combined", file=sys.stderr)
            return code
        reports.append((first, load_report(run_dir / "report.json")))
    return write_combined(rig, combine_reports(rig, reports), runs_dir)


def write_combined(rig: Rig, combined: list[dict[str, Any]], runs_dir: Path) -> int:
    """Print the combined verdicts (a line each), write them with their whole statement to
    ``runs_dir``/combined.json; the exit code."""
    if not combined:
        print("specgate start-pairs: the sessions' reports hold no A/B throughput gate measured "
              "in every start pair (is the run an A/B? --specgate-ab-* or the rig's "
              "[ab])", file=sys.stderr)
        return 5
    gates = [{**gate, "message": statement(gate)} for gate in combined]
    runs_dir.mkdir(parents=True, exist_ok=True)
    (runs_dir / "combined.json").write_text(json.dumps(
        {"rig": rig.name, "start_pairs": max(g["start_pairs"] for g in gates), "gates": gates},
        indent=1) + "\n")
    for gate in gates:
        print(terminal_line(gate, prefix=f"{gate['outcome'].upper():9} "))
    print(f"combined verdicts: {runs_dir / 'combined.json'}")
    return 1 if any(g["outcome"] == "fail" for g in gates) else 0
