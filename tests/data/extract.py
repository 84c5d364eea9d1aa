"""Re-extract the fast tier's small copies of real reports from git history.

The raw reports are in main's history before commit e43f83e, which moved them out of the tree; the
tests read trimmed copies kept here at the same relative path (``docs/lab/X`` -> ``tests/data/lab/X``),
fuller than docs/evidence's:
every request record keeps its timings, token counts and derived rates, but not its generated text
or the receive time of each chunk (only the first and the last, which the decode rate is made of).

    python tests/data/extract.py            # from e43f83e^, into tests/data/
"""

import gzip
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
HERE = Path(__file__).resolve().parent

REPORTS = [
    "calibration/cpu-2026-12-01/ci-run1-report.json.gz",
    "calibration/cpu-2026-12-01/ci-run2-report.json.gz",
    "calibration/cpu-2026-12-01b/run-a-report.json.gz",
    "calibration/cpu-2026-12-01b/run-b-report.json.gz",
    "calibration/cpu-2026-12-01b/run-c-report.json.gz",
    "calibration/cpu-2026-12-01c/run-f-report.json.gz",
    "calibration/cpu-2026-12-01c/run-g-report.json.gz",
    "calibration/cpu-2026-12-01c/run-h-report.json.gz",
    "calibration/cpu-2026-12-01c/run-i-report.json.gz",
    "calibration/cpu-2026-12-01d/run-k-report.json.gz",
    "calibration/cpu-2026-12-02d/run-u-report.json.gz",
    "lab/2026-12-01-h200-draft4l/s1b/report.json.gz",
    "lab/2026-12-01-h200-draft4l/s2/report.json.gz",
    "lab/2026-12-01-h200-draft4l/s3/report.json.gz",
    "lab/2026-12-01-h200-visit9/E1/report.json.gz",
    "lab/2026-12-01-h200-visit9/E2/report.json.gz",
    "lab/2026-12-02-h200-visit13/J1/report.json.gz",
    "lab/2026-12-02-h200-visit13/J2/report.json.gz",
    "lab/2026-12-02-h200-visit13/J3/report.json.gz",
    "lab/2026-12-02-h200-visit14/K1/report.json.gz",
    "lab/2026-12-02-h200-visit14/K2/report.json.gz",
    "lab/2026-12-02-h200-visit14/K3/report.json.gz",
]
COPIED = ["calibration/cpu-2026-12-02/calibration/windows.jsonl"]


def _trim_record(record: dict) -> None:
    record["text"] = ""
    times = record.get("chunk_times") or []
    record["chunk_times"] = times[:1] + times[-1:] if len(times) > 1 else times
    record.pop("inter_chunk_latencies_s", None)


def _trim_window(window: dict) -> None:
    for record in window.get("records") or []:
        _trim_record(record)
    if isinstance(window.get("partner"), dict):
        _trim_window(window["partner"])


def trim(report: dict) -> dict:
    for window in report.get("measurements") or []:
        _trim_window(window)
    return report


def from_history(name: str, commit: str = "e43f83e") -> bytes:
    """``docs/<name>`` as it was just before ``commit`` deleted it."""
    return subprocess.run(["git", "show", f"{commit}^:docs/{name}"], cwd=ROOT, check=True,
                          capture_output=True).stdout


def main() -> None:
    for name in REPORTS:
        report = trim(json.loads(gzip.decompress(from_history(name))))
        out = HERE / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(gzip.compress(json.dumps(report).encode(), 9, mtime=0))
    for name in COPIED:
        (HERE / name).parent.mkdir(parents=True, exist_ok=True)
        (HERE / name).write_bytes(from_history(name))


if __name__ == "__main__":
    main()
