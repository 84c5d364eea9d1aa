"""Is a request's rate its engine core's CPU speed? The figures of a core-canary run
(lab/scripts/core-canary.py beside an A/A `specgate_lab calibrate`), from its run folder.

Usage: ``python -m specgate_lab.analyses.canary_analysis RUN_FOLDER [--phase-by window|request]``
(standard library only), e.g. ``docs/lab/2026-12-01-h200-visit6/canary135`` from history (docs/journal/README.md). Reads
measurements.jsonl.gz (the calibration windows), pin.log (the perf_counter times at which the
servers were pinned and at which the candidate's engine core main thread moved onto the
reference's CPU) and canary-4/6/12.jsonl.gz ([bin start perf_counter s, iterations, p25 ns] per
10 ms bin). CPU 4 runs the reference engine core's main thread throughout and the candidate's too
once shared; CPU 6 the candidate's until shared, then nothing; CPU 12 nothing (control). The
canaries on 4 and 6 run at SCHED_IDLE: only when the engine core there does not want the CPU.

Prints, per window, the per-pair log-ratio spread, separate (candidate on CPU 6) or shared (both
on CPU 4); how often an idle CPU's canary runs slow, and for how long (CPU 12, and CPU 6 once it
is idle); and, per phase, how a request's rate goes with the
canary on its own engine core's CPU around it (Pearson of the logs; slowest against fastest third).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import math
import re
import statistics
from pathlib import Path

SEPARATE, SHARED = "separate", "shared"
REFERENCE_CPU, CANDIDATE_CPU, CONTROL_CPU = 4, 6, 12
UNCONTENDED = 300  # iterations per 10 ms bin: the canary had the CPU nearly all the bin
MIN_PIECES = 50
SLOW_NS = 35_000  # a piece of the canary's work takes ~24.5 us on a CPU running at full speed
MARGIN_S = 0.5  # canary bins this far either side of a request count as its own


def sides(window: dict) -> list[tuple[str, dict]]:
    """(side, window) for both sides of a calibration window."""
    return [("candidate", window), ("reference", window["partner"])]


def pair_key(record: dict) -> str:
    return record["request_id"].split("/", 2)[-1]


def pin_times(path: Path) -> dict[str, float]:
    """{"pinned": t, "shared": t}: perf_counter seconds of those pin.log lines."""
    times = {}
    for line in path.read_text().splitlines():
        match = re.match(r"\S+ (pinned|shared): .*perf_counter ([0-9.]+)\s*$", line)
        if match:
            times[match.group(1)] = float(match.group(2))
    return times


class Canary:
    """One canary's bins: (bin start s, iterations, p25 ns), by time."""

    def __init__(self, path: Path) -> None:
        with gzip.open(path, "rt") as handle:
            self.bins = sorted(tuple(json.loads(line)) for line in handle if line.strip())
        self.starts = [b[0] for b in self.bins]

    def between(self, start: float, end: float) -> list[tuple[float, int, int]]:
        """The bins that start within [start, end]."""
        return self.bins[bisect.bisect_left(self.starts, start):bisect.bisect_right(self.starts, end)]


def us(ns: float) -> str:
    return f"{ns / 1000:.1f}"


def window_table(windows: list[dict], shared: float) -> None:
    print("window  phase     per-pair log-ratio SD  pair ratio range  candidate tok/s  reference tok/s")
    spreads: dict[str, list[float]] = {SEPARATE: [], SHARED: []}
    for index, window in enumerate(windows):
        by_key = {side: {pair_key(r): r for r in w["records"]} for side, w in sides(window)}
        ratios = [by_key["candidate"][k]["decode_tokens_per_s"] / by_key["reference"][k]["decode_tokens_per_s"]
                  for k in by_key["candidate"] if k in by_key["reference"]]
        # the candidate is the side that moves: a window is shared once its candidate requests all are
        phase = SEPARATE if min(r["started_at"] for r in window["records"]) < shared else SHARED
        sd = statistics.pstdev(math.log(x) for x in ratios)
        spreads[phase].append(sd)
        rates = {side: [r["decode_tokens_per_s"] for r in w["records"]] for side, w in sides(window)}
        print(f"{index:6}  {phase:8}  {sd:21.3f}  {min(ratios):.2f}-{max(ratios):.2f}        "
              f"{min(rates['candidate']):5.0f}-{max(rates['candidate']):<5.0f}      "
              f"{min(rates['reference']):5.0f}-{max(rates['reference']):<5.0f}")
    for phase, values in spreads.items():
        if values:
            print(f"median per-pair SD, {phase}: {statistics.median(values):.3f} ({len(values)} windows)")


