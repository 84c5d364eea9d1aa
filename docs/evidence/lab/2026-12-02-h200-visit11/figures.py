"""Visit 11's figures, recomputed from the sessions' report.json files (run from the repository root):
    PYTHONPATH=. python docs/lab/2026-12-02-h200-visit11/figures.py docs/lab/2026-12-02-h200-visit11/G*/report.json.gz
Per paired window: the backfire gate's own statistic where it ran (prompts as strata, its report.json details),
Hodges-Lehmann with its Wilcoxon interval on the same pairs, both sides' median tok/s and range, the
acceptance length, and the window's median GPU utilisation."""

import gzip
import json
import statistics
import sys
from pathlib import Path

from specgate.paired import paired_ratio

for path in map(Path, sys.argv[1:]):
    report = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())
    session = path.parent.name
    gates = {(g["mode"], g["gate"]): g["details"] for g in report["gates"]}
    undecided = {(g["mode"], g["gate"]) for g in report.get("undecided", [])}
    for m in report["measurements"]:
        if m["side"] != "subject" or m["partner"] is None:
            continue
        own = {r["request_id"].split("/", 2)[2]: r["decode_tokens_per_s"] for r in m["records"]}
        ref = {r["request_id"].split("/", 2)[2]: r["decode_tokens_per_s"] for r in m["partner"]["records"]}
        keys = sorted(own.keys() & ref.keys())
        hl = paired_ratio([own[k] for k in keys], [ref[k] for k in keys], threshold=1.0)
        # A window whose backfire gate was undecided, or that has none (an A/A mode such as aa), shows
        # Hodges-Lehmann alone.
        d = gates.get((m["mode"], "backfire"))
        strata = (f"strata {d['ratio']:.3f} ({d['ci_low']:.3f}-{d['ci_high']:.3f}) {d['verdict']}" if d
                  else "strata undecided" if (m["mode"], "backfire") in undecided else "strata -")
        util = m["telemetry"]["window"].get("gpu0.gpu_util_pct", [None, None])[1]
        print(f"{session} {m['mode']}: {strata}; HL {hl.ratio:.3f} ({hl.ci_low:.3f}-{hl.ci_high:.3f}); median tok/s "
              f"{statistics.median(own.values()):.1f} / {m['partner']['mode']} {statistics.median(ref.values()):.1f}; "
              f"min {min(own.values()):.1f} max {max(own.values()):.1f}; ref min {min(ref.values()):.1f} "
              f"max {max(ref.values()):.1f}; AL {(m['acceptance'] or {}).get('mean_acceptance_length')}; "
              f"gpu util median {util}; pairs {len(keys)}; follow-up {m['follow_up']}")
