"""The stored form of a window: what a storing run writes for one window, as one start of a history
(where it goes: :func:`specgate.store.baselines.place_start`)."""

from __future__ import annotations

from typing import Any

from specgate.decide.host_pace import host_canary_us
from specgate.decide.matching import match_samples
from specgate.decide.paired import paired_ratio, repeated_coverage
from specgate.decide.stats import summarize
from specgate.measure.protocol import ClassMeasurement
from specgate.store.baselines import (
    LEVEL_HISTORY,
    AcceptanceEntry,
    BaselineEntry,
    Build,
    Fingerprint,
    RatioEntry,
    StoredStart,
)


def baseline_entry(m: ClassMeasurement, fingerprint: Fingerprint,
                   previous: BaselineEntry | None = None) -> BaselineEntry:
    """The stored form of window ``m``: one start (level, ratio to a no-speculation partner, host
    pace, where and on what) with its samples. ``previous``: the same machine's and build's history
    it extends (the last LEVEL_HISTORY starts kept)."""
    summary = summarize(m.decode_tokens_per_s)
    a = m.acceptance
    acceptance = None if a is None else AcceptanceEntry(
        mean_acceptance_length=a.mean_acceptance_length, acceptance_rate=a.acceptance_rate,
        per_position_rates=list(a.per_position_rates), drafts=a.drafts,
        draft_tokens=a.draft_tokens, accepted_per_position=list(a.accepted_per_position))
    keys = [k for k, r in zip(m.sample_keys, m.records) if r.decode_tokens_per_s is not None]
    ratio = None
    if m.partner is not None and not m.ab:  # a duet with the no-speculation mode
        timed = m.partner.timed_samples
        samples = match_samples(m, list(timed), list(timed.values()))
        if samples.paired and samples.measured:  # the ratio the gates show (two modes: strata)
            share = m.first_look_share
            r = paired_ratio(samples.measured, samples.reference, threshold=1.0,
                             strata=samples.prompts,
                             confidence=repeated_coverage(0.95, share) if share else 0.95)
            ratio = RatioEntry(reference_mode=m.partner.mode, ratio=r.ratio, ci_low=r.ci_low,
                               ci_high=r.ci_high, n=r.n)
    window = fingerprint.for_window(m.prompt_class, m.concurrency)
    start = StoredStart(level=summary.median, ratio=ratio.ratio if ratio else None,
                        canary_us=host_canary_us(m), machine=window.machine, build=Build.of(window),
                        suite_commit=window.commit, date=window.date, sitting=window.sitting)
    earlier = []
    if previous is not None:  # a ratio history is one reference mode's
        before = previous.ratio_to_reference
        same_reference = ratio is None or (before is not None
                                           and before.reference_mode == ratio.reference_mode)
        earlier = previous.starts if same_reference else [s.model_copy(update={"ratio": None})
                                                          for s in previous.starts]
    return BaselineEntry(decode_tokens_per_s=list(summary.samples), sample_keys=keys,
                         median=summary.median, mad=summary.mad, n=summary.n, acceptance=acceptance,
                         ratio_to_reference=ratio,
                         starts=[*earlier, start][-LEVEL_HISTORY:], fingerprint=window)


def entries_from_report(report: dict[str, Any], *, modes: list[str] | None = None
                        ) -> dict[tuple[str, str, str, int], BaselineEntry]:
    """One start's entry per window of a saved ``report.json`` (of ``modes``, if given), with its
    server's fingerprint: keeps an interrupted storing run's windows, or promotes a chosen run's
    figures."""
    entries = {}
    fingerprints = report.get("fingerprints", {})
    for data in report.get("measurements", []):
        if modes and data["mode"] not in modes:
            continue
        m = ClassMeasurement.from_dict(data)
        if not m.decode_tokens_per_s:
            continue  # no request produced a decode rate: nothing to store
        fingerprint = Fingerprint.model_validate(fingerprints.get(m.mode) or {}, strict=False)
        entries[(m.rig, m.mode, m.prompt_class, m.concurrency)] = baseline_entry(m, fingerprint)
    return entries
