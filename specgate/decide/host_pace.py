"""The host's pace: a comparison with stored figures stands only when this window's host ran at the
stored windows' pace (specgate's CPU canary, specgate.measure.telemetry.canary_reader); otherwise it
would measure the hosts as well as the build, and it is held back (undecided, "other host pace")."""

from __future__ import annotations

import numpy as np

from specgate.decide.outcome import Outcome
from specgate.decide.verdict import GateResult
from specgate.measure.protocol import ClassMeasurement
from specgate.store.baselines import BaselineEntry


def host_canary_us(m: ClassMeasurement) -> float | None:
    """The host's pace during window ``m``: the fastest reading of specgate's CPU canary there
    (microseconds; specgate.measure.telemetry.canary_reader), or None where no canary ran. The
    fastest, not the median: on the 2-vCPU cpu tier the servers' own work delays the canary by 37-52
    us (median) from window to window of one run, while its fastest reading stays at 31.8-32.8
    us."""
    window = (m.extra.get("telemetry") or {}).get("window") or {}
    values = window.get("cpu_canary_us")
    return float(values[0]) if values else None


HOST_PACE = "other host pace"  # the undecided kind of a comparison held back by the host's pace


def at_stored_host_pace(result: GateResult, m: ClassMeasurement, baseline: BaselineEntry,
                         tolerance: float | None) -> GateResult:
    """``result`` (a comparison with stored figures) as it stands when this window's host ran at the
    stored windows' pace (their canary's median, within ± ``tolerance``); otherwise undecided,
    keeping what the comparison gave (``decided_as``): it would measure the two hosts as well as the
    build."""
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
