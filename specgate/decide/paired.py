"""The paired-ratio statistic every cross-side comparison decides on (docs/statistics.md).

Per request key a duet gives one pair, d = ln(measured / reference). Within one mode: the
Hodges-Lehmann estimate with the Wilcoxon signed-rank interval (robust to a stalled request);
between two modes each prompt is a stratum (:func:`stratified_log_ratio`). Verdict: :func:`_decide`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cache
from statistics import NormalDist
from typing import Any

import numpy as np

from specgate.config.defaults import MIN_PAIRS

METHOD = "Hodges-Lehmann paired ratio, Wilcoxon interval"
EXACT_UP_TO = 60  # exact null distribution below this many pairs, normal approximation above
# Resolution: a window catches a true ratio r 95 % of the time when
# r < threshold * exp(-(1 + p / q) * upper_spread), q and p its two- and one-sided quantiles.
POWER = 0.95

Verdict = str  # "slower" (fails) | "faster" | "equal" | "not slower" | "undecided"


@dataclass(frozen=True)
class Line:
    """What a ratio is held against: the threshold it fails below and the "equal within" margin."""

    threshold: float
    equivalence_margin: float


@dataclass(frozen=True)
class PairedRatio:
    """One paired comparison; ``ratio`` is exp(HL estimate), the number shown everywhere."""

    ratio: float
    ci_low: float | None
    ci_high: float | None
    confidence: float  # the interval's exact two-sided coverage (the signed-rank steps)
    n: int
    threshold: float
    passed: bool
    verdict: Verdict
    equal_within: float | None  # x of "equal within ±x" when the interval lies in 1 ± margin
    detectable: float | None  # the gate catches a true ratio at or below this 95 % of the time
    method: str = METHOD
    quantile: float | None = None  # two-sided (z at its coverage, or t)
    quantile_dof: int | None = None  # None: normal (z)
    unit: str = "pairs"  # pairs of requests, or stored starts
    prompts: int | None = None  # the strata statistic's (None: Hodges-Lehmann)
    dof: int | None = None

    @property
    def change_pct(self) -> float:
        return (self.ratio - 1.0) * 100.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "change_pct": self.change_pct}


@cache
def _signed_rank_cdf(n: int) -> np.ndarray:
    """P(T <= t) for t = 0 .. n(n+1)/2 under the null: counts of subsets of {1..n} by sum."""
    counts = np.zeros(n * (n + 1) // 2 + 1, dtype=float)
    counts[0] = 1.0
    for k in range(1, n + 1):
        counts[k:] = counts[k:] + counts[:-k].copy()
    return np.cumsum(counts) / 2.0**n


def _interval_rank(n: int, confidence: float) -> tuple[int, float]:
    """K such that [W_(K), W_(M-K+1)] of the M sorted Walsh averages covers at least ``confidence``,
    and that coverage; K = 0 with too few pairs."""
    alpha_half = (1.0 - confidence) / 2.0
    if n <= EXACT_UP_TO:
        cdf = _signed_rank_cdf(n)
        k = int(np.searchsorted(cdf, alpha_half, side="right"))
        return k, (1.0 - 2.0 * float(cdf[k - 1])) if k >= 1 else 0.0
    m = n * (n + 1) / 2.0
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
    k = math.floor(m / 2.0 - NormalDist().inv_cdf(1.0 - alpha_half) * sd)
    return max(k, 1), confidence


def walsh_averages(d: np.ndarray) -> np.ndarray:
    i, j = np.triu_indices(d.size)
    return np.sort((d[i] + d[j]) / 2.0)


def paired_ratio(measured: Sequence[float], reference: Sequence[float], *, threshold: float,
                 confidence: float = 0.95, equivalence_margin: float = 0.05, shift: float = 1.0,
                 extra_log_spread: float = 0.0, strata: Sequence[str] | None = None) -> PairedRatio:
    """Compare two paired samples of a higher-is-better quantity (item i of both sides on one
    request key). ``shift`` divides every pair's ratio (against a stored ratio); ``strata`` (each
    pair's prompt) decides with :func:`stratified_log_ratio`."""
    m = np.asarray(measured, dtype=float)
    r = np.asarray(reference, dtype=float)
    if m.shape != r.shape or m.ndim != 1:
        raise ValueError(f"paired samples need equal flat lengths, got {m.shape} and {r.shape}")
    if m.size == 0:
        raise ValueError("no pairs to compare")
    if not (np.all(np.isfinite(m)) and np.all(np.isfinite(r)) and np.all(m > 0) and np.all(r > 0)):
        raise ValueError("paired samples must be finite and positive: "
                         f"{m.tolist()} vs {r.tolist()}")
    if not (math.isfinite(threshold) and threshold > 0):
        raise ValueError(f"threshold must be a positive number, got {threshold!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence!r}")
    if not (math.isfinite(shift) and shift > 0):
        raise ValueError(f"shift must be a positive number, got {shift!r}")
    d = np.log(m / r) - math.log(shift)
    rule = {"threshold": threshold, "confidence": confidence,
            "equivalence_margin": equivalence_margin, "extra_log_spread": extra_log_spread}
    if strata is not None:
        return stratified_log_ratio(d, strata, **rule)
    return paired_log_ratio(d, **rule)


