"""report.json as specgate wrote it before the no-speculation mode was renamed (baseline -> no_spec,
issue 16): the recorded reports with the mode's old name put back, for the tests that old reports
still render and can still be adopted."""

from __future__ import annotations

from typing import Any

OLD = {"no_spec": "baseline", "no_spec_pp2": "baseline_pp2"}


def with_old_mode_name(report: Any, key: str | None = None) -> Any:
    """Every place a report names a mode: rig.modes/fingerprints/servers keys, "mode" and
    "reference_mode" values, request ids and the gates' messages (which start with the mode)."""
    if isinstance(report, dict):
        return {(OLD.get(k, k) if key in ("modes", "fingerprints", "servers") else k): with_old_mode_name(v, k)
                for k, v in report.items()}
    if isinstance(report, list):
        return [with_old_mode_name(v, key) for v in report]
    if isinstance(report, str):
        if key in ("mode", "reference_mode"):
            return OLD.get(report, report)
        head, sep, rest = report.partition("/" if key == "request_id" else " on ")
        if key in ("request_id", "message") and sep and head in OLD:
            return OLD[head] + sep + rest
    return report
