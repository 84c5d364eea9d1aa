"""The five gates, each a decision on one window: throughput (decode tok/s against the stored
baseline or a live partner, on the paired ratio: docs/statistics.md), acceptance (only lower fails),
backfire (a speculative mode against no speculation in the same session; a declared backfire is
reported, not failed), lossless (greedy outputs against no speculation) and ttft (against a live
reference, only longer fails). Each returns a :class:`GateResult`; specgate.report words it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from specgate.config.arrangement import window_arrangement
from specgate.decide.entry import baseline_entry
from specgate.decide.history import MIN_STARTS as HISTORY_MIN_STARTS
from specgate.decide.history import StartHistory, change_points
from specgate.decide.host_pace import at_stored_host_pace
from specgate.decide.matching import Samples, match_samples
from specgate.decide.outcome import Outcome
from specgate.decide.paired import (
    PREDICTION_METHOD,
    STRONGEST_PAIR_SHOWN,
    Line,
    interval_ratio,
    paired_ratio,
    repeated_coverage,
    spread_quantile,
    start_spread,
    strongest_pair,
)
from specgate.decide.settings import WindowSettings
from specgate.decide.stats import (
    Observed,
    compare_acceptance,
    compare_outputs,
    match_by_key,
    paired_acceptance,
    summarize,
)
from specgate.decide.verdict import GateResult
from specgate.measure.per_request import agreement, stream_acceptance, vllm_acceptance
from specgate.measure.protocol import ClassMeasurement
from specgate.store.baselines import BaselineEntry, BaselineFile, Fingerprint, RatioEntry, lookup


def window_confidence(confidence: float, m: ClassMeasurement) -> float:
    """The gates' coverage on ``m``: per look on a window that may be looked at twice."""
    share = m.first_look_share
    return repeated_coverage(confidence, share) if share else confidence


@dataclass(frozen=True)
class Rule:
    """The line a ratio is held against: threshold, coverage before looks, equivalence margin."""

    threshold: float
    confidence: float
    margin: float


def _looks(m: ClassMeasurement) -> dict[str, Any] | None:
    """A two-look window's first look share, second look and skipped follow-up; else None."""
    if not m.first_look_share:
        return None
    return {"share": m.first_look_share, "second": bool(m.follow_up),
            "skipped": m.follow_up_skipped}


def _result(gate: str, m: ClassMeasurement, outcome: Outcome, rule: str, /,
            **details: Any) -> GateResult:
    """A gate's result: outcome, deciding rule (``details["rule"]``) and its facts."""
    return GateResult(gate, m.mode, m.prompt_class, m.concurrency, outcome, "",
                      details={"rule": rule, **details})


def _outcome(verdict: str, passed: bool) -> Outcome:
    return Outcome.UNDECIDED if verdict == "undecided" else Outcome.PASS if passed else Outcome.FAIL


@dataclass(frozen=True)
class Comparison:
    """One paired comparison: the two sides' samples and how to read them. ``two_modes``: prompts as
    strata; ``shift`` divides every pair's ratio (against a stored one); ``extra_log_spread`` widens
    the interval for what the pairs cannot see; ``head``: the FAIL's subject."""

    window: ClassMeasurement
    gate: str
    samples: Samples
    rule: Rule
    reference_label: str
    compared: Any
    shift: float = 1.0
    extra_log_spread: float = 0.0
    head: str | None = None
    two_modes: bool = False


def ratio_result(c: Comparison) -> GateResult:
    """A gate decided on paired log ratios (specgate.decide.paired): one statistic."""
    m = c.window
    measured, reference = c.samples.measured, c.samples.reference
    strata = c.samples.prompts if c.two_modes else None
    facts = {"compared": c.compared, "looks": _looks(m), "left_out": c.samples.left_out,
             "head": c.head}
    if not c.samples.paired or len(measured) != len(reference):
        return _result(c.gate, m, Outcome.UNDECIDED, "unpaired", verdict="undecided",
                       undecided=True, n_measured=len(measured), n_reference=len(reference),
                       **facts)
    result = paired_ratio(measured, reference, threshold=c.rule.threshold,
                          confidence=window_confidence(c.rule.confidence, m),
                          equivalence_margin=c.rule.margin, shift=c.shift,
                          extra_log_spread=c.extra_log_spread, strata=strata)
    details = {**result.to_dict(), **facts, "reference_label": c.reference_label,
               "undecided": result.verdict == "undecided"}
    keys = c.samples.keys
    if strata is not None and keys is not None and len(keys) == len(measured) and (
            pair := _strongest_pair(measured, reference, strata, keys, shift=c.shift)):
        details["strongest_pair"] = pair
    return _result(c.gate, m, _outcome(result.verdict, result.passed), "paired", **details)


