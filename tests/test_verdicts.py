"""Issue 36, "verdicts that mean what they say": an interval holding the threshold is undecided
whatever it also shows; one outcome model mapped to pytest in one place (single process and xdist
controller alike); a policy for what a gate that decided nothing does to the exit code; bad input
refused before any server starts; the level each interval uses stated; acceptance as one decision
over two samples."""

import dataclasses
import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest
from fixture_copy import copy_fixtures
from standins import gate_settings
from words import said

from specgate.config.rig import Gates, load_rig
from specgate.decide.gates import check_acceptance
from specgate.decide.outcome import KIND_OUTCOMES, Outcome, parse_policy, pytest_action
from specgate.decide.paired import paired_log_ratio, start_spread, stratified_log_ratio
from specgate.decide.stats import Observed, compare_acceptance
from specgate.decide.verdict import GateResult
from specgate.measure.client import RequestRecord
from specgate.measure.metrics import AcceptanceStats
from specgate.measure.protocol import ClassMeasurement
from specgate.plugin.gatekeeper import GateKeeper
from specgate.plugin.resolve import SessionOptions
from specgate.plugin.session import SpecgateSession
from specgate.report.terminal import failed_gate_lines
from specgate.report.verdicts import ratio_text
from specgate.store.baselines import AcceptanceEntry, BaselineEntry

pytestmark = pytest.mark.fast
pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent


# -- 1: the threshold before equivalence ----------------------------------------------------------
def test_an_interval_inside_the_margin_that_holds_the_threshold_is_undecided_not_equal():
    # The new user's A/A A/B on the cpu tier: 0.985x (0.961-1.010) against 0.97, "equal within ±3.9 %"
    # and PASSED; a real 3 % slowdown would have read the same.
    x = np.random.default_rng(36).normal(0.0, 0.09, 30)
    d = math.log(0.985) + np.concatenate([x, -x])  # 60 pairs, symmetric about 0.985x
    result = paired_log_ratio(d, threshold=0.97, equivalence_margin=0.05)
    assert result.ci_low < 0.97 < result.ci_high  # the interval holds the threshold ...
    assert max(1 - result.ci_low, result.ci_high - 1) <= 0.05  # ... and lies inside the margin
    assert result.verdict == "undecided" and result.equal_within is None
    # the same spread well above the threshold still reads "equal"
    above = paired_log_ratio(d - math.log(0.985), threshold=0.95, equivalence_margin=0.05)
    assert above.verdict == "equal" and above.ci_low >= 0.95


# -- 2: one outcome model, one mapping ------------------------------------------------------------
def _window(mode: str = "ngram", prompt_class: str = "extraction", tps: list[float] | None = None) -> ClassMeasurement:
    records = []
    for i, rate in enumerate(tps or [30.0] * 6):
        span = 63 / rate
        records.append(RequestRecord(
            request_id=f"{mode}/{prompt_class}/p{i}#0", mode=mode, prompt_class=prompt_class, prompt_id=f"p{i}",
            concurrency=1, started_at=0.0, first_token_at=0.1, last_token_at=0.1 + span, finished_at=0.1 + span,
            chunk_times=[0.1, 0.1 + span], prompt_tokens=10, completion_tokens=64, text=f"output {i}",
            finish_reason="length"))
    return ClassMeasurement(rig="cpu-smollm2", mode=mode, prompt_class=prompt_class, concurrency=1, records=records,
                            acceptance=None, server_decode_tokens_per_s=None, server_metric_source=None, wall_s=1.0)


def _session(tmp_path: Path, policy: dict[str, str] | None = None) -> SpecgateSession:
    return SpecgateSession(SessionOptions(
        rig_name="cpu-smollm2", fixtures_dir=ROOT / "fixtures", baselines_path=tmp_path / "baselines.json",
        run_dir=tmp_path / "run", repo_root=ROOT, undecided_policy=policy))


# outcome -> (pytest's action by default, under --specgate-undecided=fail)
EXPECTED = {
    Outcome.PASS: ("passed", "passed"), Outcome.FAIL: ("failed", "failed"),
    Outcome.DECLARED_BACKFIRE: ("xfailed", "xfailed"), Outcome.UNDECIDED: ("skipped", "failed"),
    Outcome.NOT_STORED: ("failed", "failed"),  # a missing entry fails by default (the regressions pattern)
    Outcome.OTHER_MACHINE: ("skipped", "failed"), Outcome.NOT_RUN: ("skipped", "failed"),
}
RAISES = {"failed": pytest.fail.Exception, "skipped": pytest.skip.Exception, "xfailed": pytest.xfail.Exception}


