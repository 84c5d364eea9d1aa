"""Gate decisions: is a measured sample slower than its reference, has acceptance
dropped, are the outputs still identical? Each decision comes back as a record
whose one-line message carries the whole comparison, so a failing gate can be
acted on from the test report alone.

Throughput-like quantities are assumed: higher is better, and "slower" means a
ratio measured / reference below 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

METHOD_BOOTSTRAP = "bootstrap median ratio"
METHOD_BOOTSTRAP_PAIRED = "bootstrap paired median ratio"
METHOD_SINGLE_SAMPLE = "tolerance only (single sample)"
METHOD_NO_SPREAD = "tolerance only (identical values)"
METHOD_ONE_SIDED = "one-sided tolerance"
METHOD_BINOMIAL = "Wilson binomial interval"


@dataclass(frozen=True)
class SampleSummary:
    """Robust summary of repeated measurements of one quantity."""

    median: float
    mad: float  # median absolute deviation scaled to match a normal standard deviation
    iqr: float
    n: int
    samples: tuple[float, ...]


@dataclass(frozen=True)
class Comparison:
    """One gate decision. measured and reference are the medians of each side (for a
    paired comparison the ratio is the median of per-item ratios, not their quotient)."""

    gate: str
    passed: bool
    measured: float
    reference: float
    ratio: float
    threshold: float
    ci_low: float | None
    ci_high: float | None
    n_measured: int
    n_reference: int
    method: str
    message: str
    # False when the evidence cannot tell a pass from a failure (an acceptance window with too
    # few drafts); ``passed`` is then meaningless and the gate is recorded as undecided.
    decided: bool = True

    @property
    def change_pct(self) -> float:
        """Change of measured relative to reference in percent (negative: lower)."""
        return (self.ratio - 1.0) * 100.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "change_pct": self.change_pct}


@dataclass(frozen=True)
class OutputComparison:
    """Whether generated texts match their reference texts, prompt by prompt."""

    identical_share: float
    first_divergence: dict[str, int | None]  # prompt id -> first differing character, None if identical
    passed: bool
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _finite_array(samples: Sequence[float], what: str) -> np.ndarray:
    values = np.asarray(samples, dtype=float)
    if values.ndim != 1:
        raise ValueError(f"{what} must be a flat sequence of numbers, got shape {values.shape}")
    if values.size == 0:
        raise ValueError(f"{what} is empty: at least one measurement is needed")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{what} contains NaN or infinite values: {values.tolist()}")
    return values


def summarize(samples: Sequence[float]) -> SampleSummary:
    """Median, normal-scaled MAD and IQR of a non-empty sample of finite numbers."""
    values = _finite_array(samples, "sample")
    return SampleSummary(
        median=float(np.median(values)),
        mad=float(scipy_stats.median_abs_deviation(values, scale="normal")),
        iqr=float(scipy_stats.iqr(values)),
        n=int(values.size),
        samples=tuple(float(v) for v in values),
    )


def _number(value: float) -> str:
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


def _threshold_text(threshold: float) -> str:
    return f"{threshold:.2f}" if round(threshold, 2) == threshold else f"{threshold:g}"


def _change_text(ratio: float, *, up: str, down: str) -> str:
    """'26 % slower' / '4.2 % faster': whole percent once the change is large."""
    pct = (ratio - 1.0) * 100.0
    size = abs(pct)
    if round(size, 1) == 0:
        return "no change"
    amount = f"{size:.0f}" if size >= 10 else f"{size:.1f}"
    return f"{amount} % {down if pct < 0 else up}"


def _median_ratio(measured: np.ndarray, reference: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(measured, axis=axis) / np.median(reference, axis=axis)


def _bootstrap_ci(data: tuple[np.ndarray, ...], statistic, confidence: float, n_resamples: int,
                  seed: int) -> tuple[float, float, np.ndarray]:
    """Seeded percentile bootstrap interval (reproducible: the same samples give the same verdict),
    with the replicates it was taken from."""
    result = scipy_stats.bootstrap(data, statistic, n_resamples=n_resamples, vectorized=True,
                                   confidence_level=confidence, method="percentile",
                                   rng=np.random.default_rng(seed))
    return (float(result.confidence_interval.low), float(result.confidence_interval.high),
            np.asarray(result.bootstrap_distribution, dtype=float))


@dataclass(frozen=True)
class Matched:
    """Two keyed samples lined up for :func:`compare_ratio` (see :func:`match_by_key`)."""
    measured: list[float]
    reference: list[float]
    paired: bool
    one_sided: list[str]  # keys paired out because only one side has them (empty when unpaired)


def match_by_key(measured: Mapping[str, float], reference: Mapping[str, float]) -> Matched:
    """Pair two samples item by item on their keys (e.g. "prompt-id#repeat").

    The pair is made on the keys both sides have, as long as that keeps at least two pairs and
    half of the larger side: a request missing from one side (it had no decode rate) then costs
    one pair, not the pairing. With fewer shared keys (other prompts, or none stored) the samples
    are compared unpaired, whole.
    """
    common = [k for k in reference if k in measured]
    if len(common) >= 2 and 2 * len(common) >= max(len(measured), len(reference)):
        one_sided = sorted((set(measured) | set(reference)) - set(common))
        return Matched([measured[k] for k in common], [reference[k] for k in common], True, one_sided)
    return Matched(list(measured.values()), list(reference.values()), False, [])


def compare_ratio(
    measured: Sequence[float],
    reference: Sequence[float],
    *,
    threshold: float,
    gate: str,
    subject: str,
    reference_label: str = "reference",
    unit: str = "tok/s",
    fail_phrase: str | None = None,
    paired: bool = False,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
    start_noise: float = 0.0,
) -> Comparison:
    """Compare a higher-is-better measurement with its reference by the ratio of medians.

    ratio = median(measured) / median(reference); with paired=True (item i of
    both samples measured on the same prompt/run) the median of the per-item
    ratios instead. A seeded percentile bootstrap gives the confidence interval
    of that statistic.

    Decision: FAIL iff ratio < threshold AND ci_high < max(threshold, 1).
    A regression gate uses threshold = 1 - tolerance (fail only when
    significantly slower than the reference and by more than the tolerance);
    the backfire gate uses threshold = minimum speedup, e.g. 1.0 (fail when
    significantly slower than no speculation). When a side has one value, or
    the bootstrap distribution would be a single point, the decision is by the
    threshold alone and the message says so.

    Message: "<subject>: <m> <unit> vs <r> <reference_label> (ratio ..., CI,
    threshold, n, method)". fail_phrase, when given, replaces "<subject>" in
    the message of a FAILED comparison; it is a str.format template with the
    fields {change} ("26 % slower"), {ratio}, {subject} and {reference_label},
    e.g. "ngram is {change} than no speculation on coding".

    start_noise: the relative standard deviation of one server start's level (the
    same config started twice gives different medians: on the GPU lab 16-26 %).
    Each side comes from one start, so the interval of the ratio also carries
    two such draws: every bootstrap replicate (or, without resampling, the ratio
    itself) is multiplied by exp(N(0, 2 * ln(1 + start_noise)**2)) draws, seeded,
    before the percentiles are taken. 0 (the default) keeps the request-to-request
    interval alone.

    Measured values must be >= 0 and reference values > 0 (a ratio against
    zero is undefined); raises ValueError naming the subject otherwise, and for
    empty or non-finite samples.
    """
    m = _finite_array(measured, f"measured sample for {subject}")
    r = _finite_array(reference, f"{reference_label} sample for {subject}")
    if np.any(m < 0):
        raise ValueError(f"measured sample for {subject} has negative values: {m.tolist()}")
    if np.any(r <= 0):
        raise ValueError(
            f"{reference_label} sample for {subject} must be positive to divide by: {r.tolist()}"
        )
    if not (math.isfinite(threshold) and threshold > 0):
        raise ValueError(f"threshold for {subject} must be a positive number, got {threshold!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence for {subject} must be between 0 and 1, got {confidence!r}")
    if not (math.isfinite(start_noise) and 0 <= start_noise < 1):
        raise ValueError(f"start_noise for {subject} must be in [0, 1), got {start_noise!r}")

    replicates: np.ndarray | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    if paired:
        if m.size != r.size:
            raise ValueError(
                f"paired comparison for {subject} needs samples of equal length, got {m.size} measured "
                f"and {r.size} {reference_label}"
            )
        ratios = m / r
        ratio = float(np.median(ratios))
        if ratios.size == 1:
            method = METHOD_SINGLE_SAMPLE
        elif np.ptp(ratios) == 0:
            method = METHOD_NO_SPREAD
        else:
            method = METHOD_BOOTSTRAP_PAIRED
            ci_low, ci_high, replicates = _bootstrap_ci((ratios,), np.median, confidence, n_resamples, seed)
    else:
        ratio = float(_median_ratio(m, r))
        if m.size == 1 or r.size == 1:
            method = METHOD_SINGLE_SAMPLE
        elif np.ptp(m) == 0 and np.ptp(r) == 0:
            # Every resample would give the same ratio: a zero-width interval
            # would look like certainty that five identical readings do not give.
            method = METHOD_NO_SPREAD
        else:
            method = METHOD_BOOTSTRAP
            # Two-sample bootstrap: each side is resampled on its own, since
            # unpaired runs share nothing item by item.
            ci_low, ci_high, replicates = _bootstrap_ci((m, r), _median_ratio, confidence, n_resamples, seed)

    if start_noise > 0:
        # Both sides are one server start each: widen the interval by two start-level draws.
        base = replicates if replicates is not None else np.full(n_resamples, ratio)
        sd = math.sqrt(2.0) * math.log1p(start_noise)
        widened = base * np.exp(np.random.default_rng(seed + 1).normal(0.0, sd, size=base.size))
        tail = (1.0 - confidence) / 2.0 * 100.0
        ci_low, ci_high = (float(v) for v in np.percentile(widened, [tail, 100.0 - tail]))
        method = (f"{method} + start noise {start_noise * 100:g} %" if replicates is not None else
                  f"start noise {start_noise * 100:g} % only ({method.split('(')[-1]}")

    # Fail only when slower than the threshold AND significantly so; a single sample (no CI) is
    # judged by the threshold alone.
    significant = True if ci_high is None else ci_high < max(threshold, 1.0)
    passed = not (ratio < threshold and significant)

    change = _change_text(ratio, up="faster", down="slower")
    if ci_low is None or ci_high is None:
        ci_text = (
            "no CI: single sample, decided by the threshold alone"
            if method == METHOD_SINGLE_SAMPLE
            else "no CI: all values identical, decided by the threshold alone"
        )
    else:
        ci_text = f"{confidence * 100:g} % CI {ci_low:.2f}-{ci_high:.2f}"
    measured_median, reference_median = float(np.median(m)), float(np.median(r))
    detail = (
        f"{_number(measured_median)} {unit} vs {_number(reference_median)} {reference_label} "
        f"(ratio {ratio:.3f}, {change}; {ci_text}; threshold {_threshold_text(threshold)}; "
        f"n={m.size}/{r.size}; {method})"
    )
    if not passed and fail_phrase is not None:
        head = fail_phrase.format(
            change=change, ratio=f"{ratio:.3f}", subject=subject, reference_label=reference_label
        )
    else:
        head = subject
    return Comparison(
        gate=gate,
        passed=passed,
        measured=measured_median,
        reference=reference_median,
        ratio=ratio,
        threshold=threshold,
        ci_low=ci_low,
        ci_high=ci_high,
        n_measured=int(m.size),
        n_reference=int(r.size),
        method=method,
        message=f"{head}: {detail}",
    )


def wilson_interval(successes: float, trials: float, confidence: float) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (two-sided, at ``confidence``). Works with
    non-integer counts (Prometheus counters are floats) and stays inside [0, 1] with 0 or all
    successes, where the normal approximation does not."""
    if trials <= 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials > 0, got {successes!r} of {trials!r}")
    z = scipy_stats.norm.ppf(0.5 + confidence / 2)
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def trials_to_resolve(rate: float, tolerance: float, confidence: float) -> float:
    """About how many trials make the interval of a proportion near ``rate`` narrower than a drop
    of ``tolerance`` (relative): n = z^2 p (1 - p) / (tolerance p)^2."""
    z = scipy_stats.norm.ppf(0.5 + confidence / 2)
    if tolerance <= 0 or rate <= 0:
        return math.inf
    return z * z * rate * (1 - rate) / (tolerance * rate) ** 2