def _strongest_pair(measured: list[float], reference: list[float], strata: list[str],
                    keys: list[str], *, shift: float) -> dict[str, Any] | None:
    """The pair that alone moves a strata estimate by STRONGEST_PAIR_SHOWN or more, with its
    prompt's other pairs (medians) and the ratio without it; else None."""
    found = strongest_pair(measured, reference, strata, shift=shift)
    if found is None or abs(found.shift) < STRONGEST_PAIR_SHOWN:
        return None
    i = found.index
    others = [j for j, s in enumerate(strata) if s == strata[i] and j != i]
    return {"key": keys[i], "measured": measured[i], "reference": reference[i],
            "prompt_others_measured": float(np.median([measured[j] for j in others])),
            "prompt_others_reference": float(np.median([reference[j] for j in others])),
            "ratio_without": found.ratio_without, "shift_pct": found.shift * 100,
            "outlier_factor": found.outlier_factor}


def _side(m: ClassMeasurement) -> str | None:
    """The side a window was on, where it matters ("reference", "partner"); None for a subject."""
    side = m.ab_side or m.role
    return side if side != "subject" else None


def timing_mismatch(m: ClassMeasurement, tolerance: float) -> dict[str, Any] | None:
    """Why ``m``'s client timings are not measurements (the client's decode rate off vLLM's own by
    more than ``tolerance``: a CPU-starved client reads chunks late, in bursts), else None."""
    client, server = m.client_decode_tokens_per_s, m.server_decode_tokens_per_s
    if not client or not server or abs(client / server - 1) <= tolerance:
        return None
    return {"mode": m.mode, "side": _side(m), "client": client, "server": server,
            "tolerance": tolerance}


def _untimed_window(gate: str, settings: WindowSettings, m: ClassMeasurement,
                    *others: ClassMeasurement | None) -> GateResult | None:
    """The undecided result of a speed gate on a wrongly timed window, else None."""
    tolerance = settings.thresholds.client_server_tolerance
    if tolerance is None:
        return None
    timings = [found for w in (m, *others) if w is not None
               and (found := timing_mismatch(w, tolerance))]
    if not timings:
        return None
    return _result(gate, m, Outcome.UNDECIDED, "untimed", verdict="undecided", undecided=True,
                   timings=timings)


def _stored_ratio_spread(stored: RatioEntry, start_noise: float,
                         confidence: float) -> tuple[float, dict[str, Any]]:
    """How far to widen a duet ratio compared with one stored ratio: the stored window's own
    interval, or the start noise of four server starts when wider."""
    own = 0.0
    if stored.ci_low and stored.ci_high:
        own = float(np.log(stored.ci_high) - np.log(stored.ci_low)) / 2
    if not start_noise:
        return own, {"spread_basis": "unknown"}
    between = start_spread(start_noise, starts=4, confidence=confidence)
    return max(own, between), {"spread_basis": "start noise" if between > own else "own",
                               "start_noise": start_noise, "quantile": spread_quantile(confidence)}


def _history(history: StartHistory, threshold: float, confidence: float) -> dict[str, Any]:
    """A stored history as the report reads it (StartHistory)."""
    return {"levels": list(history.levels),
            "sittings": list(history.sittings) if history.sittings else None,
            "threshold": threshold, "confidence": confidence}


def _steps(baseline: BaselineEntry) -> dict[str, Any] | None:
    """A stored history's levels where a change-point shows in them, else None."""
    levels, sittings = baseline.level_history, [s.sitting for s in baseline.starts]
    return {"levels": levels, "sittings": sittings} if change_points(levels, sittings) else None


def _partner_samples(m: ClassMeasurement, partner: ClassMeasurement, label: str) -> Samples:
    timed = partner.timed_samples
    return match_samples(m, list(timed), list(timed.values()), partner.untimed, ref_label=label)


