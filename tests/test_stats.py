"""Tests for specgate.stats: the gate decision rules and their messages."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specgate.stats import (
    METHOD_BOOTSTRAP,
    METHOD_BOOTSTRAP_PAIRED,
    METHOD_NO_SPREAD,
    METHOD_ONE_SIDED,
    METHOD_SINGLE_SAMPLE,
    compare_acceptance,
    compare_outputs,
    compare_ratio,
    match_by_key,
    summarize,
)

pytestmark = pytest.mark.fast

# Few resamples keep the property tests fast; the decision rule does not depend on it.
FAST = {"n_resamples": 300}

throughputs = st.lists(st.floats(min_value=1.0, max_value=1000.0), min_size=1, max_size=8)
thresholds = st.floats(min_value=0.5, max_value=1.2)


def test_summarize_is_robust() -> None:
    summary = summarize([10.0, 11.0, 12.0, 13.0, 1000.0])
    assert summary.median == 12.0
    assert summary.n == 5
    assert summary.iqr == pytest.approx(2.0)
    assert summary.mad == pytest.approx(1.4826, rel=1e-3)  # one unit, normal-scaled
    assert summary.samples == (10.0, 11.0, 12.0, 13.0, 1000.0)


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")]])
def test_summarize_rejects_empty_and_non_finite(bad: list[float]) -> None:
    with pytest.raises(ValueError, match=r"empty|NaN or infinite"):
        summarize(bad)


@pytest.mark.parametrize("side", ["measured", "reference"])
def test_empty_sample_names_subject_and_side(side: str) -> None:
    measured, reference = ([], [60.0]) if side == "measured" else ([60.0], [])
    with pytest.raises(ValueError) as error:
        compare_ratio(
            measured,
            reference,
            threshold=0.95,
            gate="regression",
            subject="ngram on coding",
            reference_label="baseline",
        )
    message = str(error.value)
    assert "ngram on coding" in message and "is empty" in message
    assert ("measured" if side == "measured" else "baseline") in message


def test_single_sample_is_decided_by_tolerance_alone() -> None:
    result = compare_ratio(
        [58.0],
        [60.0, 61.0, 59.0],
        threshold=0.95,
        gate="regression",
        subject="eagle on chat",
        reference_label="baseline",
    )
    assert result.passed  # ratio 0.967 >= 0.95
    assert result.method == METHOD_SINGLE_SAMPLE
    assert result.ci_low is None and result.ci_high is None
    assert "single sample, decided by the threshold alone" in result.message
    assert "tolerance only (single sample)" in result.message


def test_exact_threshold_passes_and_just_below_fails() -> None:
    at_edge = compare_ratio([95.0], [100.0], threshold=0.95, gate="regression", subject="s")
    assert at_edge.ratio == 0.95 and at_edge.passed
    below = compare_ratio(
        [float(np.nextafter(95.0, 0.0))], [100.0], threshold=0.95, gate="regression", subject="s"
    )
    assert below.ratio < 0.95 and not below.passed


def test_clear_regression_fails_and_identical_distributions_pass() -> None:
    rng = np.random.default_rng(7)
    reference = 60.0 + rng.normal(0.0, 1.0, size=10)
    slower = reference * 0.7 + rng.normal(0.0, 0.3, size=10)
    failed = compare_ratio(
        slower,
        reference,
        threshold=0.95,
        gate="regression",
        subject="ngram on coding",
        reference_label="baseline",
    )
    assert not failed.passed
    assert failed.method == METHOD_BOOTSTRAP
    assert failed.ci_high is not None and failed.ci_high < 0.95
    assert "30 % slower" in failed.message and "n=10/10" in failed.message

    same = compare_ratio(
        reference.copy(), reference, threshold=0.95, gate="regression", subject="ngram on coding"
    )
    assert same.passed and same.ratio == 1.0
    assert same.ci_low is not None and same.ci_high is not None and same.ci_low <= 1.0 <= same.ci_high


def test_noisy_small_slowdown_below_threshold_passes_when_not_significant() -> None:
    # Median 6 % slower but the spread covers the threshold: not significant, so no failure.
    reference = [50.0, 60.0, 70.0, 55.0, 65.0]
    measured = [47.0, 56.4, 65.8, 51.7, 61.1]
    result = compare_ratio(measured, reference, threshold=0.95, gate="regression", subject="s")
    assert result.ratio < 0.95
    assert result.ci_high is not None and result.ci_high >= 1.0
    assert result.passed


def test_backfire_replay_of_real_figures() -> None:
    result = compare_ratio(
        [46.4],
        [62.6],
        threshold=1.0,
        gate="backfire",
        subject="ngram on coding",
        reference_label="no speculation",
        fail_phrase="ngram is {change} than no speculation on coding",
    )
    assert not result.passed
    assert result.ratio == pytest.approx(0.741, abs=5e-4)
    assert round(result.change_pct) == -26
    assert "26 % slower" in result.message
    assert result.message.startswith(
        "ngram is 26 % slower than no speculation on coding: 46.4 tok/s vs 62.6 no speculation"
    )
    assert "threshold 1.00" in result.message
    json.dumps(result.to_dict(), allow_nan=False)


def test_message_carries_the_whole_comparison() -> None:
    result = compare_ratio(
        [46.0, 46.4, 47.0, 45.9, 46.8],
        [62.0, 62.6, 63.1, 61.8, 62.9],
        threshold=1.0,
        gate="backfire",
        subject="ngram on coding",
        reference_label="no-spec",
    )
    assert not result.passed
    assert result.message.startswith(
        "ngram on coding: 46.4 tok/s vs 62.6 no-spec (ratio 0.741, 26 % slower; 95 % CI 0."
    )
    assert result.message.endswith("threshold 1.00; n=5/5; bootstrap median ratio)")


def test_paired_uses_median_of_ratios() -> None:
    result = compare_ratio(
        [50.0, 100.0, 30.0, 80.0],
        [100.0, 100.0, 60.0, 90.0],
        threshold=0.9,
        gate="regression",
        subject="s",
        paired=True,
    )
    assert result.ratio == pytest.approx(np.median([0.5, 1.0, 0.5, 80 / 90]))
    assert result.method == METHOD_BOOTSTRAP_PAIRED
    with pytest.raises(ValueError, match="equal length"):
        compare_ratio([1.0, 2.0], [1.0], threshold=0.9, gate="regression", subject="s", paired=True)


def test_identical_values_fall_back_to_tolerance() -> None:
    result = compare_ratio([50.0] * 4, [60.0] * 4, threshold=0.9, gate="regression", subject="s")
    assert result.method == METHOD_NO_SPREAD
    assert not result.passed
    assert "all values identical, decided by the threshold alone" in result.message


def test_bootstrap_is_reproducible() -> None:
    kwargs = dict(threshold=0.95, gate="regression", subject="s", seed=3)
    first = compare_ratio([50.0, 52.0, 49.0, 55.0], [53.0, 54.0, 51.0, 56.0], **kwargs)
    second = compare_ratio([50.0, 52.0, 49.0, 55.0], [53.0, 54.0, 51.0, 56.0], **kwargs)
    assert first == second


@settings(max_examples=40, deadline=None)
@given(
    measured=throughputs,
    reference=throughputs,
    threshold=thresholds,
    factor=st.floats(min_value=0.3, max_value=0.999),
)
def test_uniformly_slower_never_passes_where_unscaled_fails(
    measured: list[float], reference: list[float], threshold: float, factor: float
) -> None:
    unscaled = compare_ratio(measured, reference, threshold=threshold, gate="g", subject="s", **FAST)
    slower = compare_ratio(
        [x * factor for x in measured], reference, threshold=threshold, gate="g", subject="s", **FAST
    )
    assert slower.ratio <= unscaled.ratio
    if not unscaled.passed:
        assert not slower.passed, (unscaled.message, slower.message)


@settings(max_examples=40, deadline=None)
@given(
    measured=throughputs,
    reference=throughputs,
    threshold=thresholds,
    exponent=st.integers(-10, 10),
    paired=st.booleans(),
)
def test_scaling_both_sides_keeps_the_decision(
    measured: list[float], reference: list[float], threshold: float, exponent: int, paired: bool
) -> None:
    if paired:
        size = min(len(measured), len(reference))
        measured, reference = measured[:size], reference[:size]
    # A power of two scales floats exactly, so the comparison must not move at
    # all (any other constant rounds and could nudge a ratio sitting on the edge).
    scale = 2.0**exponent
    plain = compare_ratio(
        measured, reference, threshold=threshold, gate="g", subject="s", paired=paired, **FAST
    )
    scaled = compare_ratio(
        [x * scale for x in measured],
        [x * scale for x in reference],
        threshold=threshold,
        gate="g",
        subject="s",
        paired=paired,
        **FAST,
    )
    assert scaled.passed == plain.passed
    assert scaled.ratio == plain.ratio
    assert (scaled.ci_low, scaled.ci_high) == (plain.ci_low, plain.ci_high)


@settings(max_examples=40, deadline=None)
@given(reference=st.floats(min_value=1.0, max_value=1000.0), threshold=thresholds)
def test_single_sample_edge_follows_the_threshold(reference: float, threshold: float) -> None:
    measured = reference * threshold
    result = compare_ratio([measured], [reference], threshold=threshold, gate="g", subject="s")
    assert result.passed == (result.ratio >= threshold)


def test_acceptance_is_one_sided() -> None:
    higher = compare_acceptance(
        3.1, 2.6, tolerance=0.1, subject="eagle on chat", metric="mean acceptance length"
    )
    assert higher.passed and higher.method == METHOD_ONE_SIDED
    lower = compare_acceptance(
        2.0, 2.6, tolerance=0.1, subject="eagle on chat", metric="mean acceptance length"
    )
    assert not lower.passed
    assert lower.message.startswith(
        "eagle on chat: mean acceptance length 2 vs 2.6 baseline (ratio 0.769, 23 % lower"
    )
    # Exactly at the tolerance (values exact in binary floating point) passes.
    assert compare_acceptance(1.5, 2.0, tolerance=0.25, subject="s", metric="m").passed
    assert not compare_acceptance(
        float(np.nextafter(1.5, 0.0)), 2.0, tolerance=0.25, subject="s", metric="m"
    ).passed


def test_compare_outputs_share_and_first_divergence() -> None:
    result = compare_outputs(
        [
            ("p1", "The answer is 42.", "The answer is 42."),
            ("p2", "def f(x): return x", "def f(y): return y"),
            ("p3", "short", "short and longer"),
            ("p4", "same", "same"),
        ],
        min_identical_share=1.0,
        subject="ngram on coding",
    )
    assert result.identical_share == 0.5
    assert result.first_divergence == {"p1": None, "p2": 6, "p3": 5, "p4": None}
    assert not result.passed
    assert "2/4 outputs identical" in result.message and "p2 at char 6" in result.message
    assert compare_outputs([("p1", "a", "a"), ("p2", "a", "b")], min_identical_share=0.5, subject="s").passed
    with pytest.raises(ValueError, match="no outputs to compare for s"):
        compare_outputs([], min_identical_share=1.0, subject="s")


# -- start noise: each side of a gate is one server start -----------------------------------------
# The GPU lab's real samples (tok/s per prompt, in the same prompt order): draft_l6 on extraction,
# run 1 (stored as the baseline) and run 2, two starts of the same config; no speculation in run 2.
_ROOT = Path(__file__).resolve().parents[1]


def _lab_run2(mode: str) -> list[float]:
    report = json.loads((_ROOT / "fixtures/recorded/gpu/reports/run2-plain.json").read_text())
    m = next(m for m in report["measurements"] if m["mode"] == mode and m["prompt_class"] == "extraction")
    return [r["decode_tokens_per_s"] for r in m["records"]]


LAB_RUN1 = json.loads((_ROOT / "baselines.json").read_text())["rigs"]["h200-smollm2"]["draft_l6"]["extraction"]["1"][
    "decode_tokens_per_s"]
LAB_RUN2 = _lab_run2("draft_l6")
LAB_RUN2_NO_SPEC = _lab_run2("baseline")


def test_zero_start_noise_is_the_request_level_gate() -> None:
    kwargs = dict(threshold=0.9, gate="throughput", subject="s", paired=True)
    assert compare_ratio(LAB_RUN2, LAB_RUN1, **kwargs) == compare_ratio(LAB_RUN2, LAB_RUN1, start_noise=0.0, **kwargs)


def test_start_noise_widens_the_interval_and_says_so() -> None:
    kwargs = dict(threshold=0.9, gate="throughput", subject="draft_l6 on extraction", paired=True)
    tight = compare_ratio(LAB_RUN2, LAB_RUN1, **kwargs)
    wide = compare_ratio(LAB_RUN2, LAB_RUN1, start_noise=0.11, **kwargs)
    assert not tight.passed and tight.ci_high < 0.9
    assert wide.ratio == tight.ratio  # the point estimate does not move
    assert wide.ci_low < tight.ci_low and wide.ci_high > tight.ci_high
    assert wide.passed  # a 26 % drop is within what two starts at 11 % each can do
    assert wide.method == f"{METHOD_BOOTSTRAP_PAIRED} + start noise 11 %" and "start noise 11 %" in wide.message
    assert wide == compare_ratio(LAB_RUN2, LAB_RUN1, start_noise=0.11, **kwargs)  # seeded: reproducible


def test_start_noise_still_catches_a_large_drop_and_a_backfire() -> None:
    halved = [v / 2 for v in LAB_RUN1]
    drop = compare_ratio(halved, LAB_RUN1, threshold=0.9, gate="throughput", subject="s", paired=True,
                         start_noise=0.11)
    assert not drop.passed and drop.ci_high < 0.9
    # draft_l6 vs no speculation on extraction in run 2 (about half as fast): still a backfire.
    backfire = compare_ratio(LAB_RUN2, LAB_RUN2_NO_SPEC, threshold=1.0, gate="backfire",
                             subject="s", paired=True, start_noise=0.11)
    assert not backfire.passed and backfire.ci_high < 1.0


def test_start_noise_gives_a_single_sample_an_interval() -> None:
    c = compare_ratio([40.0], [47.0], threshold=0.9, gate="throughput", subject="s", start_noise=0.1)
    assert c.ci_low is not None and c.ci_low < 0.85 < c.ci_high
    assert c.passed and c.method == "start noise 10 % only (single sample)"


@pytest.mark.parametrize("bad", [-0.1, 1.0, float("nan")])
def test_start_noise_out_of_range_names_the_subject(bad: float) -> None:
    with pytest.raises(ValueError, match="start_noise for ngram on coding"):
        compare_ratio([1.0, 2.0], [1.0, 2.0], threshold=0.9, gate="t", subject="ngram on coding", start_noise=bad)


# -- pairing by request key ----------------------------------------------------------------------
keyed = st.dictionaries(st.from_regex(r"p[0-9]{1,2}#[0-3]", fullmatch=True),
                        st.floats(min_value=1.0, max_value=1000.0), min_size=2, max_size=12)


@settings(max_examples=60, deadline=None)
@given(reference=keyed, data=st.data())
def test_pairs_line_up_by_key_and_only_one_sided_keys_are_left_out(reference, data) -> None:
    keys = list(reference)
    kept = data.draw(st.lists(st.sampled_from(keys), unique=True, min_size=1), label="measured keys")
    measured = {k: reference[k] * 1.5 for k in kept}
    matched = match_by_key(measured, reference)
    if matched.paired:
        # every pair is one request measured twice: the ratio is the same for each
        assert [m / r for m, r in zip(matched.measured, matched.reference)] == pytest.approx([1.5] * len(kept))
        assert sorted(matched.one_sided) == sorted(set(keys) - set(kept))
        assert 2 * len(kept) >= len(keys) and len(kept) >= 2
    else:  # too few shared keys to pair: each side compared whole
        assert sorted(matched.measured) == sorted(measured.values())
        assert sorted(matched.reference) == sorted(reference.values())
        assert len(kept) < 2 or 2 * len(kept) < len(keys)


def test_one_request_missing_costs_one_pair_and_disjoint_keys_compare_unpaired() -> None:
    reference = {f"p{i}#0": 30.0 + i for i in range(6)}
    measured = {k: v for k, v in reference.items() if k != "p3#0"}
    matched = match_by_key(measured, reference)
    assert matched.paired and len(matched.measured) == 5 and matched.one_sided == ["p3#0"]
    other = match_by_key({f"q{i}#0": 1.0 for i in range(6)}, reference)
    assert not other.paired and len(other.measured) == len(other.reference) == 6