def compare_acceptance(
    measured: float,
    reference: float,
    *,
    tolerance: float,
    subject: str,
    metric: str,
    gate: str = "acceptance",
    reference_label: str = "baseline",
    counts: tuple[float, float] | None = None,
    confidence: float = 0.95,
    trial_label: str = "drafts",
) -> Comparison:
    """One-sided check of an acceptance figure against its baseline; higher acceptance never
    fails (an improvement, not a regression).

    Without ``counts``: FAIL iff measured < reference * (1 - tolerance).

    With ``counts`` = (accepted, trials), ``measured`` is that proportion and the decision rests
    on its Wilson interval at ``confidence``: FAIL when the whole interval lies below the fail
    line reference * (1 - tolerance), PASS when none of it does (or the rate did not drop at all),
    and otherwise UNDECIDED (``decided`` False): the window has too few trials to tell a drop of
    the tolerance from chance, and the message says about how many would.
    """
    for name, value in (("measured", measured), (reference_label, reference)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(
                f"{name} {metric} for {subject} must be a finite non-negative number, got {value!r}"
            )
    if reference == 0:
        raise ValueError(
            f"{reference_label} {metric} for {subject} is 0: there is nothing to compare against"
        )
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance for {metric} of {subject} must be in [0, 1), got {tolerance!r}")
    threshold = 1.0 - tolerance
    ratio = measured / reference
    fail_line = reference * threshold
    change = _change_text(ratio, up="higher", down="lower")
    ci_low = ci_high = None
    decided = True
    if counts is None:
        passed = not measured < fail_line
        method = METHOD_ONE_SIDED
        message = (
            f"{subject}: {metric} {measured:.3g} vs {reference:.3g} {reference_label} "
            f"(ratio {ratio:.3f}, {change}; "
            f"fails below {fail_line:.3g} = {reference_label} - {tolerance * 100:g} %; "
            f"{METHOD_ONE_SIDED})"
        )
    else:
        successes, trials = counts
        ci_low, ci_high = wilson_interval(successes, trials, confidence)
        method = METHOD_BINOMIAL
        count = f"{successes:.0f}" if float(successes).is_integer() else f"{successes:.3g}"
        evidence = (f"{count} of {trials:.0f} {trial_label}, {confidence * 100:g} % interval "
                    f"{ci_low:.3g}-{ci_high:.3g}")
        rule = (f"fails when the interval lies below {fail_line:.3g} = {reference_label} - "
                f"{tolerance * 100:g} %; {METHOD_BINOMIAL}")
        head = f"{subject}: {metric} {measured:.3g} ({evidence}) vs {reference:.3g} {reference_label}"
        if measured >= reference or ci_low >= fail_line:
            passed = True
            message = f"{head} (ratio {ratio:.3f}, {change}; {rule})"
        elif ci_high < fail_line:
            passed = False
            message = f"{head} (ratio {ratio:.3f}, {change}; the whole interval is below the fail line; {rule})"
        else:
            passed, decided = False, False
            needed = trials_to_resolve(reference, tolerance, confidence)
            message = (f"{head}: too few {trial_label} to gate (ratio {ratio:.3f}, {change}, but the interval spans "
                       f"the fail line {fail_line:.3g} = {reference_label} - {tolerance * 100:g} %; about "
                       f"{float(f'{needed:.2g}'):.0f} {trial_label} would resolve a {tolerance * 100:g} % drop; "
                       f"{METHOD_BINOMIAL})")
    return Comparison(
        gate=gate,
        passed=passed,
        measured=float(measured),
        reference=float(reference),
        ratio=ratio,
        threshold=threshold,
        ci_low=ci_low,
        ci_high=ci_high,
        n_measured=round(counts[1]) if counts else 1,
        n_reference=1,
        method=method,
        message=message,
        decided=decided,
    )


def _first_divergence(text: str, reference: str) -> int | None:
    if text == reference:
        return None
    # When one text is a prefix of the other the first difference is where the
    # shorter one ends.
    return next(
        (index for index, (a, b) in enumerate(zip(text, reference, strict=False)) if a != b),
        min(len(text), len(reference)),
    )


def compare_outputs(
    pairs: Sequence[tuple[str, str, str]],
    *,
    min_identical_share: float,
    subject: str,
    reference_label: str = "reference",
) -> OutputComparison:
    """Compare generated texts with reference texts, given as
    (prompt_id, text, reference_text) triples.

    Passes when the share of identical texts is at least min_identical_share
    (greedy speculative decoding should reproduce the reference exactly).
    """
    if not pairs:
        raise ValueError(f"no outputs to compare for {subject}")
    if not 0 <= min_identical_share <= 1:
        raise ValueError(f"min_identical_share for {subject} must be in [0, 1], got {min_identical_share!r}")
    first_divergence: dict[str, int | None] = {}
    for prompt_id, text, reference_text in pairs:
        if prompt_id in first_divergence:
            raise ValueError(f"prompt id {prompt_id!r} appears twice in the outputs for {subject}")
        first_divergence[prompt_id] = _first_divergence(text, reference_text)
    identical = sum(1 for index in first_divergence.values() if index is None)
    share = identical / len(first_divergence)
    passed = share >= min_identical_share
    diverged = [f"{pid} at char {index}" for pid, index in first_divergence.items() if index is not None]
    shown = ", ".join(diverged[:5]) + (f" and {len(diverged) - 5} more" if len(diverged) > 5 else "")
    message = (
        f"{subject}: {identical}/{len(first_divergence)} outputs identical to {reference_label} "
        f"({share * 100:.0f} %, minimum {min_identical_share * 100:g} %)"
        + (f"; first divergence: {shown}" if diverged else "")
    )
    return OutputComparison(
        identical_share=share, first_divergence=first_divergence, passed=passed, message=message
    )