def check_throughput(settings: WindowSettings, m: ClassMeasurement,
                     baseline: BaselineEntry) -> GateResult:
    """Decode speed, the strongest way the window allows: an A/B's paired ratio to the reference
    side; a no-speculation duet's ratio against the stored ratio; else the level against the stored
    history's. With 3 or more stored starts the history's prediction interval alone decides; with
    fewer, the stored samples are paired, widened by the rig's start noise."""
    gates = settings.thresholds
    confidence = window_confidence(gates.confidence, m)
    partner = m.partner
    if m.ab:
        return ab_throughput(settings, m)
    if (untimed := _untimed_window("throughput", settings, m, partner)) is not None:
        return untimed
    stored_ratio = baseline.ratio_to_reference
    stored = {"baseline": baseline.describe(), "steps": _steps(baseline)}
    duet_ratio = partner is not None and stored_ratio is not None \
        and stored_ratio.reference_mode == partner.mode
    tolerance = settings.tolerance_for(duet_ratio=duet_ratio)
    threshold = 1 - tolerance
    rule = Rule(threshold, gates.confidence, gates.equivalence_margin)

    def paced(result: GateResult) -> GateResult:
        """``result`` held to the stored host pace, marked where it catches only a true ratio below
        1 - 2 x its tolerance (docs/statistics.md, "What each gate can catch")."""
        detectable = result.details.get("detectable")
        if detectable is not None and detectable < 1 - 2 * tolerance:
            result.details.update(catches_nothing_useful=True, tolerance=tolerance)
        return at_stored_host_pace(result, m, baseline, gates.host_pace_tolerance)

    if duet_ratio:
        samples = _partner_samples(m, partner, partner.mode)
        ratios = StartHistory.of(baseline, ratios=True)
        duet = {"arrangement": window_arrangement(settings.arrangement, m, "duet"),
                "partner": partner.mode, **stored}
        if ratios.usable and len(samples.measured) == len(samples.reference) and samples.measured:
            now = paired_ratio(samples.measured, samples.reference, threshold=1.0,
                               strata=samples.prompts, confidence=confidence)
            compared = {"how": "ratio history", "now": now.ratio,
                        "history": _history(ratios, threshold, confidence), **duet}
            result = _against_history(m, math.log(now.ratio / ratios.center), ratios, rule,
                                      label="stored ratios", compared=compared,
                                      left_out=samples.left_out)
            result.details.update(reference_mode=partner.mode, center=ratios.center)
            return paced(result)
        shift = stored_ratio.ratio
        spread, basis = _stored_ratio_spread(stored_ratio, gates.start_noise, confidence)
        result = ratio_result(Comparison(
            m, "throughput", samples, rule, reference_label="stored ratio",
            compared={"how": "stored ratio", **basis, **duet}, shift=shift,
            extra_log_spread=spread, two_modes=True))
        result.details.update(reference_mode=partner.mode, shift=shift)
        return paced(result)
    history = StartHistory.of(baseline)
    if history.usable and m.decode_tokens_per_s:
        level = summarize(m.decode_tokens_per_s).median
        compared = {"how": "level history",
                    "history": _history(history, threshold, confidence), **stored}
        result = _against_history(m, math.log(level / history.center), history, rule,
                                  label="stored starts", compared=compared)
        result.details.update(center=history.center, level=level)
        return paced(result)
    samples = match_samples(m, baseline.sample_keys, baseline.decode_tokens_per_s)
    spread = start_spread(gates.start_noise, confidence=confidence)
    compared = {"how": "stored samples", "starts": history.starts, "min_starts": HISTORY_MIN_STARTS,
                "start_noise": gates.start_noise, "steps": stored["steps"]}
    return paced(ratio_result(Comparison(
        m, "throughput", samples, rule, reference_label="stored level", compared=compared,
        extra_log_spread=float(spread))))


