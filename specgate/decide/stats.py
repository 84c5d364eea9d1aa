"""Gate decisions other than speed (acceptance, identical outputs) and the helpers the speed gates
share: robust summaries and pairing by request key. Each decision is a record of its figures;
specgate.report.verdicts words it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from os.path import commonprefix
from typing import Any

import numpy as np

from specgate.decide.paired import spread_quantile

METHOD_ONE_SIDED = "one-sided tolerance"
METHOD_BINOMIAL = "Wilson binomial interval"
METHOD_TWO_SAMPLE = "two samples: ratio of proportions, Katz log interval"


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
    """One acceptance decision: the measured figure, its reference, their ratio and interval."""

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
    decided: bool = True  # False: the evidence cannot tell a pass from a failure
    metric: str = ""  # "rate" (the overall rate), "pos2" (position 2's), "tokens per step"
    reference_label: str = "stored"
    tolerance: float = 0.0
    confidence: float | None = None
    counts: tuple[float, float] | None = None  # (successes, trials) measured
    reference_counts: tuple[float, float] | None = None
    trials: str = "drafts"  # what the counts' trials are
    dof: int | None = None  # the t interval's degrees of freedom (per request)
    why: str | None = None  # why it could not be compared ("pairs", "no steps", "nothing accepted")

    @property
    def change_pct(self) -> float:
        """Change of measured relative to reference in percent (negative: lower)."""
        return (self.ratio - 1.0) * 100.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (a ratio that cannot be formed is None)."""
        data = {**asdict(self), "change_pct": self.change_pct}
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in data.items()}


@dataclass(frozen=True)
class OutputComparison:
    """Whether generated texts match their reference texts, prompt by prompt."""

    identical_share: float
    first_divergence: dict[str, int | None]  # prompt id -> first differing character (None: same)
    passed: bool
    min_identical_share: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(samples: Sequence[float]) -> SampleSummary:
    """Median, normal-scaled MAD and IQR of a non-empty sample of finite numbers."""
    values = np.asarray(samples, dtype=float)
    if values.ndim != 1:
        raise ValueError(f"sample must be a flat sequence of numbers, got shape {values.shape}")
    if values.size == 0:
        raise ValueError("sample is empty: at least one measurement is needed")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"sample contains NaN or infinite values: {values.tolist()}")
    median = float(np.median(values))
    return SampleSummary(median, float(np.median(np.abs(values - median)) / spread_quantile(0.5)),
                         float(np.subtract(*np.percentile(values, [75, 25]))), int(values.size),
                         tuple(float(v) for v in values))


@dataclass(frozen=True)
class Matched:
    """Two keyed samples lined up for the paired ratio (:func:`match_by_key`)."""
    measured: list[float]
    reference: list[float]
    paired: bool
    one_sided: list[str]  # keys paired out because only one side has them (empty when unpaired)
    keys: list[str] | None = None  # the key of each pair (None when unpaired)


def match_by_key(measured: Mapping[str, float], reference: Mapping[str, float]) -> Matched:
    """Pair two samples on their keys (e.g. "prompt-id#repeat") when the shared keys keep at least
    two pairs and half of the smaller side; else compare them unpaired, whole."""
    common = [k for k in reference if k in measured]
    if len(common) >= 2 and 2 * len(common) >= min(len(measured), len(reference)):
        one_sided = sorted((set(measured) | set(reference)) - set(common))
        return Matched([measured[k] for k in common], [reference[k] for k in common], True,
                       one_sided, common)
    return Matched(list(measured.values()), list(reference.values()), False, [])


def _check_counts(successes: float, trials: float) -> None:
    if trials <= 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials > 0, got {successes!r} of "
                         f"{trials!r}")


