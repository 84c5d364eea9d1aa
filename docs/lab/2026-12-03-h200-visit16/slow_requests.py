"""Visit 16's slow and fast requests of the draft window, from a session's report.json(.gz) alone
(slow as in benchmarks/pyspy_analysis.py, whose helpers it uses; from the repository root):
    PYTHONPATH=. python docs/lab/2026-12-03-h200-visit16/slow_requests.py docs/lab/2026-12-03-h200-visit16/N1/report.json.gz
A request below 95 % of the window's median rate is slow. Per group: the median rate, the engine step
(interval between streamed chunks) at its 10th/50th/90th percentile, and the medians of specgate's
per-request telemetry (the middle of each request's samples)."""

import statistics
import sys
from pathlib import Path

from benchmarks.pyspy_analysis import candidate_requests, load_report

path = Path(sys.argv[1])
report = load_report(path.parent)
mode, records = candidate_requests(report, None)
window = next(m for m in report["measurements"] if m["mode"] == mode and m["side"] == "subject")
telemetry = window["telemetry"]["requests"]
for name, group in (("slow", [r for r in records if r["slow"]]), ("fast", [r for r in records if not r["slow"]])):
    steps = sorted(b - a for r in group for a, b in zip(r["chunk_times"], r["chunk_times"][1:]))
    cells = [f"{q:.0%} {1000 * steps[int(q * len(steps))]:.2f} ms" for q in (0.1, 0.5, 0.9)]
    for key in ("gpu0.sm_clock_mhz", "gpu0.power_w", "gpu0.gpu_util_pct", "cpu_canary_us", "cpu_steal_pct"):
        values = [telemetry[k][key][1] for k in (r["request_id"].split("/", 2)[2] for r in group)
                  if k in telemetry and key in telemetry[k]]
        cells.append(f"{key} {statistics.median(values):.1f}" if values else f"{key} -")
    print(f"{mode} {name}: {len(group)} requests, median "
          f"{statistics.median(r['decode_tokens_per_s'] for r in group):.1f} tok/s; step " + "; ".join(cells))
