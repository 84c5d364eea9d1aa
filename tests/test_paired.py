"""The paired-ratio statistic (specgate.decide.paired): Hodges-Lehmann estimate, Wilcoxon interval,
non-inferiority verdicts and the stated resolution."""

import math
from pathlib import Path

import numpy as np
import pytest
from words import said

from specgate.config.defaults import MIN_PAIRS
from specgate.config.rig import load_rig
from specgate.decide.paired import _interval_rank, paired_ratio, walsh_averages
from specgate.decide.settings import window_settings
from specgate.report.verdicts import ratio_text, verdict_text

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent


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
    result = paired_ratio(reference * factor * rng.normal(1, 0.005, 12), reference, threshold=0.97)
    assert (result.verdict, result.passed) == (verdict, passed)


def test_a_straddling_interval_is_undecided_and_says_its_resolution():
    rng = np.random.default_rng(2)
    reference = rng.normal(50, 1, 8)
    result = paired_ratio(reference * rng.normal(0.99, 0.08, 8), reference, threshold=1.0)
    assert result.verdict == "undecided" and result.passed
    text = ratio_text(result.to_dict(), "no speculation")
    assert f"catches a true ratio <= {result.detectable:.3f}" in text and result.detectable < 1.0


def test_equal_within_reports_the_margin():
    reference = np.linspace(40, 60, 12)
    result = paired_ratio(reference * np.array([1.01, 0.99] * 6), reference, threshold=0.97)
    assert verdict_text(result.to_dict()) == f"equal within ±{result.equal_within * 100:.1f} %"
    assert result.equal_within <= 0.011


@pytest.mark.parametrize("factor", [0.5, 1.0, 2.0])
def test_fewer_than_six_pairs_decide_nothing_and_say_so(factor):
    # a point ratio far below, at or far above the threshold: no interval, so never pass nor fail
    for n in range(1, MIN_PAIRS):
        reference = np.linspace(40, 60, n)
        result = paired_ratio(reference * factor, reference, threshold=1.0)
        assert result.ci_low is None and result.ci_high is None and result.verdict == "undecided"
        assert result.ratio == pytest.approx(factor)
        assert f"{n} pair(s), too few for an interval (at least 6): undecided" in ratio_text(
            result.to_dict(), "no speculation")
    assert MIN_PAIRS == 6
    assert paired_ratio(np.linspace(40, 60, 6) * 0.5, np.linspace(40, 60, 6), threshold=1.0).verdict == "slower"


def test_fewer_than_six_pairs_make_the_gate_undecided():
    from specgate.decide.gates import backfire_decision, bare_window
    from specgate.decide.matching import Samples
    from specgate.decide.outcome import Outcome

    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    for factor in (0.5, 2.0):
        ngram = window_settings(rig, "ngram", "coding")
        result = backfire_decision(ngram, bare_window(ngram),
                                   Samples([30.0 * factor] * 5, [30.0] * 5, paired=True))
        assert result.outcome is Outcome.UNDECIDED, said(result)
        assert "5 pair(s), too few for an interval" in said(result)


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


# -- prompts as fixed strata (comparisons of two modes) ------------------------------------------
PROMPTS = [p for p in ("a", "b", "c", "d", "e", "f") for _ in range(2)]  # 6 prompts x 2 repeats


def test_strata_estimate_and_interval_are_the_stratified_mean_and_t():
    from scipy import stats as scipy_stats

    from specgate.decide.paired import stratified_log_ratio

    d = np.array([0.10, 0.12, 0.40, 0.36, -0.05, -0.01, 0.20, 0.22, 0.0, 0.06, 0.31, 0.29])
    result = stratified_log_ratio(d, PROMPTS, threshold=1.0)
    means = d.reshape(6, 2).mean(axis=1)
    scatter = math.sqrt(((d.reshape(6, 2) - means[:, None]) ** 2).sum() / 6)
    half = scipy_stats.t.ppf(0.975, 6) * scatter * math.sqrt(6 / 2) / 6
    centre = means.mean()
    assert result.ratio == pytest.approx(math.exp(centre))
    assert (result.ci_low, result.ci_high) == pytest.approx((math.exp(centre - half), math.exp(centre + half)))
    assert result.confidence == 0.95 and (result.prompts, result.dof) == (6, 6)


def test_prompts_that_differ_do_not_widen_it_the_way_they_widen_hodges_lehmann():
    """ngram on coding: 0.95x on some prompts, 1.5x on others, each prompt's repeats within 2 %
    (the shape of the cpu tier's windows): undecided over 12 exchangeable pairs, decided by prompt."""
    from specgate.decide.paired import stratified_log_ratio

    per_prompt = np.log([0.95, 1.50, 1.02, 1.35, 0.97, 1.45])
    d = np.repeat(per_prompt, 2) + np.tile([-0.01, 0.01], 6)
    hl = paired_ratio(np.exp(d), np.ones(12), threshold=1.0)
    strata = stratified_log_ratio(d, PROMPTS, threshold=1.0)
    assert hl.verdict == "undecided" and hl.ci_low < 1.0
    assert strata.verdict == "faster" and strata.ci_low > 1.1
    assert strata.ratio == pytest.approx(math.exp(per_prompt.mean()))
    via_samples = paired_ratio(np.exp(d), np.ones(12), threshold=1.0, strata=PROMPTS)
    assert (via_samples.ratio, via_samples.ci_low, via_samples.ci_high) == pytest.approx(
        (strata.ratio, strata.ci_low, strata.ci_high)) and via_samples.method == strata.method


def test_a_hiccup_request_widens_the_strata_interval_and_never_fails_a_faster_mode():
    from specgate.decide.paired import stratified_log_ratio

    d = np.repeat(np.log([1.10, 1.20, 1.15, 1.12, 1.18, 1.14]), 2) + np.tile([-0.01, 0.01], 6)
    clean = stratified_log_ratio(d, PROMPTS, threshold=1.0)
    d[3] = math.log(0.6)  # one request of the speculative side stalled
    hiccup = stratified_log_ratio(d, PROMPTS, threshold=1.0)
    assert hiccup.ci_high - hiccup.ci_low > 3 * (clean.ci_high - clean.ci_low)
    assert hiccup.passed and clean.verdict == "faster"


def test_without_repeats_the_strata_statistic_falls_back_to_hodges_lehmann():
    from specgate.decide.paired import METHOD, stratified_log_ratio

    d = np.log([1.1, 0.9, 1.2, 1.0, 1.05, 0.95, 1.15])
    assert stratified_log_ratio(d, list("abcdefg"), threshold=1.0) == paired_ratio(np.exp(d), np.ones(7), threshold=1.0)
    assert stratified_log_ratio(d, list("abcdefg"), threshold=1.0).method == METHOD
    with pytest.raises(ValueError, match="one stratum per pair"):
        stratified_log_ratio(d, ["a"], threshold=1.0)