def wilson_interval(successes: float, trials: float, confidence: float) -> tuple[float, float]:
    """Wilson score interval of a proportion at ``confidence`` (non-integer counts allowed)."""
    _check_counts(successes, trials)
    z = spread_quantile(confidence)
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def proportion_ratio_interval(successes: float, trials: float, ref_successes: float,
                              ref_trials: float, confidence: float) -> tuple[float, float, float]:
    """The ratio of two binomial proportions with its Katz log interval at ``confidence``; 0 or all
    successes get half a success added or taken."""
    _check_counts(successes, trials)
    _check_counts(ref_successes, ref_trials)

    def corrected(x: float, n: float) -> tuple[float, float]:
        return (x + 0.5, n + 1.0) if x < 0.5 or x > n - 0.5 else (x, n)

    (x1, n1), (x2, n2) = corrected(successes, trials), corrected(ref_successes, ref_trials)
    ratio = (successes / trials) / (ref_successes / ref_trials) if ref_successes > 0 else math.inf
    centre = math.log((x1 / n1) / (x2 / n2))
    half = spread_quantile(confidence) * math.sqrt(1 / x1 - 1 / n1 + 1 / x2 - 1 / n2)
    return ratio, math.exp(centre - half), math.exp(centre + half)


def trials_to_resolve(rate: float, tolerance: float, confidence: float) -> float:
    """About how many trials make a proportion's interval near ``rate`` narrower than a drop of
    ``tolerance``: z^2 p (1 - p) / (tolerance p)^2."""
    if tolerance <= 0 or rate <= 0:
        return math.inf
    z = spread_quantile(confidence)
    return z * z * rate * (1 - rate) / (tolerance * rate) ** 2


@dataclass(frozen=True)
class Observed:
    """One side of an acceptance comparison: figure, (successes, trials) if known, label."""

    value: float
    counts: tuple[float, float] | None = None
    label: str = "measured"


def compare_acceptance(measured: Observed, reference: Observed, *, tolerance: float, subject: str,
                       metric: str, confidence: float = 0.95, trial_label: str = "drafts"
                       ) -> Comparison:
    """One-sided check of an acceptance figure against its reference (higher never fails). Without
    counts: FAIL iff measured < reference x (1 - tolerance). With counts: FAIL when the whole
    interval (Wilson, or with reference counts the ratio of proportions against 1 - tolerance) lies
    below the fail line, PASS when none of it does, else UNDECIDED."""
    _check_acceptance_inputs(measured, reference, tolerance=tolerance, subject=subject,
                             metric=metric)
    threshold = 1.0 - tolerance
    line = reference.value * threshold  # the fail line on the figure's own scale
    common = {"gate": "acceptance", "measured": float(measured.value),
              "reference": float(reference.value), "ratio": measured.value / reference.value,
              "threshold": threshold, "n_reference": 1, "metric": metric,
              "reference_label": reference.label, "tolerance": tolerance, "trials": trial_label}
    if measured.counts is None:
        return Comparison(**common, passed=not measured.value < line, ci_low=None, ci_high=None,
                          n_measured=1, method=METHOD_ONE_SIDED)
    common.update(confidence=confidence, counts=measured.counts)
    successes, trials = measured.counts
    if reference.counts is not None and reference.counts[1] > 0 and reference.counts[0] > 0:
        (x1, n1), (x2, n2) = measured.counts, reference.counts
        ratio, ci_low, ci_high = proportion_ratio_interval(x1, n1, x2, n2, confidence)
        return Comparison(**{**common, "ratio": ratio, "n_reference": round(n2)},
                          passed=ci_low >= threshold, ci_low=ci_low, ci_high=ci_high,
                          n_measured=round(n1), method=METHOD_TWO_SAMPLE,
                          decided=ci_low >= threshold or ci_high < threshold,
                          reference_counts=reference.counts)
    ci_low, ci_high = wilson_interval(successes, trials, confidence)
    # a point above the reference is no pass while the interval reaches below the fail line
    return Comparison(**common, passed=ci_low >= line, ci_low=ci_low, ci_high=ci_high,
                      n_measured=round(trials), method=METHOD_BINOMIAL,
                      decided=ci_low >= line or ci_high < line)


METHOD_PAIRED_REQUESTS = ("accepted tokens per step counted per request, paired on the same "
                          "requests; ratio of sums with a cluster-robust (per-prompt) "
                          "delta-method t interval")