def test_every_kind_of_gate_that_decided_nothing_has_an_outcome():
    assert set(EXPECTED) == set(Outcome)
    kinds = {"undecided", "inconclusive", "too few drafts", "no stored figures", "storing figures", "fingerprint",
             "other machine", "other host pace", "not run"}
    assert kinds <= set(KIND_OUTCOMES) and not any(KIND_OUTCOMES[k].decided for k in kinds)


@pytest.mark.parametrize("policy", ["default", "fail"])
@pytest.mark.parametrize("outcome", list(Outcome), ids=lambda o: o.name)
def test_single_process_each_outcome_becomes_its_pytest_outcome(tmp_path, outcome, policy):
    session = _session(tmp_path, parse_policy("fail") if policy == "fail" else None)
    expected = EXPECTED[outcome][policy == "fail"]
    result = GateResult("backfire", "ngram", "extraction", 1, outcome, "0.985x no speculation (stand-in)",
                        declared="known" if outcome is Outcome.DECLARED_BACKFIRE else None)
    assert pytest_action(outcome, session.settings.outcome_policy) == expected
    if expected == "passed":
        GateKeeper(session)._finish(result)
    else:
        with pytest.raises(RAISES[expected]):
            GateKeeper(session)._finish(result)
    # decided gates are results; the others are listed as what they are, never as passed
    report = session.report_data(complete=True)
    if outcome.decided:
        assert [g["outcome"] for g in report["gates"]] == [outcome.value] and not report["undecided"]
    else:
        assert not report["gates"] and [u["outcome"] for u in report["undecided"]] == [outcome.value]
        assert any(f"1 {outcome.value}" in line for line in failed_gate_lines(report))


def _controller_with_deferred(tmp_path: Path, policy: dict[str, str] | None = None) -> SpecgateSession:
    controller = _session(tmp_path, policy)
    worker = _session(tmp_path)
    worker = SpecgateSession(dataclasses.replace(worker.options, worker_id="gw0"))
    nodeid = "perf_tests/test_speculative_perf.py::test_backfire[ngram-extraction-c1]@ngram"
    worker.deferred_tests[nodeid] = ["backfire", "ngram", "extraction", 1]
    controller.absorb_worker(json.loads(json.dumps(worker.worker_output())))
    return controller


@pytest.mark.parametrize("policy", ["default", "fail"])
@pytest.mark.parametrize("outcome", list(Outcome), ids=lambda o: o.name)
def test_the_xdist_controller_maps_each_outcome_as_a_single_process_does(tmp_path, outcome, policy):
    from specgate.plugin.controller import deferred_test_reports

    controller = _controller_with_deferred(tmp_path, parse_policy("fail") if policy == "fail" else None)
    controller.record(GateResult("backfire", "ngram", "extraction", 1, outcome, "stand-in message",
                                 declared="known" if outcome is Outcome.DECLARED_BACKFIRE else None))
    (report,) = deferred_test_reports(controller)
    expected = EXPECTED[outcome][policy == "fail"]
    assert (report.outcome, hasattr(report, "wasxfail")) == (
        "skipped" if expected == "xfailed" else expected, expected == "xfailed")


