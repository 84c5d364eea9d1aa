"""The follow-up policy: whether a duet window's first look gets its follow-up rounds (more pairs, a
second look with repeated intervals) because the gate deciding on its pairs could still change its
words."""

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
    """Why a window's first look gets its follow-up rounds (specgate.report.verdicts.follow_up_text
    words it): ``why`` is "undecided" or "not slower" (after the first look's pairs), "margin" (its
    interval reaches into the equivalence ``margin``), "strongest pair" (one pair moves the ratio)
    or "first look" (a TTFT or acceptance gate undecided); ``result`` the gate's result at the first
    look."""

    why: str
    result: GateResult
    margin: float | None = None


def follow_up_reason(settings: WindowSettings, m: ClassMeasurement,
                     selected: Collection[str] | None = None) -> FollowUp | None:
    """Why a duet window's first look should get its follow-up rounds, or None: its speed gate could
    still change its words (:func:`speed_follow_up_reason`), or its TTFT gate, or an A/B's
    acceptance gate, is undecided with an interval that more pairs narrow (a TTFT pass also needs
    specgate.decide.gates.TTFT_MIN_PAIRS_TO_PASS pairs). ``selected``: the gates the session decides
    on this window (None: all); a gate not selected takes no rounds."""
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
    """Why a duet window's first look should get its follow-up rounds, or None: the gate that
    decides on its pairs (an A/B's throughput; backfire against the live no-speculation partner) is
    undecided, or, for backfire, "faster" or "slower" with an interval and estimate inside the
    equivalence margin (:func:`reaches_into_margin`): narrower, that interval may read "equal within
    ±x %" (or, from "slower", "not slower"), and a mode at break-even would otherwise be "faster" or
    "slower" in one session and "equal" in the next as the server starts move its ratio by a percent
    or two (cpu explanatory: "faster" in some fresh-clone runs, 0.975 (0.956-0.995) "slower" in one
    on another VM, "equal" in others). A backfire window with a pair standing out (one hiccup
    request moving the ratio by 1 % or more, :func:`specgate.decide.paired.strongest_pair`) follows
    up too, so its ratio is not one request's. "Equal", or "slower" and "faster" beyond the margin,
    are otherwise settled: more pairs would not change the words."""
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
        # The strata estimate weighs each request by 1 / (prompts x its prompt's repeats): more
        # repeats of every prompt dilute the pair that stands out (one hiccup request on the
        # GPU-bound rig: 1.7 % at 12 pairs).
        return FollowUp("strongest pair", result)
    return None


def reaches_into_margin(details: dict, margin: float) -> bool:
    """A 'faster' whose interval and estimate both lie below 1 + ``margin``, or a 'slower' whose
    interval and estimate both lie above 1 - ``margin``: with more pairs it may read "equal within
    ±x %". One whose estimate is beyond the margin (math on the cpu tier, ~1.08-1.15x; a real 10 %
    backfire) would keep its word, so it is settled however far its interval reaches."""
    if details.get("verdict") == "faster":
        return details["ci_low"] < 1.0 + margin and details["ratio"] < 1.0 + margin
    if details.get("verdict") == "slower":
        return details["ci_high"] > 1.0 - margin and details["ratio"] > 1.0 - margin
    return False
