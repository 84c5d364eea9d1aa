"""The host's pace: a comparison with stored figures stands only when this window's host ran at the
stored windows' pace (specgate.measure.telemetry.canary_reader); else it is held back (undecided,
"other host pace")."""

from __future__ import annotations

import numpy as np

from specgate.decide.outcome import Outcome
from specgate.decide.verdict import GateResult
from specgate.measure.protocol import ClassMeasurement
from specgate.store.baselines import BaselineEntry


def host_canary_us(m: ClassMeasurement) -> float | None:
    """The fastest reading of specgate's CPU canary during window ``m`` (us), or None where none
    ran; the fastest, since the servers' own work delays the median."""
    window = (m.extra.get("telemetry") or {}).get("window") or {}
    values = window.get("cpu_canary_us")
    return float(values[0]) if values else None


HOST_PACE = "other host pace"  # the undecided kind of a comparison held back by the host's pace


def at_stored_host_pace(result: GateResult, m: ClassMeasurement, baseline: BaselineEntry,
                         tolerance: float | None) -> GateResult:
    """``result`` as it stands when this window's host ran at the stored windows' pace (their
    canary's median ± ``tolerance``); else undecided, keeping ``decided_as``."""
    now = host_canary_us(m)
    if tolerance is None or now is None or not baseline.host_canary_us:
        return result
    stored = float(np.median(baseline.host_canary_us))
    factor = now / stored
    result.details["host_pace"] = {"canary_us": now, "stored_canary_us": stored, "factor": factor,
                                   "stored_windows": len(baseline.host_canary_us),
                                   "tolerance": tolerance}
    if abs(factor - 1) <= tolerance:
        return result
    details = {**result.details, "verdict": "undecided", "undecided": True,
               "undecided_kind": HOST_PACE, "decided_as": result.details.get("verdict")}
    return GateResult(result.gate, result.mode, result.prompt_class, result.concurrency,
                      Outcome.OTHER_MACHINE, "", details=details)