def _against_history(m: ClassMeasurement, estimate: float, history: StartHistory, rule: Rule, *,
                     label: str, compared: dict[str, Any],
                     left_out: dict[str, Any] | None = None) -> GateResult:
    """A new start's log ratio to a stored history's mean, in its prediction interval."""
    confidence = window_confidence(rule.confidence, m)
    result = interval_ratio(estimate, history.half_width(confidence), n=history.starts,
                            unit="stored starts", dof=history.dof,
                            line=Line(rule.threshold, rule.margin), confidence=confidence,
                            method=PREDICTION_METHOD)
    return _result("throughput", m, _outcome(result.verdict, result.passed), "paired",
                   **result.to_dict(), compared=compared, looks=_looks(m), left_out=left_out,
                   head="history", reference_label=label, history_starts=history.starts,
                   history_spread=history.log_sd, history_between_spread=history.components[1],
                   history_sittings=len(history.groups) if history.recorded else None,
                   undecided=result.verdict == "undecided")


def ab_throughput(settings: WindowSettings, m: ClassMeasurement) -> GateResult:
    """An A/B's throughput: the paired ratio to the reference side, against 1 - ab_tolerance."""
    gates = settings.thresholds
    partner = m.partner
    assert m.ab and partner is not None, "an A/B window has the reference side as partner"
    if (untimed := _untimed_window("throughput", settings, m, partner)) is not None:
        return untimed
    samples = _partner_samples(m, partner, "reference side")
    start = start_pair(gates.start_pair_spread, m, window_confidence(gates.confidence, m),
                       dof=gates.start_pair_dof)
    result = ratio_result(Comparison(
        m, "throughput", samples, Rule(1 - settings.ab_tolerance, gates.confidence,
                                       gates.equivalence_margin),
        reference_label="the reference side",
        compared=window_arrangement(settings.arrangement, m, "A/B duet, requests alternated"),
        extra_log_spread=start["widened_log"]))
    result.details["start_pair"] = start
    return result


def start_pair(relative_sd: float, m: ClassMeasurement, confidence: float, *, dof: int | None = None
               ) -> dict[str, Any]:
    """An A/B window's start order and the log widening for its servers' start offset."""
    order = m.extra.get("start_order") or {}
    quantile = spread_quantile(confidence, dof)
    widened = quantile * math.log1p(relative_sd) if relative_sd else 0.0
    return {"first": order.get("first"), "seed": order.get("seed"), "spread": relative_sd,
            "dof": dof, "quantile": quantile, "widened_log": widened}


def check_acceptance(settings: WindowSettings, m: ClassMeasurement, baseline: BaselineEntry, *,
                     reference_label: str = "stored") -> GateResult:
    """Acceptance against the stored figures (or an A/B's reference side): the overall rate and
    every position's, each a ratio of proportions at the confidence split over the checks
    (Bonferroni). FAIL when any interval lies below 1 - tolerance, PASS when none reaches it, else
    UNDECIDED."""
    gates = settings.thresholds
    if m.acceptance is None:
        return _result("acceptance", m, Outcome.FAIL, "no counters")
    if baseline.acceptance is None:
        return _result("acceptance", m, Outcome.FAIL, "nothing to compare",
                       reference_label=reference_label)
    stored, now = baseline.acceptance, m.acceptance
    stored_counts = bool(stored.drafts)
    def reference(value: float, accepted: float) -> Observed:
        return Observed(value, (accepted, stored.drafts) if stored_counts else None,
                        reference_label)

    rate = now.acceptance_rate
    specs = [dict(measured=Observed(rate, (rate * now.drafts, now.drafts)),
                  reference=reference(stored.acceptance_rate,
                                      stored.acceptance_rate * (stored.drafts or 0)),
                  trial_label="drafts (as trials)", metric="rate")]
    stored_accepted = stored.accepted_per_position or []
    for pos, (accepted, then) in enumerate(zip(now.accepted_per_position,
                                               stored.per_position_rates)):
        if then > 0:
            then_accepted = (stored_accepted[pos] if pos < len(stored_accepted)
                             else then * (stored.drafts or 0))
            specs.append(dict(measured=Observed(accepted / now.drafts, (accepted, now.drafts)),
                              reference=reference(then, then_accepted), metric=f"pos{pos + 1}"))
    family = window_confidence(gates.confidence, m)
    each = 1.0 - (1.0 - family) / len(specs)
    checks = [compare_acceptance(**spec, tolerance=gates.acceptance_tolerance, subject=m.mode,
                                 confidence=each) for spec in specs]
    failed = any(c.decided and not c.passed for c in checks)
    outcome = (Outcome.FAIL if failed else Outcome.UNDECIDED
               if not all(c.decided for c in checks) else Outcome.PASS)
    return _result("acceptance", m, outcome, "acceptance", checks=[c.to_dict() for c in checks],
                   family_confidence=family, check_confidence=each,
                   undecided=outcome is Outcome.UNDECIDED, reference_label=reference_label,
                   stored_counts=stored_counts,
                   lengths=[now.mean_acceptance_length, stored.mean_acceptance_length])


