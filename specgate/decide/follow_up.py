"""The follow-up policy: whether a duet window's first look gets its follow-up rounds (more pairs, a
second look with repeated intervals) because a gate could still change its words."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from specgate.decide.gates import ab_acceptance, ab_throughput, check_backfire, check_ttft
from specgate.decide.outcome import Outcome
from specgate.decide.settings import WindowSettings
from specgate.decide.verdict import GateResult
from specgate.measure.protocol import ClassMeasurement


@dataclass(frozen=True)
class FollowUp:
    """Why a window's first look gets its follow-up rounds: ``why`` ("undecided", "not slower",
    "margin", "strongest pair" or "first look") and ``result``, the gate's first-look result."""

    why: str
    result: GateResult
    margin: float | None = None


def follow_up_reason(settings: WindowSettings, m: ClassMeasurement,
                     selected: Collection[str] | None = None) -> FollowUp | None:
    """Why a duet window's first look should get its follow-up rounds, or None: its speed gate could
    still change its words, or its TTFT or an A/B's acceptance gate is undecided (more pairs narrow
    it). ``selected``: the gates decided on this window (None: all)."""
    reason = speed_follow_up_reason(settings, m)
    partner = m.partner
    if reason is not None or partner is None:
        return reason
    checks = [check_ttft(settings, m, partner)] if selected is None or "ttft" in selected else []
    if (m.ab and settings.speculative and m.acceptance is not None
            and (selected is None or "acceptance" in selected)):
        checks.append(ab_acceptance(settings, m))
    for result in checks:
        d = result.details
        if result.outcome is Outcome.UNDECIDED and (d.get("ci_low") is not None or d.get("checks")
                                                    or d.get("per_request")):
            return FollowUp("first look", result)
    return None


def speed_follow_up_reason(settings: WindowSettings, m: ClassMeasurement) -> FollowUp | None:
    """Why the gate that decides on a duet's pairs (an A/B's throughput, backfire against the live
    partner) wants follow-up rounds, or None: it is undecided, or a backfire "faster" or "slower"
    :func:`reaches_into_margin` (else a mode at break-even flips between sessions), or a pair stands
    out. Otherwise more pairs would not change the words."""
    partner = m.partner
    if partner is None:
        return None
    backfire = not m.ab
    if not backfire:
        result = ab_throughput(settings, m)
    elif partner.mode == settings.reference_mode and settings.speculative:
        result = check_backfire(settings, m, partner)
    else:
        return None
    d = result.details
    if d.get("ci_low") is None:
        return None
    if d.get("verdict") == "undecided" or (backfire and d.get("verdict") == "not slower"):
        return FollowUp(d["verdict"], result)
    margin = settings.thresholds.equivalence_margin
    if backfire and reaches_into_margin(d, margin):
        return FollowUp("margin", result, margin)
    if backfire and d.get("strongest_pair"):
        return FollowUp("strongest pair", result)  # more repeats dilute the pair that stands out
    return None


def reaches_into_margin(details: dict, margin: float) -> bool:
    """A 'faster' or 'slower' whose interval and estimate both lie within 1 ± ``margin``: more
    pairs may read it "equal within ±x %"; an estimate beyond the margin is settled."""
    if details.get("verdict") == "faster":
        return details["ci_low"] < 1.0 + margin and details["ratio"] < 1.0 + margin
    if details.get("verdict") == "slower":
        return details["ci_high"] > 1.0 - margin and details["ratio"] > 1.0 - margin
    return False
