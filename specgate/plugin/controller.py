"""The xdist controller's part: the cross-mode gates (backfire, lossless) that workers deferred,
decided once every worker is done, and reported as test results of their own.
"""

from __future__ import annotations

import pytest

from specgate.session import SpecgateSession


def deferred_test_reports(specgate: SpecgateSession) -> list[pytest.TestReport]:
    """One call-phase report per test a worker deferred, with the controller's verdict, under the
    test's node id with "-controller" added to its parameters (the worker reported it as skipped)."""
    decided = {(r.gate, r.mode, r.prompt_class, r.concurrency): r for r in specgate.results}
    reports = []
    for worker in specgate.worker_reports:
        for nodeid, (gate, mode, prompt_class, concurrency) in worker.get("deferred_tests", {}).items():
            result = decided.get((gate, mode, prompt_class, concurrency))
            if result is None:  # a window is missing: already reported as NOT MEASURED
                continue
            if result.passed:
                outcome, longrepr = "passed", None
            elif result.declared:  # as the worker would have: an expected failure
                outcome, longrepr = "skipped", None
            else:
                outcome, longrepr = "failed", f"{gate} gate (decided on the xdist controller): {result.message}"
            base = nodeid.split("@")[0]  # without xdist's "@<group>" suffix
            controller_id = f"{base[:-1]}-controller]" if base.endswith("]") else f"{base}[controller]"
            path, _, name = controller_id.partition("::")
            report = pytest.TestReport(nodeid=controller_id, location=(path, None, name), keywords={},
                                       outcome=outcome, longrepr=longrepr, when="call")
            if result.declared and not result.passed:
                report.wasxfail = f"declared backfire: {result.declared}"
            reports.append(report)
    return reports


def decide_deferred_gates(specgate: SpecgateSession) -> bool:
    """xdist controller: the backfire and lossless gates workers deferred, on the merged windows.
    Returns True when one of them failed (the run then exits as failed)."""
    from specgate.gates import check_backfire, check_lossless
    from specgate.measure import ClassMeasurement

    merged = specgate.report_data(complete=True)
    windows = {(m["mode"], m["prompt_class"], m["concurrency"]): m for m in merged["measurements"]}
    deferred = {tuple(key) for report in specgate.worker_reports for key in report.get("deferred", [])}
    failed = False
    for mode, prompt_class, concurrency in sorted(deferred):
        mine = windows.get((mode, prompt_class, concurrency))
        ref = windows.get((specgate.rig.reference_mode, prompt_class, concurrency))
        if mine is None or ref is None:
            continue  # the missing window is already reported as NOT MEASURED
        m, r = ClassMeasurement.from_dict(mine), ClassMeasurement.from_dict(ref)
        for result in (check_backfire(specgate.rig, m, r), check_lossless(specgate.rig, m, r)):
            specgate.record(result)
            failed |= not result.passed and not result.declared
    specgate.deferred_failed = failed
    return failed