def request_acceptances(m: ClassMeasurement, *, vllm: bool = False) -> dict[str, tuple[int, int]]:
    """Each request's (accepted draft tokens, steps), from its stream or (``vllm``) vLLM."""
    counts = {}
    for key, record in zip(m.sample_keys, m.records):
        steps = len(record.chunk_times) + record.empty_chunks
        found = (vllm_acceptance(record) if vllm
                 else stream_acceptance(record.completion_tokens, steps))
        if found is not None and found[1] > 0:
            counts[key] = found
    return counts


# streams may count this many more accepted tokens than vLLM per step, without vLLM's steps
STREAM_EXCESS_PER_STEP = 0.02
STREAM_MERGED_SHARE = 0.01  # with vLLM's steps: the share the streams may lack


def stream_count_mismatch(m: ClassMeasurement, counts: dict[str, tuple[int, int]]
                          ) -> dict[str, Any] | None:
    """How ``m``'s stream counts of accepted tokens and steps differ from vLLM's, else None. A late
    reader merges steps (one step fewer, one token more each); a request cut at max_tokens counts up
    to one draft fewer. With vLLM's step count, more than STREAM_MERGED_SHARE merged is flagged;
    without, the tokens alone are bounded."""
    if m.acceptance is None or not counts:
        return None
    counted = sum(a for a, _ in counts.values())
    steps = sum(s for _, s in counts.values())
    server, drafts = m.acceptance.accepted_tokens, m.acceptance.drafts
    per_draft = m.acceptance.draft_tokens / drafts if drafts else 0.0
    facts = {"mode": m.mode, "side": _side(m), "counted": counted, "steps": steps, "server": server,
             "drafts": drafts, "per_draft": per_draft}
    vllm_steps = m.server_decode_steps
    if vllm_steps is not None:
        seen = sum(max(0, len(r.chunk_times) + r.empty_chunks - 1) for r in m.records)
        merged, allowed = round(vllm_steps) - seen, max(1, int(STREAM_MERGED_SHARE * seen))
        if merged > allowed:
            return {**facts, "seen": seen, "vllm_steps": vllm_steps, "merged": merged,
                    "allowed": allowed}
        high, slack = server + max(0, merged), max(0, -merged)
    else:
        slack = STREAM_EXCESS_PER_STEP * steps + 2
        high = server + slack
    low = server - per_draft * len(m.records) - slack
    if low <= counted <= high:
        return None
    return {**facts, "more": counted > high,
            "allowed": high - server if counted > high else server - low}


def ab_acceptance(settings: WindowSettings, m: ClassMeasurement) -> GateResult:
    """An A/B's acceptance: accepted tokens per step against the reference side's, clustered by
    prompt; where the streams disagree with vLLM's counters, the window counters decide
    (:func:`check_acceptance`)."""
    partner = m.partner
    assert m.ab and partner is not None, "an A/B window has the reference side as partner"
    gates = settings.thresholds
    if m.acceptance is None:
        return _result("acceptance", m, Outcome.FAIL, "no counters")
    vllm = all(w.records and all(vllm_acceptance(r) is not None for r in w.records)
               for w in (m, partner))  # vLLM counted every request on both sides
    ours, theirs = request_acceptances(m, vllm=vllm), request_acceptances(partner, vllm=vllm)
    mismatch = [] if vllm else [found for w, c in ((m, ours), (partner, theirs))
                                if (found := stream_count_mismatch(w, c))]
    by_prompt: dict[str, np.ndarray] = {}  # prompt -> (ours, theirs) x (accepted, steps)
    for key in (k for k in theirs if k in ours):
        by_prompt.setdefault(key.rsplit("#", 1)[0], np.zeros((2, 2)))[:] += (ours[key], theirs[key])
    if mismatch or len(by_prompt) < 2:
        result = check_acceptance(settings, m, baseline_entry(partner, Fingerprint()),
                                  reference_label="reference side")
        result.details.update(per_request=None,
                              per_request_unused={"mismatch": mismatch, "prompts": len(by_prompt)})
        return result
    confidence = window_confidence(gates.confidence, m)
    comparison = paired_acceptance([tuple(c[0]) for c in by_prompt.values()],
                                   [tuple(c[1]) for c in by_prompt.values()],
                                   tolerance=gates.acceptance_tolerance, subject=m.mode,
                                   confidence=confidence, unit="prompts")
    outcome = (Outcome.UNDECIDED if not comparison.decided else Outcome.PASS if comparison.passed
               else Outcome.FAIL)
    now, then = m.acceptance, partner.acceptance
    agreed = [a.rows for w in (m, partner) if vllm and (a := agreement(w.sample_keys, w.records))]
    counters = None if then is None else [now.acceptance_rate, then.acceptance_rate,
                                          now.mean_acceptance_length, then.mean_acceptance_length]
    return _result("acceptance", m, outcome, "acceptance per request", **comparison.to_dict(),
                   per_request=True, compared=window_arrangement(
                       settings.arrangement, m, "A/B duet, requests alternated"),
                   looks=_looks(m), per_request_source="vllm" if vllm else "stream",
                   agreement=agreed, counters=counters,
                   verdict="undecided" if outcome is Outcome.UNDECIDED else outcome.value,
                   undecided=outcome is Outcome.UNDECIDED)


