"""The teeth campaign's counts from its kept log: each fresh-clone run's A/A and slowdown verdicts
(the lines `.ci/teeth.py` prints), the A/A runs that went red (FAIL) and the slowdowns that stayed green
(no FAIL), with exact one-sided 95 % Clopper-Pearson bounds.

    python -m specgate_lab.analyses.teeth_campaign docs/evidence/calibration/cpu-2026-12-04c/teeth.log
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from scipy.stats import beta

LINE = re.compile(r"^== teeth: (A/A|\d+ ?% slowdown): exit (\d+), \d+ s, throughput (\w+): (.*)$")


def upper_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """Exact one-sided upper bound on a rate seen k times in n."""
    return 1.0 if k == n else float(beta.ppf(confidence, k + 1, n - k))


def lower_bound(k: int, n: int, confidence: float = 0.95) -> float:
    return 0.0 if k == 0 else float(beta.ppf(1 - confidence, k, n - k + 1))


def runs(text: str) -> dict[str, list[tuple[str, str]]]:
    """Per arm, each run's (outcome, "ratio (interval ...)") in the order they ran."""
    found: dict[str, list[tuple[str, str]]] = {"A/A": []}
    for line in text.splitlines():
        if m := LINE.match(line.strip()):
            found.setdefault(m.group(1), []).append((m.group(3), m.group(4)))
    return found


def summary(text: str) -> str:
    found = runs(text)
    arm = next((name for name in found if name != "A/A"), "10 % slowdown")  # one slowdown per campaign
    aa, slow = found["A/A"], found.get(arm, [])
    red = sum(outcome == "fail" for outcome, _ in aa)
    green = sum(outcome != "fail" for outcome, _ in slow)
    lines = [f"run {i + 1}: A/A {a[0]} {a[1]}; slowdown {s[0]} {s[1]}" for i, (a, s) in enumerate(zip(aa, slow))]
    lines.append(f"A/A red (FAIL): {red} of {len(aa)} (one-sided 95 % upper bound {upper_bound(red, len(aa)):.1%})")
    lines.append(f"{arm} green (no FAIL): {green} of {len(slow)} (caught at least "
                 f"{1 - upper_bound(green, len(slow)):.1%}, one-sided 95 %)")
    lines.append(f"A/A undecided (green, no FAIL): {sum(o == 'undecided' for o, _ in aa)} of {len(aa)}")
    red_runs = sum(a[0] == "fail" or s[0] != "fail" for a, s in zip(aa, slow))
    lines.append(f"teeth red (the A/A FAILED or the slowdown did not): {red_runs} of {min(len(aa), len(slow))} "
                 f"(one-sided 95 % upper bound {upper_bound(red_runs, min(len(aa), len(slow))):.1%})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    print(summary(parser.parse_args(argv).log.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
