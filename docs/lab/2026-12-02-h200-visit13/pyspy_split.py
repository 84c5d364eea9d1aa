"""Visit 13: the draft engine core's py-spy samples, split by the speed of the draft requests they fell in.

    python3 docs/lab/2026-12-02-h200-visit13/pyspy_split.py docs/lab/2026-12-02-h200-visit13/J{1,2,3}

Each RUN_DIR holds report.json.gz and pyspy.tgz (pyspy.jsonl, pyspy/N.txt, canary-CPU.jsonl), or the
same files unpacked, as scripts/gpu-lab-run.sh left them.

For every 1-s py-spy burst (scripts/core-canary.py with PYSPY=1) the draft requests it overlaps give its
rate (tokens decoded inside the burst / decoding time inside it). Bursts with >= 0.2 s of decoding are
called fast (>= 500 tok/s) or slow (<= 450 tok/s). Per group it prints: the main thread's CPU seconds per
second of decoding, the share of its samples in each leaf function (the deepest frame), the
SCHED_IDLE canary on the engine's CPU and the normal one on an idle CPU during those bursts.
"""
from __future__ import annotations

import collections
import json
import gzip
import re
import statistics
import sys
import tarfile
from pathlib import Path

FRAME = re.compile(r"^(?P<func>[^ ]+) \((?P<file>[^:]+):(?P<line>\d+)\)$")


def read(run: Path, name: str) -> str:
    """A file of the run: unpacked, or inside pyspy.tgz; report.json also as report.json.gz."""
    if (run / name).exists():
        return (run / name).read_text()
    if name == "report.json":
        return gzip.decompress((run / "report.json.gz").read_bytes()).decode()
    with tarfile.open(run / "pyspy.tgz") as tar:
        try:
            return tar.extractfile(name).read().decode()
        except KeyError:
            return ""


def requests(run: Path, mode_prefix: str = "draft") -> list[dict]:
    report = json.loads(read(run, "report.json"))
    return [r for m in report["measurements"] if m["mode"].startswith(mode_prefix) for r in m["records"]]


def burst_rate(burst: dict, recs: list[dict]) -> tuple[float, float]:
    """(decoding seconds inside the burst, tokens per second there) from the chunk times."""
    t0, t1 = burst["t0"], burst["t1"]
    tokens, active = 0, 0.0
    for rec in recs:
        chunks = rec["chunk_times"]
        lo, hi = max(t0, chunks[0]), min(t1, chunks[-1])
        if hi <= lo:
            continue
        active += hi - lo
        # tokens per chunk: the request's tokens spread evenly over its chunks
        per_chunk = (rec["completion_tokens"] - 1) / max(1, len(chunks) - 1)
        tokens += per_chunk * sum(1 for c in chunks[1:] if lo < c <= hi)
    return active, (tokens / active if active else 0.0)


def leaf_counts(text: str, main_tid: str) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack.startswith(f"thread ({main_tid})"):
            continue
        frames = stack.split(";")
        m = FRAME.match(frames[-1].strip())
        leaf = f"{m['func']} ({Path(m['file']).name})" if m else frames[-1]
        counts[leaf] += int(n)
    return counts


def canary(run: Path, cpu: int, t0: float, t1: float) -> list[float]:
    out = []
    for line in read(run, f"canary-{cpu}.jsonl").splitlines():
        start, n, p25 = json.loads(line)
        if t0 <= start < t1:
            out.append(p25 / 1000.0)  # microseconds
    return out