StartHistories = tuple[StartHistory, StartHistory]  # (this mode's, no speculation's) stored starts


def stored_start_histories(store: BaselineFile, settings: WindowSettings, m: ClassMeasurement,
                           machine: str | None) -> StartHistories | None:
    """The stored start histories of ``m``'s mode and no speculation, if both spread."""
    found = [lookup(store, settings.rig, mode, m.prompt_class, m.concurrency, machine=machine)
             for mode in (m.mode, settings.reference_mode)]
    mine, theirs = (StartHistory.of(h) for h in found)
    return (mine, theirs) if mine.usable and theirs.usable else None


def check_backfire(settings: WindowSettings, m: ClassMeasurement, reference: ClassMeasurement,
                   starts: StartHistories | None = None) -> GateResult:
    """``m`` against the no-speculation window ``reference`` (its duet partner, or a window of its
    own: then start offsets are allowed for from ``starts`` or the start noise)."""
    if (untimed := _untimed_window("backfire", settings, m, reference)) is not None:
        return untimed
    samples = _partner_samples(m, reference, "no speculation")
    return backfire_decision(settings, m, samples, duet=m.partner is reference, starts=starts)


def _compared_and_spread(settings: WindowSettings, m: ClassMeasurement, *, ab: bool, duet: bool,
                         starts: StartHistories | None = None) -> tuple[Any, float]:
    """How a window compared its sides, and the start noise added when they were not live at once
    (from the two stored histories, or the rig's start noise)."""
    gates = settings.thresholds
    if ab:
        return window_arrangement(settings.arrangement, m, "A/B duet, requests alternated"), 0.0
    if duet:
        return window_arrangement(settings.arrangement, m,
                                  "duet with no speculation, requests alternated"), 0.0
    confidence = window_confidence(gates.confidence, m)
    if starts is not None:
        mine, theirs = starts
        dof = min(mine.dof, theirs.dof)
        sd = math.hypot(mine.prediction_sd, theirs.prediction_sd)
        spread = spread_quantile(confidence, dof) * sd
        return {"how": "sequential", "histories": [[h.starts, h.log_sd] for h in starts],
                "dof": dof, "added": spread}, spread
    spread = start_spread(gates.start_noise, confidence=confidence)
    return {"how": "sequential", "start_noise": gates.start_noise}, spread


def bare_window(settings: WindowSettings) -> ClassMeasurement:
    """A window of ``settings`` with no requests: the subject of a replayed gate."""
    return ClassMeasurement(rig=settings.rig, mode=settings.mode,
                            prompt_class=settings.prompt_class,
                            concurrency=settings.concurrency, records=[], acceptance=None,
                            server_decode_tokens_per_s=None, server_metric_source=None, wall_s=0.0)


