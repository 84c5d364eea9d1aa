"""specgate.decide.outcome: the one mapping of a gate's outcome to pytest's (pytest_action), the kinds of
gates that decided nothing, and the parsing of the per-outcome and per-gate settings. The gating's
parts (family, gating_lines on a run) are tested in test_gating.py."""

from __future__ import annotations

import pytest

from specgate.decide.host_pace import HOST_PACE
from specgate.decide.outcome import (
    GATES,
    KIND_OUTCOMES,
    NOT_DECIDED,
    NOT_STORED,
    OUTCOME_KINDS,
    STORING,
    Outcome,
    outcome_of_kind,
    parse_assignments,
    parse_gating,
    parse_policy,
    pytest_action,
)
from specgate.report.verdicts import gating_lines, pytest_text

pytestmark = pytest.mark.fast

ALL_SKIP = dict.fromkeys(("undecided", "not_stored", "other_machine", "not_run"), "skip")
ALL_FAIL = dict.fromkeys(("undecided", "not_stored", "other_machine", "not_run"), "fail")
POLICIES = {"default": None, "skip": ALL_SKIP, "fail": ALL_FAIL}
GATINGS = (None, "gate", "report")
ACTION = {"P": "passed", "F": "failed", "S": "skipped", "X": "xfailed"}
# pytest's action per outcome: under the default policy (not stored fails, the rest skip), every
# outcome skipped, every outcome failed; in each, with no gating, gating "gate", gating "report"
TABLE = {
    #                          default  skip  fail
    Outcome.PASS:              "PPP    PPP   PPP",
    Outcome.FAIL:              "FFS    FFS   FFS",
    Outcome.DECLARED_BACKFIRE: "XXX    XXX   XXX",
    Outcome.UNDECIDED:         "SFS    SFS   FFS",
    Outcome.NOT_STORED:        "FFS    SSS   FFS",
    Outcome.OTHER_MACHINE:     "SSS    SSS   FFS",
    Outcome.NOT_RUN:           "SSS    SSS   FFS",
}


@pytest.mark.parametrize("outcome", list(Outcome), ids=lambda o: o.name)
def test_pytest_action_over_every_policy_and_gating(outcome):
    cells = TABLE[outcome].split()
    for (name, policy), row in zip(POLICIES.items(), cells):
        for gating, cell in zip(GATINGS, row):
            assert pytest_action(outcome, policy, gating=gating) == ACTION[cell], (name, gating)


@pytest.mark.parametrize("outcome", list(Outcome), ids=lambda o: o.name)
def test_a_declared_backfire_that_decided_nothing_is_skipped_whatever_the_policy_and_gating(outcome):
    for policy in POLICIES.values():
        for gating in GATINGS:
            action = pytest_action(outcome, policy, declared=True, gating=gating)
            if outcome.decided:  # decided, the declaration changes nothing here (the gate made it DECLARED_BACKFIRE)
                assert action == pytest_action(outcome, policy, gating=gating)
            else:
                assert action == "skipped"


def test_the_outcomes_that_decide_nothing_are_the_policys_keys():
    assert {o.policy_key for o in NOT_DECIDED} == set(ALL_FAIL)
    assert {o for o in Outcome if o.decided} == {Outcome.PASS, Outcome.FAIL, Outcome.DECLARED_BACKFIRE}
    assert Outcome.FAIL.tag == "FAILED" and Outcome.NOT_STORED.tag == "NOT STORED"


@pytest.mark.parametrize("kind", sorted(KIND_OUTCOMES))
def test_every_kind_names_an_outcome_that_decided_nothing(kind):
    outcome = outcome_of_kind(kind)
    assert outcome is KIND_OUTCOMES[kind] and not outcome.decided


def test_the_kinds_map_to_what_they_say():
    by_outcome = {o: {k for k, v in KIND_OUTCOMES.items() if v is o} for o in NOT_DECIDED}
    assert {NOT_STORED, STORING, "no baseline", "baseline update"} == by_outcome[Outcome.NOT_STORED]
    assert {"other machine", HOST_PACE} == by_outcome[Outcome.OTHER_MACHINE]
    assert by_outcome[Outcome.NOT_RUN] == {"not run"}
    assert {"undecided", "inconclusive", "too few drafts", "fingerprint"} == by_outcome[Outcome.UNDECIDED]


