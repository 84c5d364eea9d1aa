"""The calibration headline, re-derived from raw windows: per machine kind and injected level, how
many windows the shipped A/B rule failed, with the exact one-sided 95 % binomial (Clopper-Pearson)
bound of those counts: an upper bound on false alarms for the A/A, a lower bound on detection for
an injected slowdown. No pooled normal model (the A/A deciding upper ends fail normality).

    python -m specgate_lab.analyses.calibration_bounds CAMPAIGN_DIR... [--tolerance 0.03]

Each CAMPAIGN_DIR holds a `specgate_lab calibrate` run's windows.jsonl and summary.json (its machine).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from scipy.stats import beta

from specgate_lab.calibrate import load_windows


def one_sided_bound(k: int, n: int, *, upper: bool, confidence: float = 0.95) -> float:
    """Clopper-Pearson one-sided bound of a binomial proportion k / n."""
    if upper:
        return 1.0 if k >= n else float(beta.ppf(confidence, k + 1, n - k))
    return 0.0 if k <= 0 else float(beta.ppf(1 - confidence, k, n - k + 1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", type=Path, nargs="+")
    parser.add_argument("--tolerance", type=float, default=0.03, help="the A/B gate's tolerance (shipped: 0.03)")
    args = parser.parse_args(argv)
    counts: dict[tuple[str, float], list[int]] = defaultdict(lambda: [0, 0])
    for folder in args.dirs:
        machine = json.loads((folder / "summary.json").read_text())["meta"]["machine"]
        for w in load_windows(folder / "windows.jsonl"):
            if w.design == "duet":
                cell = counts[(machine, w.level)]
                cell[0] += w.fails(args.tolerance)
                cell[1] += 1
    print(f"| machine | injected | windows | failed @ {args.tolerance * 100:g} % | exact one-sided 95 % bound |")
    print("|---|---|---|---|---|")
    for (machine, level), (k, n) in sorted(counts.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if level == 0:
            bound = f"false alarms <= {one_sided_bound(k, n, upper=True) * 100:.1f} %"
        else:
            bound = f"detection >= {one_sided_bound(k, n, upper=False) * 100:.1f} %"
        print(f"| {machine} | {level * 100:g} % | {n} | {k} | {bound} |")


if __name__ == "__main__":
    main()
