"""specgate.decide.verdict: GateResult, the one form of every gate's verdict, and the dict report.json keeps
of it (read back by the report, the history and the xdist controller)."""

from __future__ import annotations

import json

import pytest

from specgate.decide.outcome import Outcome
from specgate.decide.verdict import GateResult
from specgate.report.comparisons import outcome_of

pytestmark = pytest.mark.fast

KEYS = {"gate", "mode", "prompt_class", "concurrency", "outcome", "passed", "verdict", "message", "declared",
        "details"}


def _result(outcome: Outcome, **kw) -> GateResult:
    return GateResult("backfire", "ngram", "coding", 4, outcome, "0.912x no speculation (stand-in)", **kw)


@pytest.mark.parametrize("outcome", list(Outcome), ids=lambda o: o.name)
def test_only_a_pass_has_passed_and_only_a_fail_reads_fail(outcome):
    result = _result(outcome)
    assert result.passed is (outcome is Outcome.PASS)
    assert result.verdict == ("FAIL" if outcome is Outcome.FAIL else outcome.value)


@pytest.mark.parametrize("outcome", list(Outcome), ids=lambda o: o.name)
def test_the_dict_survives_json_and_reads_back_as_its_outcome(outcome):
    details = {"ratio": 0.912, "ci_low": 0.88, "ci_high": 0.95, "n": 12, "compared": "duet", "undecided": False}
    result = _result(outcome, declared="known slow" if outcome is Outcome.DECLARED_BACKFIRE else None,
                     details=details)
    data = result.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert set(data) == KEYS  # no gating keys where the session set none
    assert (data["gate"], data["mode"], data["prompt_class"], data["concurrency"]) == ("backfire", "ngram", "coding", 4)
    assert data["outcome"] == outcome.value and Outcome(data["outcome"]) is outcome
    assert data["details"] == details and data["message"] == result.message
    assert outcome_of(data) is outcome  # as the report reads a kept entry back


def test_a_declared_backfire_keeps_its_reason_and_the_gating_is_kept_when_set():
    result = _result(Outcome.DECLARED_BACKFIRE, declared="break-even on 2 CPU cores")
    assert result.to_dict()["declared"] == "break-even on 2 CPU cores" and not result.to_dict()["passed"]
    result.gating, result.gating_reason = "report", "no stored history of this machine"
    data = result.to_dict()
    assert set(data) == KEYS | {"gating", "gating_reason"}
    assert (data["gating"], data["gating_reason"]) == ("report", "no stored history of this machine")


def test_each_result_has_its_own_details():
    first, second = _result(Outcome.PASS), _result(Outcome.PASS)
    first.details["ratio"] = 1.0
    assert second.details == {}