def hundred_ms_medians(bins: list[tuple[float, int, int]]) -> dict[int, float]:
    """Median p25 (ns) of the bins in each 100 ms slot, by slot."""
    slots: dict[int, list[int]] = {}
    for start, _, p25 in bins:
        slots.setdefault(math.floor(start * 10), []).append(p25)
    return {slot: statistics.median(values) for slot, values in slots.items()}


def slow_runs(slots: dict[int, float]) -> list[int]:
    """Lengths (in 100 ms slots) of the runs of consecutive slow slots."""
    runs, current = [], 0
    for slot in sorted(slots):
        if slots[slot] > SLOW_NS and slot - 1 in slots and current:
            current += 1
        elif slots[slot] > SLOW_NS:
            if current:
                runs.append(current)
            current = 1
        elif current:
            runs.append(current)
            current = 0
    return runs + ([current] if current else [])


def idle_cpus(canaries: dict[int, Canary], pins: dict[str, float]) -> None:
    """An idle CPU's canary, every bin (no filter on how many pieces fit in a bin: a slow CPU fits
    fewer, so such a filter would drop exactly the slow bins)."""
    print(f"\nidle CPUs: canary p25 (us) per 10 ms bin; slow = p25 above {us(SLOW_NS)} us")
    print("canary                     bins  median   p90   slow bins  slow runs of 100 ms slots (longest)")
    end = max(c.starts[-1] for c in canaries.values())
    chosen = {CONTROL_CPU: ("CPU 12, after shared", pins["shared"]),
              CANDIDATE_CPU: ("CPU 6, after shared", pins["shared"])}
    slots = {}
    for cpu, (label, start) in chosen.items():
        bins = canaries[cpu].between(start, end)
        p25s = [b[2] for b in bins]
        if len(p25s) < 2:
            print(f"{label:24} {len(p25s):6}  -")
            continue
        slots[cpu] = hundred_ms_medians(bins)
        runs = slow_runs(slots[cpu])
        slow = sum(p > SLOW_NS for p in p25s) / len(p25s)
        print(f"{label:24} {len(p25s):6}  {us(statistics.median(p25s)):>6} {us(statistics.quantiles(p25s, n=10)[8]):>5}"
              f"   {slow * 100:5.1f} %    {len(runs)} runs, longest {sorted(runs)[-3:]}")
    if len(slots) == 2:
        both = sorted(slots[CONTROL_CPU].keys() & slots[CANDIDATE_CPU].keys())
        slow = {cpu: {s for s in both if slots[cpu][s] > SLOW_NS} for cpu in slots}
        expected = len(slow[CONTROL_CPU]) * len(slow[CANDIDATE_CPU]) / len(both)
        r = statistics.correlation([math.log(slots[CANDIDATE_CPU][s]) for s in both],
                                   [math.log(slots[CONTROL_CPU][s]) for s in both])
        print(f"100 ms slots, shared phase: slow on CPU 6 {len(slow[CANDIDATE_CPU])}, on CPU 12 "
              f"{len(slow[CONTROL_CPU])}, on both {len(slow[CANDIDATE_CPU] & slow[CONTROL_CPU])} of {len(both)} "
              f"({expected:.0f} if independent); Pearson of the logs {r:+.2f}")


