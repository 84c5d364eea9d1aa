"""An A/B over several start pairs: ``python -m specgate start-pairs --rig NAME --pairs K -- ARGS``.

Two fresh servers of one build read up to 6 % apart, an offset no window's pairs can see, so the
start pair is a unit: K sessions, each starting both sides afresh with the first side alternating,
each window's throughput ratio combined over them as the mean of the K log ratios (:func:`combine`).
The exit code is the gates' (1 when a combined gate FAILS), or the first broken session's."""

from __future__ import annotations

import gzip
import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specgate.config.rig import Rig
from specgate.decide.paired import Line, interval_ratio, spread_quantile
from specgate.decide.settings import window_settings
from specgate.store.saved_report import load_report

ORDERS = ("reference",
          "candidate")  # the side that starts first, alternating from one pair to the next
METHOD_T = "A/B over start pairs: mean log ratio, t(K - 1) x sd / sqrt(K)"
METHOD_KNOWN = ("A/B over start pairs: mean log ratio, q x sqrt(start-pair spread^2 / K + "
                "windows' noise / K^2)")


@dataclass(frozen=True)
class PairRatio:
    """One start pair's throughput ratio for one window (from its session's report.json)."""

    first: str  # the side started first
    ratio: float
    ci_low: float | None
    ci_high: float | None
    confidence: float
    n: int
    widened_log: float = 0.0  # the session's added start-pair spread (log units)

    @property
    def log_se(self) -> float | None:
        """The log ratio's standard error from its window's pairs, without the start-pair spread the
        session's verdict added (counted once in the combination)."""
        if not self.ci_low or not self.ci_high:
            return None
        half = (math.log(self.ci_high) - math.log(self.ci_low)) / 2 - self.widened_log
        return max(half, 0.0) / spread_quantile(self.confidence)


def session_command(rig: Rig, first: str, run_dir: Path, pytest_args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-m", rig.tier, f"--specgate-rig={rig.name}",
            f"--specgate-first-side={first}", f"--specgate-run-dir={run_dir}", "-p",
            "no:cacheprovider", *pytest_args]


def throughput_ratios(report: dict[str, Any]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Each A/B window's throughput details in a report, by window key."""
    found = {}
    for entry in [*report.get("gates", []), *report.get("undecided", [])]:
        details = entry.get("details") or {}
        if entry.get("gate") == "throughput" and details.get("ratio") \
                and details.get("reference_label") == "the reference side":
            found[(entry["mode"], entry["prompt_class"], int(entry["concurrency"]))] = details
    return found


def combine(rig: Rig, key: tuple[str, str, int], pairs: Sequence[PairRatio]) -> dict[str, Any]:
    """One window's A/B throughput verdict over its start pairs: METHOD_T from 3 pairs, else
    METHOD_KNOWN (q: t at ``start_pair_spread_pairs`` - 1 df, z where unknown)."""
    mode, prompt_class, concurrency = key
    window = window_settings(rig, mode, prompt_class, concurrency)
    gates = window.thresholds
    threshold = 1 - window.ab_tolerance
    logs = [math.log(p.ratio) for p in pairs]
    k = len(pairs)
    estimate = statistics.fmean(logs)
    confidence = gates.confidence
    basis = {"basis": "own", "own_spread": statistics.stdev(logs) if k >= 2 else 0.0}
    if k >= 3:
        half = spread_quantile(confidence, k - 1) * basis["own_spread"] / math.sqrt(k)
        dof, method = k - 1, METHOD_T
    else:
        noise = sum((p.log_se or 0.0) ** 2 for p in pairs) / k**2
        sigma = math.log1p(gates.start_pair_spread)
        dof, method = gates.start_pair_dof if sigma else None, METHOD_KNOWN
        half = spread_quantile(confidence, dof) * math.sqrt(sigma**2 / k + noise)
        basis = {"basis": "rig" if sigma else "unknown", "rig_spread": gates.start_pair_spread,
                 "spread_pairs": gates.start_pair_spread_pairs if dof is not None else None}
    result = interval_ratio(estimate, half, n=k, unit="start pairs", dof=dof,
                            line=Line(threshold, gates.equivalence_margin), confidence=confidence,
                            method=method)
    outcome = "undecided" if result.verdict == "undecided" else "pass" if result.passed else "fail"
    return {"gate": "throughput", "mode": mode, "prompt_class": prompt_class,
            "concurrency": concurrency, "outcome": outcome, "start_pairs": k,
            "details": {**result.to_dict(), **basis, "rule": "start pairs",
                        "reference_label": "the reference side",
                        "start_pairs": k, "per_pair": [p.__dict__ for p in pairs]}}


def combine_reports(rig: Rig, reports: Sequence[tuple[str, dict[str, Any]]]
                    ) -> list[dict[str, Any]]:
    """Every A/B window of all ``reports`` ((first side, report) per pair), combined."""
    per_report = [(first, throughput_ratios(report)) for first, report in reports]
    keys = sorted(set.intersection(*(set(found) for _, found in per_report))) if per_report else []
    return [combine(rig, key, [PairRatio(first, d["ratio"], d.get("ci_low"), d.get("ci_high"),
                                         d.get("confidence", 0.95), int(d.get("n", 0)),
                                         float((d.get("start_pair") or {}).get("widened_log")
                                               or 0.0))
                               for first, found in per_report for d in [found[key]]])
            for key in keys]


def combine_folder(rig: Rig, runs_dir: Path) -> list[dict[str, Any]]:
    """The combination from a start-pairs folder's kept reports (pair-NN/report.json)."""
    reports = []
    for folder in sorted(runs_dir.glob("pair-*")):
        kept = folder / "report.json.gz"
        report = (json.loads(gzip.decompress(kept.read_bytes())) if kept.exists()
                  else load_report(folder / "report.json"))
        first = next(iter(((report.get("start_order") or {}).get("first") or {}).values()), None)
        reports.append((first or "?", report))
    return combine_reports(rig, reports)