def test_an_unknown_kind_is_undecided_and_an_outcomes_own_kind_reads_back_as_it():
    assert outcome_of_kind("a kind from a later version") is Outcome.UNDECIDED
    assert set(OUTCOME_KINDS) == set(NOT_DECIDED)
    for outcome, kind in OUTCOME_KINDS.items():
        assert outcome_of_kind(kind) is outcome


def test_the_policy_is_one_value_for_every_outcome_or_one_per_outcome():
    assert parse_policy("fail") == ALL_FAIL and parse_policy(" skip ") == ALL_SKIP
    assert parse_policy("not-stored=skip, undecided=fail") == {"not_stored": "skip", "undecided": "fail"}
    assert parse_policy("other machine=fail") == {"other_machine": "fail"}


@pytest.mark.parametrize("text", ["undecided=maybe", "undecide=fail", "undecided"])
def test_a_bad_policy_names_the_bad_part(text):
    with pytest.raises(ValueError) as caught:
        parse_policy(f"not_stored=skip, {text}")
    message = str(caught.value)
    assert message.startswith(f"{text!r}:") and "not_stored=skip" not in message
    assert "OUTCOME=skip|fail" in message and "undecided, not_stored, other_machine, not_run" in message


@pytest.mark.parametrize("text", ["", " , ", ","])
def test_an_empty_setting_is_refused(text):
    with pytest.raises(ValueError, match="empty outcome setting"):
        parse_policy(text)
    with pytest.raises(ValueError, match="empty gate setting"):
        parse_gating(text)


def test_the_assignments_keep_their_keys_as_written_unless_told_to_normalize():
    keys = ("speed", "not_stored")
    assert parse_assignments("speed=on", keys, ("on", "off"), what="KEY") == {"speed": "on"}
    with pytest.raises(ValueError, match="'not-stored=on'"):
        parse_assignments("not-stored=on", keys, ("on", "off"), what="KEY")
    assert parse_assignments("not-stored=on", keys, ("on", "off"), what="KEY", normalize=True) == {"not_stored": "on"}
    assert parse_gating("report") == dict.fromkeys(GATES, "report")


def test_the_test_reports_line_names_what_decided_the_run():
    # a gate that decided nothing and failed the run by the policy names the policy's key
    entry = {"gate": "backfire", "mode": "ngram", "prompt_class": "coding", "concurrency": 1, "message": "m"}
    assert pytest_text(entry, Outcome.NOT_STORED).endswith(" [fails the run: not_stored = fail]")
    assert "fails the run" not in pytest_text(entry, Outcome.OTHER_MACHINE)
    passed = {**entry, "message": "1.5x no speculation"}
    assert pytest_text(passed, Outcome.PASS) == "ngram coding c1 backfire: 1.5x no speculation"
    assert pytest_text(entry, Outcome.DECLARED_BACKFIRE).endswith(" [declared backfire: never fails the run]")
    assert "never fails the run" in pytest_text(entry, Outcome.UNDECIDED, ALL_FAIL, declared=True)


def test_the_summary_counts_the_gates_that_gated_and_those_reported_only():
    def entry(gate, gating, why):
        return {"gate": gate, "gating": gating, "gating_reason": why}

    report = {"gates": [entry("backfire", "gate", "live"), entry("backfire", "gate", "live"),
                        entry("throughput", "report", "no history")],
              "undecided": [entry("ttft", "gate", "live")]}
    gated, reported = gating_lines(report)
    assert gated.startswith("GATED THE RUN: 3 gate(s)") and "backfire x2 (live)" in gated and "ttft x1" in gated
    assert reported.startswith("REPORTED ONLY") and "throughput x1 (no history)" in reported
    plain = {"gates": [{"gate": "backfire"}], "outcome_policy": {"not_stored": "fail", "undecided": "skip"}}
    (line,) = gating_lines(plain)
    assert "([gates] gating unset)" in line and "decide nothing: not_stored (" in line
    assert gating_lines({"gates": [], "undecided": []}) == []
