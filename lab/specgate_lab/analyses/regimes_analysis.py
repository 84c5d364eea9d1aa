"""What the per-request regimes of an A/A calibration look like: the figures of
docs/journal/lab/2026-12-01-h200-visit5.md, from the calibration's measurements.jsonl.gz.

Usage: ``python -m specgate_lab.analyses.regimes_analysis measurements.jsonl.gz [--pinned-from N]``
(standard library only). Prints, per window, the per-pair log-ratio spread (before / after window N
when the servers were pinned part-way, lab/scripts/pin-servers-after.py); how much a request's rate
predicts the next one on the same server and on the other server; and the engine core's CPU share,
involuntary context switches, GPU utilisation and power in the slowest, middle and fastest third
of the requests (from the per-request telemetry, specgate/measure/telemetry.py).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import statistics
from pathlib import Path


def sides(window: dict) -> list[tuple[str, dict]]:
    """(server label suffix, window) for both sides of a calibration window."""
    return [("candidate", window), ("reference", window["partner"])]


def process_signal(telemetry: dict, side: str, process: str, signal: str) -> float | None:
    for key, value in telemetry.items():
        if key.startswith("proc.") and f"@{side}." in key and f".{process}" in key and key.endswith(f".{signal}"):
            return value
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("measurements", type=Path)
    parser.add_argument("--pinned-from", type=int, default=None, help="first window measured pinned")
    args = parser.parse_args()
    with gzip.open(args.measurements, "rt") as handle:
        windows = [json.loads(line) for line in handle]

    print("window  pinned  per-pair log-ratio SD  pair ratio range  rates (candidate, reference)")
    sequence, rows = [], []
    for index, window in enumerate(windows):
        by_key = {side: {r["request_id"].split("/", 2)[-1]: r for r in w["records"]} for side, w in sides(window)}
        ratios = [by_key["candidate"][k]["decode_tokens_per_s"] / by_key["reference"][k]["decode_tokens_per_s"]
                  for k in by_key["candidate"] if k in by_key["reference"]]
        pinned = args.pinned_from is not None and index >= args.pinned_from
        rates = {side: [round(r["decode_tokens_per_s"]) for r in w["records"]] for side, w in sides(window)}
        print(f"{index:6}  {'yes' if pinned else 'no':6}  {statistics.pstdev(math.log(x) for x in ratios):21.3f}  "
              f"{min(ratios):.2f}-{max(ratios):.2f}        {rates['candidate']} / {rates['reference']}")
        for side, w in sides(window):
            telemetry = w.get("telemetry", {}).get("requests", {})
            for record in w["records"]:
                t = telemetry.get(record["request_id"].split("/", 2)[-1], {})
                span = record["finished_at"] - record["started_at"]
                sequence.append((record["started_at"], side, math.log(record["decode_tokens_per_s"]), index))
                cpu = process_signal(t, side, "EngineCore", "cpu_s")
                rows.append((record["decode_tokens_per_s"],
                             # the counter spans the request and up to one sampling interval each side
                             None if cpu is None else cpu / (span + 0.1),
                             process_signal(t, side, "EngineCore", "invol_ctx"),
                             (t.get("gpu0.gpu_util_pct") or [None, None])[1],
                             (t.get("gpu0.power_w") or [None, None])[1]))

    sequence.sort()
    print("\nnext request's log rate against this one's (Pearson), within a window:")
    for label, same in (("same server", True), ("other server", False)):
        pairs = [(a[2], b[2]) for a, b in itertools.pairwise(sequence)
                 if a[3] == b[3] and (a[1] == b[1]) == same]
        print(f"  {label:12} {statistics.correlation(*zip(*pairs, strict=True)):+.2f}  ({len(pairs)} pairs)")

    rows.sort(key=lambda r: r[0])
    third = len(rows) // 3

    def median(part: list[tuple], i: int) -> str:
        values = [r[i] for r in part if r[i] is not None]
        return f"{statistics.median(values):.2f}" if values else "-"

    print("\nthird of the requests  tok/s  engine core CPU share  invol. switches  GPU util %  power W")
    for label, part in (("slowest", rows[:third]), ("middle", rows[third:2 * third]), ("fastest", rows[2 * third:])):
        print(f"{label:22} {median(part, 0):>6} {median(part, 1):>21} {median(part, 2):>16} "
              f"{median(part, 3):>11} {median(part, 4):>8}")


if __name__ == "__main__":
    main()
