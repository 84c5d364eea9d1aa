"""How long the throughput gate's decision takes, and how well it decides.

Times ``compare_ratio`` exactly as the throughput gate calls it on a recorded cpu-tier window (paired,
n = 6 per side, 2000 bootstrap resamples, 95 % confidence), then runs the statistics validation
(benchmarks/stats_validation.py) on the recorded cpu-tier reports with fewer comparisons than the
script's default and stores its figures (false-alarm rates, detection rates, smallest slowdown
detected 95 % of the time, per setting and tolerance) in the benchmark's ``extra_info``.

    pytest benchmarks/test_stats_validation.py -m bench
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from stats_validation import _align, load_report, validate

from specgate.stats import METHOD_BOOTSTRAP_PAIRED, compare_ratio

pytestmark = pytest.mark.bench

REPORTS = sorted(
    (Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "cpu" / "reports").glob("*.json")
)
TOLERANCE = 0.15  # cpu-smollm2's throughput_tolerance
CONFIDENCE = 0.95
TRIALS = 500  # the script's default is 2000: this keeps the benchmark at about 10 s


def test_throughput_gate_speed_and_validation_figures(benchmark: Any) -> None:
    runs = [load_report(path) for path in REPORTS]
    by_rig: dict[str, list[Any]] = {}
    for run in runs:
        by_rig.setdefault(run.rig, []).append(run)
    runs = max(by_rig.values(), key=len, default=[])
    if len(runs) < 2:
        pytest.skip(
            f"needs two recorded runs of one rig in {REPORTS[0].parent if REPORTS else 'the fixtures'}"
        )
    key = sorted(set(runs[0].windows) & set(runs[1].windows))[0]
    measured, reference, paired = _align(runs[1].windows[key], runs[0].windows[key])

    benchmark.group = "throughput gate"
    comparison = benchmark(
        compare_ratio,
        measured,
        reference,
        threshold=1 - TOLERANCE,
        gate="throughput",
        subject=f"{key.mode} on {key.prompt_class}",
        reference_label="baseline",
        paired=paired,
        confidence=CONFIDENCE,
    )
    assert comparison.method == METHOD_BOOTSTRAP_PAIRED

    result = validate(runs, tolerance=TOLERANCE, confidence=CONFIDENCE, trials=TRIALS, check_trials=50)
    benchmark.extra_info.update(
        {
            "timed": f"compare_ratio, paired, n = {comparison.n_measured}/{comparison.n_reference}, "
            "2000 resamples",
            "reports": [run.label for run in runs],
            **result.figures(),
        }
    )
    assert result.mismatches == 0, "derived decisions disagree with direct compare_ratio calls"
    for setting in result.settings:
        for tol in result.tolerances:
            assert 0.0 <= setting.detection(tol, 0.30) <= 1.0