def paired_log_ratio(d: np.ndarray, *, threshold: float, confidence: float = 0.95,
                     equivalence_margin: float = 0.05,
                     extra_log_spread: float = 0.0) -> PairedRatio:
    """The decision on per-pair log ratios ``d``; ``extra_log_spread`` widens both ends (log units)
    for what the pairs cannot see (start levels, a stored ratio's interval)."""
    d = np.asarray(d, dtype=float)
    walsh = walsh_averages(d)
    estimate = float(np.median(walsh))
    ratio = math.exp(estimate)
    k, coverage = _interval_rank(d.size, confidence) if d.size >= MIN_PAIRS else (0, 0.0)
    if k < 1:
        return PairedRatio(ratio, None, None, 0.0, int(d.size), threshold, True, "undecided", None,
                           None)
    return _decide(estimate, walsh[k - 1] - extra_log_spread,
                   walsh[walsh.size - k] + extra_log_spread, n=int(d.size), coverage=coverage,
                   line=Line(threshold, equivalence_margin), method=METHOD)


STRATA_METHOD = "prompts as strata: mean of per-prompt log ratios, t interval from the repeats"
MIN_STRATA_DOF = 3  # fewer df (repeats): Hodges-Lehmann instead


def _strata(d: np.ndarray, strata: Sequence[str]
            ) -> tuple[dict[str, list[int]], dict[str, float], float] | None:
    """Each stratum's pair indices (in order of first appearance) and mean log ratio, and the mean
    of those means (the estimate); None below MIN_STRATA_DOF degrees of freedom."""
    groups: dict[str, list[int]] = {}
    for i, stratum in enumerate(strata):
        groups.setdefault(stratum, []).append(i)
    if sum(len(v) - 1 for v in groups.values()) < MIN_STRATA_DOF:
        return None
    means = {name: float(np.mean(d[idx])) for name, idx in groups.items()}
    return groups, means, float(np.mean(list(means.values())))


def stratified_log_ratio(d: Sequence[float], strata: Sequence[str], *, threshold: float,
                         confidence: float = 0.95, equivalence_margin: float = 0.05,
                         extra_log_spread: float = 0.0) -> PairedRatio:
    """The decision on log ratios ``d`` grouped by ``strata`` (prompts): the mean over prompts of
    each prompt's mean, with a Student's t interval on the repeats' scatter around their prompt's
    mean. Below MIN_STRATA_DOF degrees of freedom, :func:`paired_log_ratio` decides."""
    d = np.asarray(d, dtype=float)
    if len(strata) != d.size:
        raise ValueError(f"one stratum per pair: {d.size} pairs, {len(strata)} strata")
    found = _strata(d, strata)
    if found is None:
        return paired_log_ratio(d, threshold=threshold, confidence=confidence,
                                equivalence_margin=equivalence_margin,
                                extra_log_spread=extra_log_spread)
    groups, means, estimate = found
    dof = sum(len(v) - 1 for v in groups.values())
    scatter = math.sqrt(sum((float(d[i]) - means[name]) ** 2 for name, idx in groups.items()
                            for i in idx) / dof)
    standard_error = scatter * math.sqrt(sum(1.0 / len(v) for v in groups.values())) / len(groups)
    half = spread_quantile(confidence, dof) * standard_error
    return _decide(estimate, estimate - half - extra_log_spread, estimate + half + extra_log_spread,
                   n=int(d.size), coverage=confidence, line=Line(threshold, equivalence_margin),
                   method=STRATA_METHOD, quantile_dof=dof, prompts=len(groups), dof=dof)


@dataclass(frozen=True)
class StrongestPair:
    """A pair standing out of a stratified window, and how far it moves the estimate."""

    index: int  # into the pairs as given
    ratio_without: float  # the estimate without that pair, in the units of the one shown
    shift: float  # the estimate with the pair / without it - 1
    outlier_factor: float  # its residual over the window's median residual


STRONGEST_PAIR_SHOWN = 0.01  # named in the message when it moves the ratio by 1 % or more ...
STRONGEST_PAIR_OUTLIER = 6.0  # ... and its residual is this many times the window's median one