def test_an_undecided_declared_backfire_never_fails_the_run_even_under_the_fail_policy(tmp_path):
    # a declared backfire is reported, never gated, and its window takes no follow-up rounds
    # (Rig.follow_up_rounds): an undecided one is skipped whatever --specgate-undecided says, on a
    # single process and on the xdist controller, and the report's count says so
    from specgate.plugin.controller import deferred_test_reports

    policy = parse_policy("fail")
    session = _session(tmp_path, policy)
    assert session.settings.rig.declared_backfire_for("ngram", "coding") is not None
    result = GateResult("backfire", "ngram", "coding", 1, Outcome.UNDECIDED, "1.01x no speculation (stand-in)",
                        declared="known")
    assert pytest_action(Outcome.UNDECIDED, policy) == "failed"
    assert pytest_action(Outcome.UNDECIDED, policy, declared=True) == "skipped"
    with pytest.raises(pytest.skip.Exception, match=r" \[declared backfire: never fails the run\]$"):
        GateKeeper(session)._finish(result)
    report = session.report_data(complete=True)
    assert [u["declared"] for u in report["undecided"]] == ["known"]
    assert any("1 undecided of a declared backfire (skipped)" in line for line in failed_gate_lines(report))

    controller = _session(tmp_path / "controller", policy)
    worker = _session(tmp_path / "worker")
    worker = SpecgateSession(dataclasses.replace(worker.options, worker_id="gw0"))
    worker.deferred_tests["perf_tests/test_speculative_perf.py::test_backfire[ngram-coding-c1]@ngram"] = [
        "backfire", "ngram", "coding", 1]
    controller.absorb_worker(json.loads(json.dumps(worker.worker_output())))
    controller.record(result)
    (reported,) = deferred_test_reports(controller)
    assert reported.outcome == "skipped" and "never fails the run" in reported.longrepr[2]


def test_an_undecided_backfire_decided_on_the_controller_is_not_reported_passed(tmp_path):
    # The multi-GPU path mapped deferred results by `passed` alone: undecided read as PASSED.
    from specgate.plugin.controller import decide_deferred_gates, deferred_test_reports

    for policy, outcome, failed in ((None, "skipped", False), ({"undecided": "fail"}, "failed", True)):
        controller = _session(tmp_path, policy)
        wobble = [1.06, 0.94, 1.05, 0.95, 1.04, 0.96]
        for worker_id, m in (("gw0", _window("ngram", tps=[30.0 * w for w in wobble])),
                             ("gw1", _window("no_spec"))):
            worker = _session(tmp_path)
            worker = SpecgateSession(dataclasses.replace(worker.options, worker_id=worker_id))
            worker.measurements[(m.mode, "extraction", 1)] = m
            if m.mode == "ngram":
                worker.deferred.append(("ngram", "extraction", 1))
                worker.deferred_tests["perf_tests/t.py::test_backfire[ngram-extraction-c1]@ngram"] = [
                    "backfire", "ngram", "extraction", 1]
            controller.absorb_worker(json.loads(json.dumps(worker.worker_output())))
        assert decide_deferred_gates(controller) is failed
        assert [u["outcome"] for u in controller.undecided if u["gate"] == "backfire"] == ["undecided"]
        assert not [r for r in controller.results if r.gate == "backfire"]
        (report,) = deferred_test_reports(controller)
        assert report.outcome == outcome and "spans 1.00 line [6 pairs] [" in str(report.longrepr)


# -- 3: the policy --------------------------------------------------------------------------------
def test_the_policy_comes_from_the_rig_and_the_option_overrides_it(tmp_path):
    assert Gates().outcome_policy == {"undecided": "skip", "not_stored": "fail", "other_machine": "skip",
                                      "not_run": "skip"}
    assert set(Gates(undecided="fail").outcome_policy.values()) == {"fail"}
    assert Gates(undecided={"other_machine": "fail"}).outcome_policy["other_machine"] == "fail"
    assert parse_policy("not_stored=skip,undecided=fail") == {"not_stored": "skip", "undecided": "fail"}
    with pytest.raises(ValueError, match="expected 'skip', 'fail'"):
        parse_policy("undecided=maybe")
    assert _session(tmp_path, {"not_stored": "skip"}).settings.outcome_policy["not_stored"] == "skip"


UNDECIDED_GATE = textwrap.dedent('''
    from specgate.decide.verdict import GateResult
    from specgate.decide.outcome import Outcome


    def test_gate(gatekeeper):
        gatekeeper._finish(GateResult("throughput", "ngram", "coding", 1, Outcome.OTHER_MACHINE, "stored elsewhere"))
''')


@pytest.fixture
def undecided_project(pytester: pytest.Pytester) -> pytest.Pytester:
    copy_fixtures(pytester.path / "fixtures")
    pytester.makepyfile(test_gate=UNDECIDED_GATE)
    return pytester


