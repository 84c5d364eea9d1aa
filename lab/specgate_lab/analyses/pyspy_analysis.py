"""Where does a slow request's engine step go? py-spy bursts set beside a duet window's requests.

Usage: ``python -m specgate_lab.analyses.pyspy_analysis RUN_FOLDER [--mode MODE] [--top N]`` (standard library
only), on a lab session run with ``HELPER=core-canary.py PYSPY=1`` (lab/scripts/gpu-lab-run.sh). Reads
report.json(.gz) (the window's requests: perf_counter start and end, and one chunk time per streamed
engine step), pyspy.jsonl (a line per 1-s burst: its perf_counter start and end, the CPU seconds each
engine-core thread used in it), pin.log (the candidate's engine core's pid) and pyspy/<n>.txt (py-spy's
raw collapsed stacks of the candidate's engine core, ``--threads --idle``, 250 samples a second per
thread).

A request below 95 % of its window's median rate is slow. A burst counts as slow when at least 90 % of
the engine steps inside it belong to slow requests, as fast when at most 10 % do, and is left out
otherwise or under MIN_STEPS steps. For slow and fast bursts it prints, per engine step (a streamed
chunk), the engine core's main thread: milliseconds sampled in all, idle (blocked in a wait or a
poll), and in each frame (inclusive, function and file without the line); and the CPU milliseconds
each thread used. A frame whose time per step grows between fast and slow is where the slow steps
go; every frame growing alike says the same work ran slower.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
from collections import Counter
from pathlib import Path

SLOW_SHARE = 0.95  # a request below this share of its window's median rate is slow
PURE = 0.9  # a burst is slow (fast) when at least this share of its steps is slow (fast)
MIN_STEPS = 20
SAMPLE_MS = 4.0  # py-spy at 250 Hz
IDLE_LEAVES = ("wait", "select", "poll", "_poll", "recv", "get", "sleep", "epoll_wait", "acquire")
LINE = re.compile(r"^thread \((\d+)\)(?:: ([^;]*))?;?(.*) (\d+)$")
FRAME = re.compile(r"^(.*) \(([^:()]*)(?::\d+)?\)$")


def load_report(run: Path) -> dict:
    path = run / "report.json"
    if path.exists():
        return json.loads(path.read_text())
    return json.loads(gzip.decompress((run / "report.json.gz").read_bytes()))


def candidate_requests(report: dict, mode: str | None) -> tuple[str, list[dict]]:
    """The speculative window's requests (the subject side of a duet), each with "slow" set."""
    windows = [m for m in report["measurements"] if m["side"] == "subject" and m["partner"] is not None
               and (mode is None or m["mode"] == mode)]
    if not windows:
        raise SystemExit(f"no duet window{' of mode ' + mode if mode else ''} in the report")
    window = windows[0]
    median = statistics.median(r["decode_tokens_per_s"] for r in window["records"])
    for record in window["records"]:
        record["slow"] = record["decode_tokens_per_s"] < SLOW_SHARE * median
    return window["mode"], window["records"]


def frame_name(frame: str) -> str:
    match = FRAME.match(frame)
    return f"{match.group(1)} ({Path(match.group(2)).name})" if match else frame


def read_burst(path: Path, main_tid: int) -> tuple[int, int, Counter]:
    """(main-thread samples, idle ones, inclusive samples per frame) of one burst's raw file."""
    total, idle, frames = 0, 0, Counter()
    for line in path.read_text().splitlines():
        match = LINE.match(line.strip())
        if not match or int(match.group(1)) != main_tid:
            continue
        count = int(match.group(4))
        stack = [frame_name(f) for f in match.group(3).split(";") if f]
        total += count
        leaf = stack[-1].split(" (")[0] if stack else ""
        if not stack or leaf in IDLE_LEAVES:
            idle += count
        for name in set(stack):
            frames[name] += count
    return total, idle, frames