def strongest_pair(measured: Sequence[float], reference: Sequence[float], strata: Sequence[str], *,
                   shift: float = 1.0) -> StrongestPair | None:
    """The outlying pair that moves :func:`stratified_log_ratio`'s estimate most, or None where none
    stands out (residual above STRONGEST_PAIR_OUTLIER x the median one) or the strata statistic does
    not decide. At two repeats the pair named is the one holding the slower request."""
    m = np.log(np.asarray(measured, dtype=float))
    r = np.log(np.asarray(reference, dtype=float))
    d = m - r - math.log(shift)
    found = _strata(d, strata)
    if found is None:
        return None
    groups, means, estimate = found

    def others(values: np.ndarray, i: int, idx: list[int]) -> float:
        return (float(values[idx].sum()) - values[i]) / (len(idx) - 1)

    residual = {i: d[i] - others(d, i, idx) for idx in groups.values() if len(idx) > 1 for i in idx}
    typical = float(np.median(np.abs(list(residual.values()))))
    best: StrongestPair | None = None
    for name, idx in groups.items():
        if len(idx) < 2:
            continue
        stands_out = [i for i in idx if abs(residual[i]) > STRONGEST_PAIR_OUTLIER * typical]
        if not stands_out:
            continue
        i = max(stands_out, key=lambda j: max(others(m, j, idx) - m[j], others(r, j, idx) - r[j]))
        without = estimate + (others(d, i, idx) - means[name]) / len(groups)
        moved = math.exp(estimate - without) - 1.0
        if best is None or abs(moved) > abs(best.shift):
            factor = abs(residual[i]) / typical if typical > 0 else math.inf
            best = StrongestPair(i, math.exp(without), moved, factor)
    return best


def _decide(estimate: float, lo_log: float, hi_log: float, *, n: int, coverage: float, line: Line,
            method: str, **fields: Any) -> PairedRatio:
    """The verdict from a log estimate and interval at ``coverage``, its quantiles t at
    ``fields["quantile_dof"]`` (none: normal); ``fields``: the PairedRatio's remaining fields."""
    ratio = math.exp(estimate)
    lo, hi = math.exp(lo_log), math.exp(hi_log)
    upper_spread = max(math.log(hi) - estimate, 0.0)
    quantile_dof = fields.get("quantile_dof")
    quantile = spread_quantile(coverage, quantile_dof)
    power_quantile = spread_quantile(2 * POWER - 1, quantile_dof)
    detectable = line.threshold * math.exp(-(1.0 + power_quantile / quantile) * upper_spread)
    within = max(1.0 - lo, hi - 1.0)
    if hi < line.threshold:
        verdict, passed = "slower", False
    elif lo < line.threshold:
        verdict, passed = "undecided", True
    elif within <= line.equivalence_margin:
        verdict, passed = "equal", True
    elif lo > max(line.threshold, 1.0):
        verdict, passed = "faster", True
    else:
        verdict, passed = "not slower", True
    return PairedRatio(ratio, lo, hi, coverage, n, line.threshold, passed, verdict,
                       within if verdict == "equal" else None, detectable, method, quantile,
                       **fields)


PREDICTION_METHOD = ("a new start against its history: t(n-1) x s x sqrt(1 + 1/n), s the stored "
                     "starts' spread")


def interval_ratio(estimate: float, half_width: float, *, n: int, unit: str, dof: int | None,
                   line: Line, confidence: float, method: str) -> PairedRatio:
    """A log ``estimate`` with a symmetric ``half_width`` interval built elsewhere, decided by
    :func:`_decide`'s rules (t at ``dof``, None: normal); ``n`` counts ``unit``."""
    return _decide(estimate, estimate - half_width, estimate + half_width, n=n,
                   coverage=confidence, line=line, method=method, quantile_dof=dof, unit=unit)


@cache
def repeated_coverage(confidence: float, first_share: float) -> float:
    """Each look's coverage in a two-look window so that both intervals hold at once with
    ``confidence`` (Pocock's repeated confidence intervals): c solves P(|Z1| < c, |Z2| < c) =
    confidence with correlation sqrt(first_share); each look uses 2 Phi(c) - 1."""
    from scipy import integrate, optimize
    from scipy.stats import norm

    if not 0 < first_share < 1:
        raise ValueError(f"first_share must be between 0 and 1, got {first_share!r}")
    rho = math.sqrt(first_share)
    s = math.sqrt(1 - rho * rho)

    def both_within(c: float) -> float:
        inner = lambda z: norm.pdf(z) * (  # noqa: E731
            norm.cdf((c - rho * z) / s) - norm.cdf((-c - rho * z) / s))
        return integrate.quad(inner, -c, c, epsabs=1e-12)[0] - confidence

    c = optimize.brentq(both_within, norm.ppf(0.5 + confidence / 2),
                        norm.ppf(1 - (1 - confidence) / 4) + 0.1, xtol=1e-10)
    return float(2 * norm.cdf(c) - 1)


def start_spread(relative_sd: float, starts: int = 2, *, confidence: float = 0.95,
                 dof: int | None = None) -> float:
    """How far (log units) to widen an interval for ``starts`` server starts of relative sd
    ``relative_sd``: q x sqrt(starts) x ln(1 + sd), q normal, or t at ``dof`` for an sd estimated
    from stored runs."""
    return spread_quantile(confidence, dof) * math.sqrt(starts) * math.log1p(relative_sd)


@cache
def spread_quantile(confidence: float, dof: int | None = None) -> float:
    """The two-sided quantile :func:`start_spread` scales by: t at ``dof``, else normal."""
    if dof is None:
        return NormalDist().inv_cdf(0.5 + confidence / 2)
    from scipy.stats import t as student_t

    return float(student_t.ppf(0.5 + confidence / 2, dof))