def test_a_gate_that_decided_nothing_fails_the_run_under_the_fail_policy(undecided_project):
    # A fresh-clone CI run was green with all 12 throughput gates skipped (other machine).
    assert undecided_project.runpytest("-p", "no:cacheprovider").ret == pytest.ExitCode.OK
    by_option = undecided_project.runpytest("-p", "no:cacheprovider", "--specgate-undecided=fail")
    by_option.assert_outcomes(failed=1)
    assert "throughput: stored elsewhere [fails the run: other_machine = fail]" in by_option.stdout.str()
    rig = undecided_project.path / "fixtures" / "rigs" / "cpu-smollm2.toml"
    rig.write_text(rig.read_text().replace("[gates]\n", '[gates]\nundecided = "fail"\n', 1))
    by_rig = undecided_project.runpytest("-p", "no:cacheprovider")
    assert by_rig.ret == pytest.ExitCode.TESTS_FAILED
    assert undecided_project.runpytest("-p", "no:cacheprovider", "--specgate-undecided=skip").ret == 0
    assert undecided_project.runpytest("--specgate-undecided=sometimes").ret == pytest.ExitCode.USAGE_ERROR


# -- 4: bad input before any server starts --------------------------------------------------------
def test_a_truncated_baselines_file_is_refused_before_any_test_runs_and_left_as_it_was(pytester):
    copy_fixtures(pytester.path / "fixtures")
    pytester.makepyfile(test_perf=(ROOT / "perf_tests" / "test_speculative_perf.py").read_text())
    pytester.makeini("[pytest]\nmarkers =\n    perf: p\n    cpu: c\n    gpu: g\n    speculative_only: s\n")
    truncated = (ROOT / "baselines.json").read_bytes()[:700]
    path = pytester.path / "baselines.json"
    path.write_bytes(truncated)
    # attach mode, so that old code fails fast too (it would try to reach the server in every test)
    result = pytester.runpytest("-m", "cpu", "-p", "no:cacheprovider", "--specgate-vllm-url", "http://127.0.0.1:9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert f"{path}: not valid JSON" in err and "before any server starts" in err
    assert "Traceback" not in err + result.stdout.str()
    assert path.read_bytes() == truncated


def test_the_xdist_controller_refuses_when_its_marker_expression_selects_a_tier(pytester):
    from specgate.plugin import _xdist_controller_of_a_perf_run

    def config(markexpr: str, dist: str = "load"):
        from types import SimpleNamespace

        return SimpleNamespace(option=SimpleNamespace(markexpr=markexpr), getoption=lambda name, default=None: dist)

    assert _xdist_controller_of_a_perf_run(config("gpu"))
    assert _xdist_controller_of_a_perf_run(config("cpu and not slow"))
    assert not _xdist_controller_of_a_perf_run(config("fast"))
    assert not _xdist_controller_of_a_perf_run(config("not gpu"))
    assert not _xdist_controller_of_a_perf_run(config("gpu", dist="no"))


# -- 5: the level the intervals use ---------------------------------------------------------------
def test_spreads_and_resolutions_use_the_intervals_own_quantiles():
    from scipy.stats import norm, t

    # three stored runs: their spread is an estimate with 2 degrees of freedom
    assert start_spread(0.02, dof=2) == pytest.approx(t.ppf(0.975, 2) * math.sqrt(2) * math.log1p(0.02))
    assert start_spread(0.02, dof=2) / start_spread(0.02) == pytest.approx(4.303 / 1.960, abs=1e-3)
    assert start_spread(0.02, confidence=0.9706) == pytest.approx(norm.ppf(0.9853) * math.sqrt(2) * math.log(1.02))
    # a 12-pair signed-rank interval at its exact coverage: z at that coverage, stated in the message
    d = np.log(np.linspace(0.9, 1.1, 12))
    hl = paired_log_ratio(d, threshold=0.8)
    q = norm.ppf(0.5 + hl.confidence / 2)
    upper = math.log(hl.ci_high / hl.ratio)
    assert hl.detectable == pytest.approx(0.8 * math.exp(-(1 + norm.ppf(0.95) / q) * upper))
    assert f"one-sided at {(1 - hl.confidence) / 2 * 100:.2g} % (z = {q:.2f})" in ratio_text(hl.to_dict(), "x")
    # prompts as strata: Student's t at the interval's degrees of freedom (6 prompts x 2 repeats: 6 df)
    strata = [f"p{i // 2}" for i in range(12)]
    st = stratified_log_ratio(d, strata, threshold=0.8)
    upper = math.log(st.ci_high / st.ratio)
    assert st.detectable == pytest.approx(0.8 * math.exp(-(1 + t.ppf(0.95, 6) / t.ppf(0.975, 6)) * upper))
    assert f"(t, 6 df = {t.ppf(0.975, 6):.2f})" in ratio_text(st.to_dict(), "x")


# -- 7: acceptance as one decision over two samples -----------------------------------------------
def _acceptance(drafts: float, per_position: list[float]) -> ClassMeasurement:
    m = _window("ngram", "coding")
    m.acceptance = AcceptanceStats(drafts=drafts, draft_tokens=drafts * len(per_position),
                                   accepted_tokens=sum(per_position), accepted_per_position=tuple(per_position))
    return m


def _stored(drafts: float, per_position: list[float]) -> BaselineEntry:
    k = len(per_position)
    acceptance = AcceptanceEntry(mean_acceptance_length=1 + sum(per_position) / drafts,
                                 acceptance_rate=sum(per_position) / (drafts * k),
                                 per_position_rates=[a / drafts for a in per_position], drafts=drafts,
                                 draft_tokens=drafts * k, accepted_per_position=list(per_position))
    return BaselineEntry(decode_tokens_per_s=[30.0], median=30.0, mad=0.0, n=1, acceptance=acceptance)


@pytest.fixture(scope="module")
def rig():
    return load_rig("cpu-smollm2", ROOT / "fixtures")


def test_the_stored_sides_own_counts_widen_the_comparison(rig):
    # 0.5 now from 10,000 drafts against 0.6 stored from only 100: taken as an exact line (0.57 at
    # -5 %), the stored figure would fail the window; as the sample it is, it cannot tell.
    window = _acceptance(10_000, [5_000])
    result = check_acceptance(gate_settings(rig, window), window, _stored(100, [60]))
    assert result.outcome is Outcome.UNDECIDED
    assert "(5000 of 10000 drafts) vs 0.6 stored (60 of 100)" in said(result)
    window = _acceptance(10_000, [5_000])
    settled = check_acceptance(gate_settings(rig, window), window, _stored(10_000, [6_000]))
    assert settled.outcome is Outcome.FAIL


def test_overall_and_per_position_checks_are_one_decision_at_a_stated_family_wise_rate(rig):
    # Four checks (overall and three positions) share the 95 %: each at 98.75 %. Position 2 drops
    # ~10 %: beyond a lone 95 % check's reach (it would FAIL), not beyond the family's.
    window = _acceptance(1_500, [1_400, 1_040, 700])
    result = check_acceptance(gate_settings(rig, window), window, _stored(1_500, [1_400, 1_150, 700]))
    assert result.details["check_confidence"] == pytest.approx(1 - 0.05 / 4)
    assert "one decision over 4 checks (overall and per position), each at 98.75 % (Bonferroni): a false FAIL " \
           "at most 2.5 % of the time" in said(result)
    now, stored = Observed(1_040 / 1_500, (1_040, 1_500)), Observed(1_150 / 1_500, (1_150, 1_500), "stored")
    lone = compare_acceptance(now, stored, tolerance=0.05, subject="s", metric="position 2", confidence=0.95)
    assert lone.decided and not lone.passed
    position_2 = result.details["checks"][2]
    assert position_2["ci_low"] < 0.95 <= position_2["ci_high"] and not position_2["decided"]
    assert result.outcome is Outcome.UNDECIDED


# -- 6: stored-figure gates say when they catch nothing useful -------------------------------------
def test_a_stored_figure_gate_that_catches_nothing_useful_says_so(rig):
    from specgate.decide.entry import baseline_entry
    from specgate.decide.gates import check_throughput
    from specgate.store.baselines import Fingerprint

    wobble = [1.02, 0.98, 1.01, 0.99, 1.03, 0.97]
    stored = baseline_entry(_window("no_spec", "coding", [30.0 * w for w in wobble]), Fingerprint())
    # the cpu rig's level: 25 % tolerance, 10 % start noise per server start (two starts)
    window = _window("no_spec", "coding", [30.0 * w for w in reversed(wobble)])
    result = check_throughput(gate_settings(rig, window), window, stored)
    assert result.details["catches_nothing_useful"] and result.details["detectable"] < 0.5
    assert f"catches only a true ratio <= {result.details['detectable']:.3f}" in said(result)
    assert "no speed gate on its own" in said(result)
    assert result.outcome is Outcome.UNDECIDED  # and it cannot pass: its interval holds the threshold
