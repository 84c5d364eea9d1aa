"""The xdist controller's part: the cross-mode gates workers deferred, decided once every worker is
done and reported as test results of their own."""

from __future__ import annotations

import pytest

from specgate.decide.outcome import Outcome, outcome_of_kind, pytest_action
from specgate.lazy import gates, verdicts
from specgate.lazy import protocol as measure
from specgate.plugin.session import SpecgateSession


def _controller_outcomes(run_session: SpecgateSession
                         ) -> dict[tuple[str, str, str, int], tuple[Outcome, dict]]:
    """Every gate result the session holds: window key -> (outcome, entry)."""
    found = {(r.gate, r.mode, r.prompt_class, r.concurrency): (r.outcome, r.to_dict())
             for r in run_session.results}
    for u in run_session.undecided:
        found[(u["gate"], u["mode"], u["prompt_class"], u["concurrency"])] = (
            Outcome(u["outcome"]) if "outcome" in u else outcome_of_kind(u["kind"]), u)
    return found


def deferred_test_reports(run_session: SpecgateSession) -> list[pytest.TestReport]:
    """One call-phase report per deferred test, with the controller's verdict, under its node id
    with "-controller" added to its parameters."""
    results = _controller_outcomes(run_session)
    run = run_session.settings
    policy = run.outcome_policy
    reports = []
    for worker in run_session.worker_reports:
        deferred = worker.get("deferred_tests", {})
        for nodeid, (gate, mode, prompt_class, concurrency) in deferred.items():
            found = results.get((gate, mode, prompt_class, concurrency))
            if found is None:  # a window is missing: already reported as NOT MEASURED
                continue
            outcome, entry = found
            declared = (gate == "backfire"
                        and run.rig.declared_backfire_for(mode, prompt_class) is not None)
            gating = run.window(mode, prompt_class, concurrency).gating_of(gate)
            action = pytest_action(outcome, policy, declared=declared, gating=gating)
            text = verdicts.pytest_text(entry, outcome, policy, declared=declared, gating=gating,
                                        where="xdist controller")
            base = nodeid.split("@")[0]  # without xdist's "@<group>" suffix
            controller_id = (f"{base[:-1]}-controller]" if base.endswith("]")
                             else f"{base}[controller]")
            path, _, name = controller_id.partition("::")
            # a skip as pytest.skip would report it: (file, line, reason)
            longrepr = {"skipped": (path, 0, f"Skipped: {text}"), "failed": text}.get(action)
            report = pytest.TestReport(nodeid=controller_id, location=(path, None, name),
                                       keywords={}, longrepr=longrepr, when="call",
                                       outcome="skipped" if action == "xfailed" else action)
            if action == "xfailed":
                report.wasxfail = text
            reports.append(report)
    return reports


def decide_deferred_gates(run_session: SpecgateSession) -> bool:
    """Decide the deferred gates on the merged windows; True when one failed."""
    merged = run_session.report_data(complete=True)
    windows = {(m["mode"], m["prompt_class"], m["concurrency"]): m for m in merged["measurements"]}
    deferred = {tuple(key) for report in run_session.worker_reports
                for key in report.get("deferred", [])}
    failed = False
    run = run_session.settings
    for mode, prompt_class, concurrency in sorted(deferred):
        mine = windows.get((mode, prompt_class, concurrency))
        ref = windows.get((run.rig.reference_mode, prompt_class, concurrency))
        if mine is None or ref is None:
            continue  # the missing window is already reported as NOT MEASURED
        m, r = measure.ClassMeasurement.from_dict(mine), measure.ClassMeasurement.from_dict(ref)
        window = run.window(mode, prompt_class, concurrency)
        for result in (gates.check_backfire(window, m, r), gates.check_lossless(window, m, r),
                       gates.check_ttft(window, m, r)):
            run_session.record(verdicts.worded(result))  # undecided: never listed as passed
            failed |= pytest_action(result.outcome, run.outcome_policy,
                                    declared=result.declared is not None,
                                    gating=result.gating) == "failed"
    run_session.deferred_failed = failed
    return failed