def paired_acceptance(measured: Sequence[tuple[float, float]],
                      reference: Sequence[tuple[float, float]], *, tolerance: float, subject: str,
                      confidence: float = 0.95, unit: str = "requests") -> Comparison:
    """Accepted tokens per decode step, candidate over reference, on the same clusters (requests, or
    prompts: ``unit``): the ratio of ratios of sums with a cluster-robust (delta method) t interval,
    since a request's drafts are no independent trials. FAIL when the whole interval lies below 1 -
    ``tolerance``, PASS when none of it does, else undecided."""
    if len(measured) != len(reference):
        raise ValueError(f"paired acceptance needs equal lengths, got {len(measured)} and "
                         f"{len(reference)}")
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance for the acceptance of {subject} must be in [0, 1), got "
                         f"{tolerance!r}")
    m = np.asarray(measured, dtype=float).reshape(-1, 2)
    r = np.asarray(reference, dtype=float).reshape(-1, 2)
    if not all(np.all(np.isfinite(x) & (x >= 0)) for x in (m, r)):
        raise ValueError("per-request acceptance counts must be finite and non-negative: "
                         f"{m.tolist()} vs {r.tolist()}")
    threshold = 1.0 - tolerance
    n = len(m)
    a_c, s_c, a_r, s_r = m[:, 0].sum(), m[:, 1].sum(), r[:, 0].sum(), r[:, 1].sum()
    common = {"gate": "acceptance", "threshold": threshold, "n_measured": n, "n_reference": n,
              "trials": unit, "dof": n - 1, "method": METHOD_PAIRED_REQUESTS,
              "metric": "tokens per step", "reference_label": "reference side",
              "tolerance": tolerance, "confidence": confidence, "counts": (float(a_c), float(s_c)),
              "reference_counts": (float(a_r), float(s_r))}
    rate_c, rate_r = (a_c / s_c if s_c > 0 else 0.0), (a_r / s_r if s_r > 0 else 0.0)
    if n < 2 or s_c <= 0 or s_r <= 0 or a_r <= 0:
        why = "pairs" if n < 2 else "no steps" if min(s_c, s_r) <= 0 else "nothing accepted"
        return Comparison(**common, passed=False, measured=rate_c, reference=rate_r, ratio=math.nan,
                          ci_low=None, ci_high=None, decided=False, why=why)
    ratio = rate_c / rate_r
    # d ratio = ratio * (dA_c / A_c - dS_c / S_c - dA_r / A_r + dS_r / S_r), A_c's term undivided
    influence = (m[:, 0] * s_r / (s_c * a_r) - ratio * m[:, 1] / s_c
                 - ratio * r[:, 0] / a_r + ratio * r[:, 1] / s_r)
    se = math.sqrt(n / (n - 1) * float(np.sum(influence ** 2)))
    q = spread_quantile(confidence, n - 1)
    ci_low, ci_high = max(0.0, ratio - q * se), ratio + q * se
    return Comparison(**common, passed=ci_low >= threshold, measured=rate_c, reference=rate_r,
                      ratio=ratio, ci_low=ci_low, ci_high=ci_high,
                      decided=ci_low >= threshold or ci_high < threshold)


def _check_acceptance_inputs(measured: Observed, reference: Observed, *, tolerance: float,
                             subject: str, metric: str) -> None:
    for name, value in ((measured.label, measured.value), (reference.label, reference.value)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} {metric} for {subject} must be a finite non-negative number, "
                             f"got {value!r}")
    if reference.value == 0:
        raise ValueError(f"{reference.label} {metric} for {subject} is 0: there is nothing to "
                         "compare against")
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance for {metric} of {subject} must be in [0, 1), "
                         f"got {tolerance!r}")


def compare_outputs(pairs: Sequence[tuple[str, str, str]], *, min_identical_share: float,
                    subject: str) -> OutputComparison:
    """Compare (prompt_id, text, reference_text) triples: passes when the share of identical texts
    is at least min_identical_share."""
    if not pairs:
        raise ValueError(f"no outputs to compare for {subject}")
    if not 0 <= min_identical_share <= 1:
        raise ValueError(f"min_identical_share for {subject} must be in [0, 1], got "
                         f"{min_identical_share!r}")
    first_divergence: dict[str, int | None] = {}
    for prompt_id, text, reference_text in pairs:
        if prompt_id in first_divergence:
            raise ValueError(f"prompt id {prompt_id!r} appears twice in the outputs for {subject}")
        common = commonprefix([text, reference_text])  # noqa: RUF071 (characters, not paths)
        first_divergence[prompt_id] = None if text == reference_text else len(common)
    identical = sum(1 for index in first_divergence.values() if index is None)
    share = identical / len(first_divergence)
    return OutputComparison(share, first_divergence, share >= min_identical_share,
                            min_identical_share)