def backfire_decision(settings: WindowSettings, m: ClassMeasurement, samples: Samples, *,
                      duet: bool = False, starts: StartHistories | None = None) -> GateResult:
    """The backfire gate on ``samples``: FAIL when the ratio's upper bound < min_speedup."""
    gates = settings.thresholds
    compared, spread = _compared_and_spread(settings, m, ab=False, duet=duet, starts=starts)
    result = ratio_result(Comparison(
        m, "backfire", samples, Rule(gates.min_speedup, gates.confidence, gates.equivalence_margin),
        reference_label="no speculation", compared=compared, extra_log_spread=spread,
        head="backfire", two_modes=True))
    declared = settings.declared_backfire
    if declared is not None:
        result.declared = declared.reason
        if result.outcome is Outcome.FAIL:
            result.outcome = Outcome.DECLARED_BACKFIRE
    return result


TTFT_MIN_PAIRS_TO_PASS = 12  # below this a TTFT pass is undecided (follow-up rounds add pairs)
TTFT_VERDICTS = {"slower": "longer", "faster": "shorter", "not slower": "not longer",
                 "equal": "equal", "undecided": "undecided"}


def check_ttft(settings: WindowSettings, m: ClassMeasurement,
               reference: ClassMeasurement) -> GateResult:
    """Time to first token against ``reference`` (an A/B's reference side, else no speculation),
    decided on 1 / TTFT as the speed gates are and reported as the TTFT ratio: FAIL when the
    interval lies above 1 + ttft_tolerance, PASS when none of it does, else undecided."""
    gates = settings.thresholds
    ab = reference.ab_side == "reference"
    label = "the reference side" if ab else "no speculation"
    ours, theirs = ({k: r.ttft_s for k, r in zip(w.sample_keys, w.records)
                     if r.ttft_s and r.ttft_s > 0} for w in (m, reference))
    matched = match_by_key(ours, theirs)
    compared, spread = _compared_and_spread(settings, m, ab=ab, duet=m.partner is reference)
    facts = {"compared": compared, "looks": _looks(m), "reference_label": label}
    if not matched.paired or len(matched.measured) < 2:
        return _result("ttft", m, Outcome.UNDECIDED, "ttft unpaired", verdict="undecided",
                       undecided=True, shared=len(set(ours) & set(theirs)), n_measured=len(ours),
                       n_reference=len(theirs), **facts)
    limit = 1.0 + gates.ttft_tolerance
    strata = None if ab else [k.rsplit("#", 1)[0] for k in matched.keys or []]
    speed = paired_ratio([1 / t for t in matched.measured], [1 / t for t in matched.reference],
                         threshold=1 / limit, confidence=window_confidence(gates.confidence, m),
                         equivalence_margin=gates.equivalence_margin, extra_log_spread=spread,
                         strata=strata)
    outcome = _outcome(speed.verdict, speed.passed)
    # at 6 pairs the signed-rank interval is the range of the pairs: one stall decides it
    withheld = outcome is Outcome.PASS and speed.n < TTFT_MIN_PAIRS_TO_PASS
    if withheld:
        outcome = Outcome.UNDECIDED
    return _result("ttft", m, outcome, "ttft", ratio=1 / speed.ratio,
                   ci_low=1 / speed.ci_high if speed.ci_high else None,
                   ci_high=1 / speed.ci_low if speed.ci_low else None, limit=limit,
                   tolerance=gates.ttft_tolerance, confidence=speed.confidence, n=speed.n,
                   method=speed.method, prompts=speed.prompts, dof=speed.dof,
                   verdict=("undecided" if withheld
                            else TTFT_VERDICTS.get(speed.verdict, speed.verdict)),
                   median_ttft_ms=float(np.median(matched.measured)) * 1000,
                   reference_median_ttft_ms=float(np.median(matched.reference)) * 1000,
                   withheld=TTFT_MIN_PAIRS_TO_PASS if withheld else None,
                   undecided=outcome is Outcome.UNDECIDED, **facts)


def check_lossless(settings: WindowSettings, m: ClassMeasurement,
                   reference: ClassMeasurement) -> GateResult:
    ref_outputs = reference.outputs
    pairs = [(key, text, ref_outputs[key]) for key, text in m.outputs.items() if key in ref_outputs]
    result = compare_outputs(pairs, min_identical_share=settings.thresholds.min_identical_share,
                             subject=m.mode)
    return _result("lossless", m, Outcome.PASS if result.passed else Outcome.FAIL, "outputs",
                   **result.to_dict())