def request_rows(windows: list[dict], canaries: dict[int, Canary], shared: float, minimum: int,
                 phase_by: str) -> tuple[dict[str, list[tuple[float, float]]], int]:
    """Per phase, (rate, median own-CPU canary p25 ns) per request; and how many had no such bins."""
    rows: dict[str, list[tuple[float, float]]] = {SEPARATE: [], SHARED: []}
    missing = 0
    for window in windows:
        window_phase = SEPARATE if min(r["started_at"] for r in window["records"]) < shared else SHARED
        for side, w in sides(window):
            for record in w["records"]:
                moved = side == "candidate" and record["started_at"] < shared
                cpu = CANDIDATE_CPU if moved else REFERENCE_CPU
                own_phase = SEPARATE if record["started_at"] < shared else SHARED
                phase = window_phase if phase_by == "window" else own_phase
                around = canaries[cpu].between(record["started_at"] - MARGIN_S, record["finished_at"] + MARGIN_S)
                p25s = [b[2] for b in around if b[1] >= minimum]
                if not p25s:
                    missing += 1
                    continue
                rows[phase].append((record["decode_tokens_per_s"], statistics.median(p25s)))
    return rows, missing


def own_cpu(windows: list[dict], canaries: dict[int, Canary], shared: float, phase_by: str) -> None:
    print(f"\nengine core's own CPU: median canary p25 over its bins within {MARGIN_S} s of each request "
          f"(CPU {REFERENCE_CPU}: reference, candidate once shared; CPU {CANDIDATE_CPU}: candidate before)")
    print("min iter  phase     requests  Pearson log rate/log p25  slowest third tok/s, p25 us  "
          "fastest third tok/s, p25 us")
    # Bins the engine core left the canary at least 50 pieces of (0.5 of its 10 ms or more); a higher
    # floor keeps only bins in which the CPU was fast (a slow CPU fits fewer pieces), so it is printed
    # to show that bias, not as a reading.
    for minimum in (MIN_PIECES, UNCONTENDED):
        rows, missing = request_rows(windows, canaries, shared, minimum, phase_by)
        for phase, part in rows.items():
            if len(part) < 3:
                print(f"{minimum:8}  {phase:8}  {len(part):8}  -")
                continue
            part.sort()
            third = len(part) // 3
            r = statistics.correlation([math.log(x) for x, _ in part], [math.log(p) for _, p in part])
            slow, fast = part[:third], part[-third:]
            print(f"{minimum:8}  {phase:8}  {len(part):8}  {r:+24.2f}  "
                  f"{statistics.median(x for x, _ in slow):19.0f}, {us(statistics.median(p for _, p in slow)):>5}  "
                  f"{statistics.median(x for x, _ in fast):19.0f}, {us(statistics.median(p for _, p in fast)):>5}")
        if missing:
            print(f"{'':8}  ({missing} requests without own-CPU bins of >= {minimum} iterations)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="run folder: measurements.jsonl.gz, pin.log, canary-*.jsonl.gz")
    parser.add_argument("--phase-by", choices=("window", "request"), default="request",
                        help="own-CPU table: a request's phase by its own start (default) or by its window's")
    args = parser.parse_args()
    with gzip.open(args.run / "measurements.jsonl.gz", "rt") as handle:
        windows = [json.loads(line) for line in handle]
    pins = pin_times(args.run / "pin.log")
    canaries = {cpu: Canary(args.run / f"canary-{cpu}.jsonl.gz")
                for cpu in (REFERENCE_CPU, CANDIDATE_CPU, CONTROL_CPU)}
    print(f"{args.run}: {len(windows)} windows; pinned at {pins['pinned']:.3f}, shared at {pins['shared']:.3f} "
          "(perf_counter s)\n")
    window_table(windows, pins["shared"])
    idle_cpus(canaries, pins)
    own_cpu(windows, canaries, pins["shared"], args.phase_by)


if __name__ == "__main__":
    main()
