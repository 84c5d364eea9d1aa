"""The follow-up policy: whether a duet window's first look gets its follow-up rounds (more pairs, a
second look with repeated intervals) because the gate deciding on its pairs could still change its words."""

from __future__ import annotations

from specgate.config import Rig
from specgate.gates import ab_throughput, check_backfire
from specgate.measure import ClassMeasurement


def follow_up_reason(rig: Rig, m: ClassMeasurement) -> str | None:
    """Why a duet window's first look should get its follow-up rounds, or None: the gate that
    decides on its pairs (an A/B's throughput; backfire against the live no-speculation partner)
    is undecided, or, for backfire, "faster" or "slower" with an interval and estimate inside the
    equivalence margin (:func:`reaches_into_margin`): narrower, that interval may read "equal within
    ±x %" (or, from "slower", "not slower"), and a mode at break-even would otherwise be "faster" or
    "slower" in one session and "equal" in the next as the server starts move its ratio by a percent
    or two (cpu explanatory: "faster" in some fresh-clone runs, 0.975 (0.956-0.995) "slower" in one
    on another VM, "equal" in others).
    A backfire window with a pair standing out (one hiccup request
    moving the ratio by 1 % or more, :func:`specgate.paired.strongest_pair`) follows up too, so its
    ratio is not one request's. "Equal", or "slower" and "faster" beyond the margin, are otherwise
    settled: more pairs would not change the words."""
    partner = m.partner
    if partner is None:
        return None
    backfire = partner.side != "reference"
    if not backfire:
        result = ab_throughput(rig, m)
    elif partner.mode == rig.reference_mode and rig.mode(m.mode).is_speculative:
        result = check_backfire(rig, m, partner)
    else:
        return None
    d = result.details
    if d.get("ci_low") is None:
        return None
    interval = (f"{d['ratio']:.3f}x ({d['confidence'] * 100:.1f} % CI {d['ci_low']:.3f}-{d['ci_high']:.3f}, "
                f"threshold {d['threshold']:.2f})")
    if d.get("verdict") == "undecided" or (backfire and d.get("verdict") == "not slower"):
        return f"the {result.gate} gate is {d['verdict']} after {d['n']} pairs: {interval}"
    margin = rig.gates.for_class(m.prompt_class).equivalence_margin
    if backfire and reaches_into_margin(d, margin):
        return (f"the {result.gate} gate's '{d['verdict']}' after {d['n']} pairs reaches into the equivalence "
                f"margin (±{margin * 100:g} %): {interval}")
    if backfire and (pair := d.get("strongest_pair")):
        # The strata estimate weighs each request by 1 / (prompts x its prompt's repeats): more
        # repeats of every prompt dilute the pair that stands out (one hiccup request on the GPU-bound
        # rig: 1.7 % at 12 pairs).
        return f"{interval} after {d['n']} pairs: {pair['text']}"
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
