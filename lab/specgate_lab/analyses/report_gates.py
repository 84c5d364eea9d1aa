"""Every gate of saved report.json files, one line each: the figures the journal quotes
(docs/journal/), re-derived from the reports kept in docs/evidence/. Run from the repository root:

    python -m specgate_lab.analyses.report_gates docs/evidence/calibration/cpu-2026-12-01c/run-*-report.json.gz
    python -m specgate_lab.analyses.report_gates --gate backfire \
        docs/evidence/lab/2026-12-02-h200-visit14/K*/report.json.gz

Per gate: the report, mode, class, concurrency, gate, verdict, ratio with its interval and confidence,
and pairs (standard library only)."""

import argparse
import gzip
import json
from pathlib import Path


def gate_lines(path: Path, only: str | None = None) -> list[str]:
    raw = path.read_bytes()
    report = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    lines = []
    for g in report.get("gates") or []:
        if only and g["gate"] != only:
            continue
        d = g.get("details") or {}
        figure = (f"{d['ratio']:.3f} ({d['ci_low']:.3f}-{d['ci_high']:.3f}, {d['confidence'] * 100:.1f} %)"
                  if all(isinstance(d.get(k), (int, float)) for k in ("ratio", "ci_low", "ci_high", "confidence"))
                  else "-")
        within = f" within +-{d['equal_within'] * 100:.1f} %" if d.get("equal_within") else ""
        lines.append(f"{path}: {g['mode']} {g['prompt_class']} c{g['concurrency']} {g['gate']}: "
                     f"{d.get('verdict') or g.get('verdict')}{within} {figure} n={d.get('n', '-')}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", type=Path, nargs="+")
    parser.add_argument("--gate", help="only this gate (backfire, throughput, acceptance, ...)")
    args = parser.parse_args()
    for path in args.reports:
        print("\n".join(gate_lines(path, args.gate)))


if __name__ == "__main__":
    main()
