"""A start-history campaign's figures from its kept raw data: the stored starts' levels and their
spread, each replayed plain run's verdict, and the exact binomial bounds of the counts.

    python -m specgate_lab.analyses.history_campaign docs/evidence/lab/2026-12-04-h200-history

The folder holds ``store-start-NN.report.json.gz`` (the stored sessions), ``replay-NN.report.json.gz``
(the plain runs against them) and ``campaign.log`` (the steps' command lines: which replay ran with
the injector)."""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
from pathlib import Path

from scipy.stats import beta

from specgate.decide.history import StartHistory
from specgate.plan.histories import describe_history


def _report(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _level(report: dict) -> float:
    (window,) = [m for m in report["measurements"] if m["mode"] == "no_spec"]
    return statistics.median(r["decode_tokens_per_s"] for r in window["records"]
                             if r.get("decode_tokens_per_s") is not None)


def _throughput(report: dict) -> dict:
    (gate,) = [g for g in report["gates"] if g["gate"] == "throughput"]
    return gate


def _injected(log: str, runs: str = r"replay-\d+") -> dict[str, str]:
    """run name (matching ``runs``) -> the injector's setting on its command line ('' for none)."""
    out = {}
    for line in log.splitlines():
        m = re.search(rf"started \S+: (.*--specgate-run-dir=\S*/({runs}))\b", line)
        if m:
            inj = re.search(r"SPECGATE_GPU_SLOWDOWN=(\S+)", m.group(1))
            out[m.group(2)] = inj.group(1) if inj else ""
    return out


def upper_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """Exact (Clopper-Pearson) one-sided upper bound of a rate seen k times in n."""
    return 1.0 if k == n else float(beta.ppf(confidence, k + 1, n - k))


def lower_bound(k: int, n: int, confidence: float = 0.95) -> float:
    return 0.0 if k == 0 else float(beta.ppf(1 - confidence, k, n - k + 1))


def verdicts(folder: Path, runs: str = "replay") -> list[str]:
    """The plain runs ``<runs>-NN`` (or ``<runs>N``) kept in ``folder``: one table row each (injector,
    level, ratio to the stored starts, interval, outcome), then the counts with their exact bounds."""
    lines = [f"| {runs} | injector | level tok/s | ratio to stored | 95 % CI | outcome |", "|---|---|---|---|---|---|"]
    injected = _injected((folder / "campaign.log").read_text(), rf"{runs}-?\d+")
    counts = {True: [0, 0], False: [0, 0]}  # injected -> [failed, sessions]
    for p in sorted(folder.glob(f"{runs}*.report.json.gz")):
        name = p.name.split(".")[0]
        report = _report(p)
        gate = _throughput(report)
        d = gate["details"]
        if name not in injected:
            raise ValueError(f"{folder / 'campaign.log'}: no command line ran {name}: injected or not is unknown")
        inj = injected[name]
        counts[bool(inj)][0] += gate["outcome"] == "fail"
        counts[bool(inj)][1] += 1
        lines.append(f"| {name} | {inj or 'none'} | {_level(report):.2f} | {d['ratio']:.4f} | "
                     f"{d['ci_low']:.4f}-{d['ci_high']:.4f} | {gate['outcome']} |")
    (caught, n_inj), (false, n_aa) = counts[True], counts[False]
    return [*lines, "",
            f"A/A sessions failed: {false}/{n_aa} (false-alarm rate <= {upper_bound(false, n_aa) * 100:.1f} %, "
            "exact one-sided 95 %)",
            f"injected sessions failed: {caught}/{n_inj} (power >= {lower_bound(caught, n_inj) * 100:.1f} %, "
            "exact one-sided 95 %)"]


def render(folder: Path, threshold: float = 0.97) -> str:
    stored = [_level(_report(p)) for p in sorted(folder.glob("store-start-*.report.json.gz"))]
    history = StartHistory(tuple(stored))
    return "\n".join([f"stored starts: {history.starts}, levels {min(stored):.2f}-{max(stored):.2f} tok/s "
                      f"(mean {history.center:.2f}), start-to-start spread {history.log_sd * 100:.3f} %",
                      f"  {describe_history(history, threshold)}", "", *verdicts(folder)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--threshold", type=float, default=0.97)
    args = parser.parse_args(argv)
    print(render(args.folder, args.threshold))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
