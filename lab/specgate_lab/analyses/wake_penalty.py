"""Is the first request after a sleep-mode wake slower, and by how much does that move an alternation
window's ratio? The figures behind docs/alternation.md's "no warm-up after a wake", re-derived from
lab reports that were kept only on an unpublished branch and are lost (docs/journal/README.md), so
the commands below, as they ran, no longer find their input:

    E=.evidence/docs/lab
    python -m specgate_lab.analyses.wake_penalty $E/2026-12-03-h200-same-lease/V5/A1/report.json \
        $E/2026-12-03-h200-reuse/V4/A*/report.json.gz $E/2026-12-03-h200-alternation/A1/report.json.gz
    python -m specgate_lab.analyses.wake_penalty \
        $E/2026-12-03-h200-calibration/C2/seg*-alternate/measurements.jsonl.gz \
        $E/2026-12-03-h200-alternation/C1/measurements.jsonl.gz

Per alternation window (report.json or a calibration's measurements.jsonl, gzipped or not): its
turns in the order they ran, each with the first request's decode rate against the median of the
rest of its turn; a turn that follows a wake is marked (every turn after the first, and the first
when the report has a swap before the window: ``alternation.before_window``, in newer reports). Then
the window's ratio (geometric mean of the subject's rates over the partner's) with every request,
and without the first request of each turn after a wake: the shift a warm-up request after each
wake would remove. Standard library only."""

import argparse
import gzip
import json
import math
import statistics
from collections.abc import Iterator
from pathlib import Path


def alternation_windows(path: Path) -> Iterator[dict]:
    """The subject side of every alternation window in a report or a measurements.jsonl."""
    raw = path.read_bytes()
    text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode()
    items = ([json.loads(line) for line in text.splitlines() if line.strip()] if ".jsonl" in path.name
             else json.loads(text).get("measurements") or [])
    for m in items:
        # "design" and "side": the keys of reports before 2026-12-05
        alternation = m.get("arrangement", m.get("design")) == "alternation"
        if alternation and m.get("role", m.get("side")) == "subject" and m.get("partner"):
            yield m


def turns(window: dict) -> list[tuple[str, list[float]]]:
    """(side, decode rates in the order sent) per turn; side is "subject" or "partner"."""
    sent = sorted([("subject", r) for r in window["records"]] + [("partner", r) for r in window["partner"]["records"]],
                  key=lambda item: item[1]["started_at"])
    out: list[tuple[str, list[float]]] = []
    for side, record in sent:
        rate = record.get("decode_tokens_per_s")
        if rate is None:
            continue
        if not out or out[-1][0] != side:
            out.append((side, []))
        out[-1][1].append(rate)
    return out


def woken_before(window: dict) -> bool:
    """Whether the window's first turn follows a wake (a swap before the window)."""
    return bool((window.get("alternation") or {}).get("before_window"))


def window_ratio(window_turns: list[tuple[str, list[float]]], *, skip_first_after_wake: bool,
                 first_woken: bool = False) -> float:
    """exp(mean log subject rate - mean log partner rate); every turn after the first follows a wake,
    the first one too when ``first_woken``."""
    logs: dict[str, list[float]] = {"subject": [], "partner": []}
    for i, (side, rates) in enumerate(window_turns):
        kept = rates[1:] if skip_first_after_wake and (i > 0 or first_woken) else rates
        logs[side].extend(math.log(r) for r in kept)
    return math.exp(statistics.mean(logs["subject"]) - statistics.mean(logs["partner"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", type=Path, nargs="+")
    args = parser.parse_args()
    first_over_rest: dict[str, list[float]] = {}
    shifts = []
    for path in args.reports:
        for window in alternation_windows(path):
            names = {"subject": window["mode"], "partner": window["partner"]["mode"]}
            window_turns = turns(window)
            print(f"{path}: {window['mode']} / {window['partner']['mode']}, {window['prompt_class']}, "
                  f"round {window.get('round', '-')}")
            first_woken = woken_before(window)
            for i, (side, rates) in enumerate(window_turns):
                rest = statistics.median(rates[1:]) if len(rates) > 1 else None
                woken = i > 0 or first_woken
                after = "after a wake" if woken else "window's first turn"
                versus = f"{rates[0] / rest - 1:+.2%} against the rest's median {rest:.1f}" if rest else "alone"
                print(f"  {names[side]:>22} {len(rates):2d} requests, {after:>19}: "
                      f"first {rates[0]:.1f} tok/s, {versus}")
                if woken and rest:
                    first_over_rest.setdefault(names[side], []).append(rates[0] / rest)
            if len(window_turns) > 1:
                every = window_ratio(window_turns, skip_first_after_wake=False)
                skipped = window_ratio(window_turns, skip_first_after_wake=True, first_woken=first_woken)
                shifts.append(every / skipped - 1)
                print(f"  ratio {every:.4f} with every request, {skipped:.4f} without the first after each wake "
                      f"({every / skipped - 1:+.2%})")
    print("first request after a wake against the rest of its turn, per server:")
    for name, values in sorted(first_over_rest.items()):
        print(f"  {name}: {len(values)} turn(s), median {statistics.median(values) - 1:+.2%} "
              f"(from {min(values) - 1:+.2%} to {max(values) - 1:+.2%})")
    if shifts:
        print(f"what those requests do to a window's ratio: {len(shifts)} window(s), "
              f"median {statistics.median(shifts):+.2%} (from {min(shifts):+.2%} to {max(shifts):+.2%})")


if __name__ == "__main__":
    main()