def classify(burst: dict, requests: list[dict]) -> tuple[str | None, int]:
    steps = {True: 0, False: 0}
    for record in requests:
        if record["finished_at"] < burst["t0"] or record["started_at"] > burst["t1"]:
            continue
        steps[record["slow"]] += sum(burst["t0"] <= t <= burst["t1"] for t in record["chunk_times"])
    total = steps[True] + steps[False]
    if total < MIN_STEPS:
        return None, total
    share = steps[True] / total
    return ("slow" if share >= PURE else "fast" if share <= 1 - PURE else None), total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="run folder: report.json(.gz), pyspy.jsonl, pyspy/")
    parser.add_argument("--mode", help="the speculative mode's window (default: the first duet window)")
    parser.add_argument("--top", type=int, default=25, help="frames to list (default 25)")
    args = parser.parse_args()
    mode, requests = candidate_requests(load_report(args.run), args.mode)
    start, end = min(r["started_at"] for r in requests), max(r["finished_at"] for r in requests)
    bursts = [json.loads(line) for line in (args.run / "pyspy.jsonl").read_text().splitlines() if line.strip()]
    bursts = [b for b in bursts if b["t1"] >= start and b["t0"] <= end]
    groups: dict[str, dict] = {kind: {"bursts": 0, "steps": 0, "samples": 0, "idle": 0, "frames": Counter(),
                                      "cpu": Counter()} for kind in ("slow", "fast")}
    # The candidate's engine core main thread: its OS thread id is the process id, in pin.log.
    pinned = re.search(r"engine cores \d+ main -> .*?, (\d+) main ->", (args.run / "pin.log").read_text())
    if not pinned:
        raise SystemExit(f"{args.run / 'pin.log'}: no 'engine cores ... main ->' line naming the candidate's "
                         "engine core")
    main_tid = int(pinned.group(1))
    for burst in bursts:
        kind, steps = classify(burst, requests)
        path = args.run / "pyspy" / f"{burst['n']}.txt"
        if kind is None or not path.exists():
            continue
        samples, idle, frames = read_burst(path, main_tid)
        group = groups[kind]
        group["bursts"] += 1
        group["steps"] += steps
        group["samples"] += samples
        group["idle"] += idle
        group["frames"].update(frames)
        group["cpu"].update(burst["thread_cpu_s"])
    slow_n = sum(r["slow"] for r in requests)
    print(f"{args.run} {mode}: {len(requests)} requests, {slow_n} slow (< {SLOW_SHARE:.0%} of the median rate); "
          f"{len(bursts)} bursts in the window; main thread {main_tid}")
    for kind in ("fast", "slow"):
        g = groups[kind]
        if g["steps"]:
            print(f"  {kind}: {g['bursts']} bursts, {g['steps']} steps; main thread per step: sampled "
                  f"{g['samples'] * SAMPLE_MS / g['steps']:.2f} ms, idle {g['idle'] * SAMPLE_MS / g['steps']:.2f} ms, "
                  f"busy {(g['samples'] - g['idle']) * SAMPLE_MS / g['steps']:.2f} ms")
            cpu = ", ".join(f"{tid} {1000 * s / g['steps']:.2f}" for tid, s in g["cpu"].most_common(6))
            print(f"    CPU ms per step by thread: {cpu}")
    fast, slow = groups["fast"], groups["slow"]
    if not (fast["steps"] and slow["steps"]):
        print("  (no slow or no fast bursts: nothing to set side by side)")
        return
    per_step = {name: (fast["frames"][name] * SAMPLE_MS / fast["steps"],
                       slow["frames"][name] * SAMPLE_MS / slow["steps"])
                for name in fast["frames"].keys() | slow["frames"].keys()}
    print(f"\n  {'ms per step: fast':>22} {'slow':>7} {'slow-fast':>9}  frame (by slow-fast)")
    for name, (f, s) in sorted(per_step.items(), key=lambda item: (item[1][0] - item[1][1], item[0]))[:args.top]:
        print(f"  {f:22.3f} {s:7.3f} {s - f:9.3f}  {name}")
    print(f"\n  {'ms per step: fast':>22} {'slow':>7} {'slow/fast':>9}  frame (the busiest in fast bursts)")
    for name, (f, s) in sorted(per_step.items(), key=lambda item: (-item[1][0], item[0]))[:args.top]:
        print(f"  {f:22.3f} {s:7.3f} {s / f if f else float('nan'):9.2f}  {name}")


if __name__ == "__main__":
    main()