def main() -> None:
    for run in map(Path, sys.argv[1:]):
        recs = requests(run)
        bursts = [json.loads(line) for line in read(run, "pyspy.jsonl").splitlines()]
        main_tid = min(bursts[0]["thread_cpu_s"], key=int)  # the engine core's pid: its main thread
        groups: dict[str, dict] = {g: {"n": 0, "active": 0.0, "cpu": 0.0, "leaf": collections.Counter(),
                                       "canary_own": [], "canary_idle": [], "rates": []} for g in ("fast", "slow")}
        for burst in bursts:
            active, rate = burst_rate(burst, recs)
            if active < 0.2:
                continue
            group = "fast" if rate >= 500 else "slow" if rate <= 450 else None
            if group is None:
                continue
            g = groups[group]
            g["n"] += 1
            g["active"] += active
            g["rates"].append(rate)
            g["cpu"] += burst["thread_cpu_s"].get(main_tid, 0.0)
            g["leaf"] += leaf_counts(read(run, f"pyspy/{burst['n']}.txt"), main_tid)
            g["canary_own"] += canary(run, 6, burst["t0"], burst["t1"])
            g["canary_idle"] += canary(run, 12, burst["t0"], burst["t1"])
        print(f"== {run.name}: {len(bursts)} bursts; main thread {main_tid}")
        for name, g in groups.items():
            if not g["n"]:
                print(f"  {name}: no bursts")
                continue
            total = sum(g["leaf"].values())
            own = statistics.median(g["canary_own"]) if g["canary_own"] else float("nan")
            idle = statistics.median(g["canary_idle"]) if g["canary_idle"] else float("nan")
            print(f"  {name}: {g['n']} bursts, decoding {g['active']:.1f} s at median {statistics.median(g['rates']):.0f} tok/s; "
                  f"main thread {g['cpu'] / g['active']:.2f} CPU-s per s decoding; {total} samples "
                  f"({total / g['active']:.0f} per s decoding); canary p25 on the engine's CPU {own:.1f} us "
                  f"({len(g['canary_own'])} bins), on idle CPU 12 {idle:.1f} us")
            for leaf, n in g["leaf"].most_common(12):
                print(f"     {100 * n / total:5.1f} %  {n / g['active']:6.1f}/s  {leaf}")


if __name__ == "__main__":
    main()


def per_request(run: Path, cpu: int = 6, margin_s: float = 0.5) -> None:
    """Each draft request's rate beside the canary on the engine's CPU around it (the SCHED_IDLE canary
    runs only while the engine there is idle: the no-spec partner's request before and after)."""
    from scipy.stats import spearmanr

    bins = [json.loads(line) for line in read(run, f"canary-{cpu}.jsonl").splitlines()]
    control = [json.loads(line) for line in read(run, "canary-12.jsonl").splitlines()]
    rows = []
    for rec in requests(run):
        t0, t1 = rec["started_at"] - margin_s, rec["finished_at"] + margin_s
        own = [p25 / 1000 for start, _, p25 in bins if t0 <= start < t1]
        idle = [p25 / 1000 for start, _, p25 in control if t0 <= start < t1]
        if own and idle:
            rate = (rec["completion_tokens"] - 1) / (rec["last_token_at"] - rec["first_token_at"])
            rows.append((rate, statistics.median(own), statistics.median(idle)))
    rho_own = spearmanr([r[0] for r in rows], [r[1] for r in rows])
    rho_idle = spearmanr([r[0] for r in rows], [r[2] for r in rows])
    fast = [r for r in rows if r[0] >= 500]
    slow = [r for r in rows if r[0] <= 450]

    def med(rs: list, i: int) -> str:
        return f"{statistics.median(r[i] for r in rs):.1f}" if rs else "-"

    print(f"== {run.name}: {len(rows)} draft requests with canary bins within {margin_s} s")
    print(f"  Spearman(rate, canary on the engine's CPU {cpu}) = {rho_own.statistic:+.2f} (p {rho_own.pvalue:.1g}); "
          f"(rate, canary on idle CPU 12) = {rho_idle.statistic:+.2f} (p {rho_idle.pvalue:.1g})")
    print(f"  fast (>= 500 tok/s): {len(fast)} requests, canary median {med(fast, 1)} us on CPU {cpu}, {med(fast, 2)} us on CPU 12")
    print(f"  slow (<= 450 tok/s): {len(slow)} requests, canary median {med(slow, 1)} us on CPU {cpu}, {med(slow, 2)} us on CPU 12")


if __name__ == "__main__" and len(sys.argv) > 1:
    for arg in sys.argv[1:]:
        per_request(Path(arg))
