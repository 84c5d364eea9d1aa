"""The paired-ratio statistic (specgate.paired): Hodges-Lehmann estimate, Wilcoxon interval,
non-inferiority verdicts and the stated resolution."""

import math

import numpy as np
import pytest

from specgate.paired import MIN_PAIRS, _interval_rank, describe, paired_ratio, verdict_text, walsh_averages

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(("n", "k"), [(6, 1), (8, 4), (12, 14), (20, 53)])
def test_interval_rank_matches_the_signed_rank_tables(n, k):
    # Critical values of the two-sided 5 % Wilcoxon signed-rank test: T <= 0, 3, 13, 52 (K = T + 1).
    assert _interval_rank(n, 0.95)[0] == k


def test_the_interval_is_the_inverted_signed_rank_test():
    from scipy import stats as scipy_stats  # here, not at collection: scipy.stats costs every run 1.1 s

    rng = np.random.default_rng(3)
    d = rng.normal(0.02, 0.05, 15)
    result = paired_ratio(np.exp(d), np.ones(15), threshold=1.0)
    lo, hi = math.log(result.ci_low), math.log(result.ci_high)
    # just inside the interval the test does not reject; just outside it does (alpha 5 %)
    for shift, rejects in ((lo + 1e-9, False), (hi - 1e-9, False), (lo - 1e-3, True), (hi + 1e-3, True)):
        p = scipy_stats.wilcoxon(d - shift, method="exact").pvalue
        assert (p < 0.05) == rejects


def test_estimate_is_the_median_of_walsh_averages():
    d = np.log(np.array([0.9, 0.95, 1.0, 1.02, 1.1, 0.97]))
    expected = math.exp(np.median(walsh_averages(d)))
    assert paired_ratio(np.exp(d), np.ones(6), threshold=1).ratio == pytest.approx(expected)


def test_one_hiccup_request_does_not_move_the_near_end():
    rng = np.random.default_rng(0)
    reference = rng.normal(50, 1, 12)
    slowed = reference * 0.90 * rng.normal(1, 0.01, 12)
    clean = paired_ratio(slowed, reference, threshold=0.95)
    hiccup = reference.copy()
    hiccup[4] *= 0.6  # one reference request stalls: its pair's ratio jumps up
    spoiled = paired_ratio(slowed, hiccup, threshold=0.95)
    assert clean.verdict == spoiled.verdict == "slower"
    assert spoiled.ci_high < 0.95


@pytest.mark.parametrize(("factor", "verdict", "passed"), [
    (0.80, "slower", False), (1.25, "faster", True), (1.00, "equal", True)])
def test_verdicts(factor, verdict, passed):
    rng = np.random.default_rng(1)
    reference = rng.normal(50, 1, 12)
    result = paired_ratio(reference * factor * rng.normal(1, 0.005, 12), reference, threshold=1.0)
    assert (result.verdict, result.passed) == (verdict, passed)


def test_a_straddling_interval_is_undecided_and_says_its_resolution():
    rng = np.random.default_rng(2)
    reference = rng.normal(50, 1, 8)
    result = paired_ratio(reference * rng.normal(0.99, 0.08, 8), reference, threshold=1.0)
    assert result.verdict == "undecided" and result.passed
    text = describe(result, reference_label="no speculation")
    assert f"catches a true ratio <= {result.detectable:.3f}" in text and result.detectable < 1.0


def test_equal_within_reports_the_margin():
    reference = np.linspace(40, 60, 12)
    result = paired_ratio(reference * np.array([1.01, 0.99] * 6), reference, threshold=1.0)
    assert verdict_text(result) == f"equal within ±{result.equal_within * 100:.1f} %"
    assert result.equal_within <= 0.011


def test_fewer_than_six_pairs_decide_by_threshold_alone_and_say_so():
    result = paired_ratio([46.4], [62.6], threshold=1.0)
    assert result.ci_high is None and not result.passed and result.verdict == "slower (threshold only)"
    assert "too few for an interval" in describe(result, reference_label="no speculation")
    assert MIN_PAIRS == 6


def test_shift_and_extra_spread():
    reference = np.full(12, 50.0) * np.linspace(0.98, 1.02, 12)
    now = reference * 0.74
    against_stored = paired_ratio(now, reference, threshold=0.9, shift=0.74)
    assert against_stored.ratio == pytest.approx(1.0)
    plain = paired_ratio(now, reference, threshold=0.5)
    wide = paired_ratio(now, reference, threshold=0.5, extra_log_spread=0.1)
    assert wide.ci_high == pytest.approx(plain.ci_high * math.exp(0.1))
    assert wide.ci_low == pytest.approx(plain.ci_low * math.exp(-0.1))


@pytest.mark.parametrize("bad", [([1.0, -2.0], [1.0, 1.0]), ([1.0], [1.0, 2.0]), ([], [])])
def test_bad_samples_are_refused(bad):
    with pytest.raises(ValueError):
        paired_ratio(*bad, threshold=1.0)
