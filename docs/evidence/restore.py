"""Restore the evidence kept in this folder from git history (run from the repository root).

The raw data of the campaigns up to 2026-12-03 left main's tree in commits e43f83e and c9e2d61; a
full clone still holds it there. This script writes the compact copy kept here, at the same relative
path (``docs/calibration/X`` -> ``docs/evidence/calibration/X``):

- report.json(.gz): every key but ``fingerprints``; each measurement (and its partner) keeps its
  fields but its telemetry (only the window's GPU utilisation) and, per request record,
  only ``request_id`` and ``decode_tokens_per_s``: what ``specgate_lab.analyses.report_gates`` and
  ``lab/2026-12-02-h200-visit11/figures.py`` read;
- a calibration run's ``windows.jsonl`` as it was, and its ``summary.json`` with its meta only
  (``calibrate --render`` computes the tables' rows again);
- the small scripts and text files the journal cites.

Server logs, plots, per-request telemetry (measurements.jsonl.gz), canaries and py-spy dumps stay in
history only: ``git archive e43f83e^ docs/lab/<visit> | tar -x -C /tmp/history``.

    python docs/evidence/restore.py
"""

import gzip
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
HERE = Path(__file__).resolve().parent
COMMITS = ("e43f83e", "c9e2d61")  # each deleted these paths; their parents hold them
KEPT_FILES = {"figures.py", "figures.txt", "telemetry.txt", "peak-rate.json", "client-benchmark-lab.json.gz",
              "pyspy-split.txt", "slow-requests.txt",
              "pyspy-analysis.txt", "run-y-summary.md"}
RECORD_KEYS = ("request_id", "decode_tokens_per_s")


def trim_window(window: dict) -> dict:
    out = {k: v for k, v in window.items() if k not in ("records", "partner", "telemetry")}
    out["records"] = [{k: r.get(k) for k in RECORD_KEYS} for r in window.get("records") or []]
    if "telemetry" in window:
        util = ((window.get("telemetry") or {}).get("window") or {}).get("gpu0.gpu_util_pct")
        out["telemetry"] = {"window": {"gpu0.gpu_util_pct": util} if util is not None else {}}
    if "partner" in window:
        out["partner"] = trim_window(window["partner"]) if isinstance(window["partner"], dict) else window["partner"]
    return out


def trim_report(report: dict) -> dict:
    out = {k: v for k, v in report.items() if k not in ("fingerprints", "measurements")}
    out["measurements"] = [trim_window(m) for m in report.get("measurements") or []]
    return out


def deleted(commit: str) -> list[str]:
    names = subprocess.run(["git", "show", "--diff-filter=D", "--name-only", "--format=", commit],
                           cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    return [n for n in names if n.startswith(("docs/calibration/", "docs/lab/", "docs/eagle3-runs/"))]


def kept_as(name: str) -> str | None:
    """Where a deleted path is kept here (relative to this folder), or None."""
    path = Path(name)
    rel = path.relative_to("docs")
    if "combined" in path.parts:  # a render of the runs beside it
        return None
    if path.name.endswith("report.json.gz") or path.name in KEPT_FILES or path.name == "windows.jsonl":
        return str(rel)
    if path.name == "summary.json" and (path.parent.name.startswith("calibration")
                                        or path.parent.name == "cpu-2026-11-30"):
        return str(rel)
    return None


def write(commit: str, name: str, target: Path) -> None:
    raw = subprocess.run(["git", "show", f"{commit}^:{name}"], cwd=ROOT, check=True, capture_output=True).stdout
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.name.endswith("report.json.gz"):
        report = trim_report(json.loads(gzip.decompress(raw)))
        raw = gzip.compress(json.dumps(report, separators=(",", ":")).encode(), 9, mtime=0)
    elif target.name == "summary.json":
        raw = (json.dumps({"meta": json.loads(raw)["meta"]}, indent=1) + "\n").encode()
    target.write_bytes(raw)


def main() -> None:
    for commit in COMMITS:
        for name in deleted(commit):
            rel = kept_as(name)
            if rel is not None:
                write(commit, name, HERE / rel)


if __name__ == "__main__":
    main()
