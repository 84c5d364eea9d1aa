"""Issue 47, items 2, 6 and 7: a policy per gate (the gates that can decide on this rig gate the
run, the others are reported only), the session's false-alarm bound over the gates that gate, and
the A/B's start order (seeded, reported) with the start-pair spread stated or folded in."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import pytest
from fixture_copy import copy_fixtures, quick_rig_with_a_declared_backfire
from standins import gate_settings, window_side
from words import said

from specgate.config.rig import AB, Gates, load_rig
from specgate.decide.gates import ab_throughput
from specgate.decide.outcome import Outcome, family, parse_gating, pytest_action
from specgate.decide.settings import can_decide, resolve_gating, window_settings
from specgate.errors import ConfigError
from specgate.measure.client import RequestRecord
from specgate.measure.protocol import ClassMeasurement
from specgate.plugin.resolve import SessionOptions
from specgate.plugin.session import SpecgateSession
from specgate.report.terminal import render_markdown, settings_lines, start_order_lines
from specgate.report.verdicts import family_text, gating_lines, pytest_text, reason_text
from specgate.store.baselines import SCHEMA_VERSION, BaselineEntry, BaselineFile, RatioEntry, StoredStart

pytestmark = pytest.mark.fast
pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent


# -- 2: a policy per gate -------------------------------------------------------------------------
def test_the_option_reads_one_setting_or_one_per_gate():
    assert set(parse_gating("auto").values()) == {"auto"}
    assert parse_gating("throughput=gate, acceptance=report") == {"throughput": "gate", "acceptance": "report"}
    with pytest.raises(ValueError, match=r"GATE=auto\|gate\|report"):
        parse_gating("speed=gate")
    with pytest.raises(ValueError, match="expected 'auto'"):
        parse_gating("throughput=sometimes")


@pytest.mark.parametrize(("table", "key"), [('{ throughput = "sometimes" }', "gates.gating"),
                                            ('{ thruput = "gate" }', "gates.gating"),
                                            ('"always"', "gates.gating")])
def test_a_bad_gating_in_the_rig_is_refused_naming_the_file_and_key(tmp_path, table, key):
    fixtures = copy_fixtures(tmp_path / "fixtures")
    rig = fixtures / "rigs" / "cpu-smollm2.toml"
    rig.write_text(rig.read_text().replace("[gates]\n", f"[gates]\ngating = {table}\n", 1))
    with pytest.raises(ConfigError) as caught:
        load_rig("cpu-smollm2", fixtures)
    assert str(rig) in str(caught.value) and key in str(caught.value)


def test_the_rig_sets_the_gating_per_gate_and_the_option_overrides_it(tmp_path):
    assert Gates().gating_setting == {}
    assert Gates(gating="auto").gating_setting["ttft"] == "auto"
    assert Gates(gating={"throughput": "report"}).gating_setting == {"throughput": "report"}
    session = SpecgateSession(SessionOptions(
        rig_name="cpu-smollm2", fixtures_dir=ROOT / "fixtures", baselines_path=tmp_path / "b.json",
        run_dir=tmp_path / "run", repo_root=ROOT, gating={"backfire": "report"}))
    assert session.settings.gating == {"backfire": "report"}


# outcome -> pytest's action under gating "report", "gate", and none (the default policy)
ACTIONS = {
    Outcome.PASS: ("passed", "passed", "passed"),
    Outcome.FAIL: ("skipped", "failed", "failed"),
    Outcome.DECLARED_BACKFIRE: ("xfailed", "xfailed", "xfailed"),
    Outcome.UNDECIDED: ("skipped", "failed", "skipped"),
    Outcome.NOT_STORED: ("skipped", "failed", "failed"),  # "gate" leaves it to the outcome policy
    Outcome.OTHER_MACHINE: ("skipped", "skipped", "skipped"),
    Outcome.NOT_RUN: ("skipped", "skipped", "skipped"),
}


@pytest.mark.parametrize("outcome", list(Outcome))
def test_report_never_fails_the_run_gate_fails_an_undecided_one(outcome):
    assert tuple(pytest_action(outcome, None, gating=g) for g in ("report", "gate", None)) == ACTIONS[outcome]
    # "report" holds under --specgate-undecided=fail too: a gate that cannot decide never turns the run red
    assert pytest_action(outcome, dict.fromkeys(("undecided", "not_stored", "other_machine", "not_run"), "fail"),
                         gating="report") == ACTIONS[outcome][0]


def test_the_test_report_says_why_a_gate_did_or_did_not_fail_the_run():
    entry = {"gate": "ttft", "mode": "ngram", "prompt_class": "coding", "concurrency": 1, "message": "m"}
    assert pytest_text(entry, Outcome.FAIL, gating="report").endswith("[FAILED, reported only: cannot decide here]")
    assert pytest_text(entry, Outcome.UNDECIDED, gating="gate").endswith("[undecided; gates the run: fails it]")


def _ab_rig():
    rig = load_rig("cpu-smollm2-quick", ROOT / "fixtures")
    return rig.model_copy(update={"ab": AB()})


MACHINE = "machine-id stand-in"


def _store(rig_name: str, ratios: list[float], machine: str | None = MACHINE) -> BaselineFile:
    entry = BaselineEntry(decode_tokens_per_s=[30.0], median=30.0, mad=0.0, n=1,
                          starts=[StoredStart(level=30.0, ratio=r, machine=machine) for r in ratios],
                          ratio_to_reference=RatioEntry(reference_mode="no_spec", ratio=1.0, ci_low=0.9, ci_high=1.1,
                                                        n=6) if ratios else None)
    return BaselineFile(schema_version=SCHEMA_VERSION, rigs={rig_name: {"ngram": {"coding": {"1": [entry]}}}})


def test_auto_gates_the_live_comparisons_and_stored_figures_with_history_only():
    duet = load_rig("cpu-smollm2-quick", ROOT / "fixtures")
    ab = _ab_rig()
    ngram = window_settings(duet, "ngram", "coding")
    ab_ngram = window_settings(ab, "ngram", "coding")
    assert can_decide(ab_ngram, None, "throughput")[0]
    assert can_decide(ab_ngram, None, "acceptance")[0]
    assert can_decide(ngram, None, "backfire")[0]
    assert can_decide(ngram, None, "ttft")[0]
    assert not can_decide(ngram, None, "acceptance")[0]
    fresh, why = can_decide(ngram, _store(duet.name, [1.0]), "throughput", MACHINE)
    assert not fresh and "1 of the 3 stored ratios a prediction interval needs" in reason_text(why)
    # issue 51: the prediction interval's half-width against the tolerance decides, not a count of starts
    narrow, why = can_decide(ngram, _store(duet.name, [1.0, 1.002, 0.999]), "throughput", MACHINE)
    assert narrow and "narrower than the" in reason_text(why)
    wide, why = can_decide(ngram, _store(duet.name, [1.0, 1.06, 0.95] * 2), "throughput", MACHINE)
    assert not wide and "is not narrower than the" in reason_text(why)
    # a history of another machine, or of one unknown, never gates
    assert not can_decide(ngram, _store(duet.name, [1.0, 1.002, 0.999]),
                          "throughput", "machine-id other")[0]
    assert not can_decide(ngram, _store(duet.name, [1.0, 1.002, 0.999], None), "throughput", None)[0]
    assert not can_decide(window_settings(duet, "no_spec", "coding"), _store(duet.name, []), "throughput", MACHINE)[0]
    assert resolve_gating({"throughput": "auto"}, ngram, None, "throughput") == (
        "report", "this machine cannot be identified")
    assert resolve_gating({"throughput": "gate"}, ngram, None, "throughput")[0] == "gate"
    assert resolve_gating({}, ngram, None, "throughput")[0] is None


UNDECIDED_GATES = textwrap.dedent('''
    import pytest
    from specgate.decide.verdict import GateResult
    from specgate.decide.outcome import Outcome


    @pytest.mark.parametrize("gate", ["throughput", "backfire"])
    def test_gate(gatekeeper, gate):
        gatekeeper._finish(GateResult(gate, "ngram", "coding", 1, Outcome.UNDECIDED, f"{gate}: interval across"))
''')


def test_under_auto_an_undecided_live_gate_fails_the_run_a_stored_one_is_reported(pytester):
    copy_fixtures(pytester.path / "fixtures")
    pytester.makepyfile(test_gate=UNDECIDED_GATES)
    run_dir = pytester.path / "run"
    result = pytester.runpytest("-p", "no:cacheprovider", "--specgate-gating=auto", "--specgate-undecided=fail",
                                f"--specgate-run-dir={run_dir}", "-rA")
    result.assert_outcomes(failed=1, skipped=1)
    out = result.stdout.str()
    assert "ngram coding c1 backfire: backfire: interval across [undecided; gates the run: fails it]" in out
    assert "throughput: interval across [UNDECIDED, reported only: cannot decide here]" in out
    assert "GATED THE RUN: 1 gate(s): backfire x1 (a live no-speculation reference in the same session)" in out
    assert "REPORTED ONLY (never fail the run): 1 gate(s): throughput x1 (no stored history of this machine)" in out
    report = json.loads((run_dir / "report.json").read_text())
    assert {u["gate"]: u["gating"] for u in report["undecided"]} == {"throughput": "report", "backfire": "gate"}
    assert report["gating"]["throughput"] == "auto"
    plain = pytester.runpytest("-p", "no:cacheprovider")
    plain.assert_outcomes(skipped=2)  # no gating set: the outcome policy (undecided skips)
    assert pytester.runpytest("--specgate-gating=maybe").ret == pytest.ExitCode.USAGE_ERROR


# -- 6: the family ---------------------------------------------------------------------------------
def test_the_family_is_held_at_its_bound_or_its_bound_is_stated():
    loose = family(0.95, None, 36)
    assert loose.per_gate == pytest.approx(0.025) and loose.bound == pytest.approx(0.9)
    assert "at most 90 % (Bonferroni, not controlled" in family_text(loose)
    held = family(0.95, 0.05, 36)
    assert held.bound == pytest.approx(0.05) and held.confidence == pytest.approx(1 - 0.1 / 36)
    assert "at most 5 % (Bonferroni; [gates] family_false_alarm = 0.05)" in family_text(held)
    assert family(0.95, 0.05, 1).confidence == 0.95  # never below the rig's own confidence
    assert "no gate of this run can fail it" in family_text(family(0.95, 0.05, 0))


def test_the_session_counts_the_gates_that_gate_and_every_later_interval_uses_their_confidence(tmp_path):
    fixtures = quick_rig_with_a_declared_backfire(copy_fixtures(tmp_path / "fixtures"))
    rig_file = fixtures / "rigs" / "cpu-smollm2-quick.toml"
    rig_file.write_text(rig_file.read_text().replace("[gates]\n", '[gates]\ngating = "auto"\nfamily_false_alarm = '
                                                     '0.05\n', 1))
    session = SpecgateSession(SessionOptions(
        rig_name="cpu-smollm2-quick", fixtures_dir=fixtures, baselines_path=tmp_path / "b.json",
        run_dir=tmp_path / "run", repo_root=ROOT))
    tests = [(g, "ngram", c, 1) for g in ("throughput", "acceptance", "backfire", "ttft", "lossless")
             for c in ("coding", "extraction")] + [("throughput", "no_spec", c, 1) for c in ("coding", "extraction")]
    session.plan_family(tests)
    # backfire on extraction (coding's is a declared backfire, never failing) and ttft on 2 classes;
    # lossless has no interval; stored-figure throughput and acceptance are reported only
    assert session.settings.family.gating == 3
    # resolved once per selected window, at the family's confidence (the rig itself is left as it is)
    assert session.settings.window("ngram", "coding", 1).confidence == pytest.approx(1 - 0.1 / 3)
    assert session.settings.window("no_spec", "extraction", 1).confidence == pytest.approx(1 - 0.1 / 3)
    assert session.settings.window("ngram", "coding", 1) is session.settings.window("ngram", "coding", 1)
    assert session.settings.rig.gates.confidence == 0.95
    report = session.report_data(complete=True)
    assert report["family"]["bound"] == pytest.approx(0.05)
    assert any("FALSE ALARMS: 3 gate(s) can fail this run" in line for line in gating_lines(report))
    # report.json carries the settings each window decided with, and the summary says them once per group
    windows = {(w["mode"], w["prompt_class"]): w for w in report["settings"]}
    assert set(windows) == {(m, c) for m in ("ngram", "no_spec") for c in ("coding", "extraction")}
    assert windows[("ngram", "coding")]["confidence"] == pytest.approx(1 - 0.1 / 3)
    assert windows[("ngram", "coding")]["declared_backfire"]
    assert not windows[("ngram", "extraction")]["declared_backfire"]
    lines = settings_lines(report)
    assert len(lines) == 2 and all(line.startswith("GATE SETTINGS: ") for line in lines)
    assert "ngram/coding/c1" in next(line for line in lines if "declared backfire" in line)


# -- 7: the start order ----------------------------------------------------------------------------
def test_the_side_started_first_comes_from_the_seed_and_is_reported(tmp_path):
    def session(seed):
        return SpecgateSession(SessionOptions(
            rig_name="cpu-smollm2", fixtures_dir=ROOT / "fixtures", baselines_path=tmp_path / "b.json",
            run_dir=tmp_path / "run", repo_root=ROOT, start_seed=seed))

    picks = {seed: session(seed).first_side("ngram") for seed in range(20)}
    assert set(picks.values()) == {"reference", "candidate"}  # both orders occur
    assert all(session(seed).first_side("ngram") == side for seed, side in picks.items())  # and repeat
    s = session(7)
    s.first_side("ngram")
    s.first_side("no_spec")
    report = s.report_data(complete=True)
    assert report["start_order"] == {"seed": 7, "first": dict(s.start_order)}
    (line,) = start_order_lines(report)
    assert "seed 7" in line and f"ngram: {s.start_order['ngram']}" in line
    assert SpecgateSession(SessionOptions(
        rig_name="cpu-smollm2", fixtures_dir=ROOT / "fixtures", baselines_path=tmp_path / "b.json",
        run_dir=tmp_path / "run", repo_root=ROOT)).start_seed >= 0  # drawn when not given


def _ab_window(side: str, tps: list[float]) -> ClassMeasurement:
    records = [RequestRecord(request_id=f"ngram/coding/p{i}#0", mode="ngram", prompt_class="coding", prompt_id=f"p{i}",
                             concurrency=1, started_at=0.0, first_token_at=0.5, last_token_at=0.5 + 47 / t,
                             finished_at=0.5 + 47 / t, chunk_times=[0.5, 0.5 + 47 / t], prompt_tokens=10,
                             completion_tokens=48, text="x", finish_reason="length") for i, t in enumerate(tps)]
    return ClassMeasurement(rig="cpu-smollm2-quick", mode="ngram", prompt_class="coding", concurrency=1,
                            records=records, acceptance=None, server_decode_tokens_per_s=None,
                            server_metric_source=None, wall_s=1.0, arrangement="duet", **window_side(side))


def test_the_ab_verdict_states_the_start_order_and_folds_in_the_start_pair_spread():
    rig = _ab_rig()
    tps = [20.0, 20.4, 19.8, 20.2, 20.1, 19.9, 20.3, 20.0]
    m = _ab_window("subject", [t * 1.002 for t in tps])
    m.partner = _ab_window("reference", tps)
    m.extra["start_order"] = {"first": "candidate", "seed": 7}
    stated = ab_throughput(gate_settings(rig, m), m)
    assert "the candidate side started first (seed 7); start-pair offset not folded in (start_pair_spread = 0" \
        in said(stated)
    assert stated.details["start_pair"] == {"first": "candidate", "seed": 7, "spread": 0.0, "dof": None,
                                            "quantile": pytest.approx(1.96, abs=0.01), "widened_log": 0.0}
    widened_rig = rig.model_copy(update={"gates": rig.gates.model_copy(update={"start_pair_spread": 0.01})})
    widened = ab_throughput(gate_settings(widened_rig, m), m)
    assert "start-pair spread 1 % folded in (z = " in said(widened)
    grow = widened.details["start_pair"]["widened_log"]
    assert grow > 0.019
    import math

    assert math.log(widened.details["ci_high"]) - math.log(stated.details["ci_high"]) == pytest.approx(grow)
    assert f"{widened.details['ci_low']:.3f}-{widened.details['ci_high']:.3f}" in said(widened)
    # a spread measured over 7 start pairs has 6 degrees of freedom: folded in with t(6), not z (issue 62)
    measured = widened_rig.model_copy(update={"gates": widened_rig.gates.model_copy(
        update={"start_pair_spread_pairs": 7})})
    with_t = ab_throughput(gate_settings(measured, m), m)
    assert "start-pair spread 1 % folded in (t, 6 df = " in said(with_t)
    assert with_t.details["start_pair"]["widened_log"] / grow == pytest.approx(2.447 / 1.96, rel=0.01)


def test_the_markdown_summary_carries_the_gating_family_and_start_order(tmp_path):
    session = SpecgateSession(SessionOptions(
        rig_name="cpu-smollm2", fixtures_dir=ROOT / "fixtures", baselines_path=tmp_path / "b.json",
        run_dir=tmp_path / "run", repo_root=ROOT, start_seed=3, gating={"backfire": "gate"}))
    session.first_side("ngram")
    session.plan_family([("backfire", "ngram", "extraction", 1)])
    m = _ab_window("subject", [20.0] * 6)
    m.prompt_class = "extraction"
    session.record_undecided("backfire", m, "undecided", "backfire: interval across")
    report = json.loads(json.dumps(session.report_data(complete=True)))
    report["measurements"] = [m.to_dict()]
    report["rig"]["modes"] = {"ngram": {}}
    text = render_markdown(report)
    assert "GATED THE RUN: 1 gate(s): backfire x1" in text
    assert "FALSE ALARMS: 1 gate(s) can fail this run" in text and "START ORDER" in text
    assert "1 undecided (FAILED)" in text


def test_the_speed_table_tells_a_reported_only_failure_from_one_that_failed_the_run():
    from specgate.report.terminal import _verdict_text

    gate = {"gate": "throughput", "passed": False, "declared": None}
    assert _verdict_text([gate]) == "FAIL throughput"
    assert _verdict_text([{**gate, "gating": "report"}]) == "failed, reported only: throughput"
    assert _verdict_text([{**gate, "gate": "backfire", "passed": True}]) == "pass"


class _Events(list):
    def serve(self, session, mode, *, side=None, sleeper=None):
        self.append(f"start {side}")
        try:
            yield f"{mode.name}@{side}"
        finally:
            self.append(f"stop {side}")


@pytest.mark.parametrize("seed", [0, 1])
def test_the_side_the_seed_picks_starts_first_and_every_server_is_stopped(tmp_path, monkeypatch, seed):
    from specgate.plugin import fixtures

    events = _Events()
    monkeypatch.setattr(fixtures, "serve", events.serve)
    session = SpecgateSession(SessionOptions(
        rig_name="cpu-smollm2-quick", fixtures_dir=ROOT / "fixtures", baselines_path=tmp_path / "b.json",
        run_dir=tmp_path / "run", repo_root=ROOT, start_seed=seed, ab=AB()))
    mode = session.settings.rig.mode("ngram")
    first = SpecgateSession(SessionOptions(
        rig_name="cpu-smollm2-quick", fixtures_dir=ROOT / "fixtures", baselines_path=tmp_path / "b.json",
        run_dir=tmp_path / "run", repo_root=ROOT, start_seed=seed)).first_side("ngram")
    assert first == {0: "reference", 1: "candidate"}[seed]  # both paths of partner_server
    partner = fixtures.partner_server.__wrapped__(mode, session, None, None)
    reference = next(partner)
    server = fixtures.vllm_server.__wrapped__(mode, reference, session, None, None)
    candidate = next(server)
    assert (reference, candidate) == ("ngram@reference", "ngram@candidate")
    assert events == [f"start {first}", f"start {'candidate' if first == 'reference' else 'reference'}"]
    assert session.start_order == {"ngram": first}
    for gen in (server, partner):  # pytest tears down the dependent fixture first
        with pytest.raises(StopIteration):
            next(gen)
    assert sorted(e for e in events if e.startswith("stop")) == ["stop candidate", "stop reference"]
    assert not session.started_first


def test_with_no_gating_set_the_summary_says_what_gated_the_run():
    report = {"gates": [{"gate": "backfire", "passed": True}], "undecided": [],
              "outcome_policy": {"undecided": "skip", "not_stored": "fail", "other_machine": "skip", "not_run": "skip"}}
    (line,) = gating_lines(report)
    assert "every failed gate ([gates] gating unset), and of the outcomes that decide nothing: not_stored" in line


def test_the_xdist_controller_decides_deferred_gates_at_the_workers_family_confidence(tmp_path):
    def session(**kw):
        return SpecgateSession(SessionOptions(
            rig_name="cpu-smollm2", fixtures_dir=ROOT / "fixtures", baselines_path=tmp_path / "b.json",
            run_dir=tmp_path / "run", repo_root=ROOT, **kw))

    worker = session(gating={"backfire": "gate", "ttft": "gate"})
    worker = SpecgateSession(dataclasses.replace(worker.options, worker_id="gw0"))
    worker._settings = worker.settings.with_family(family(0.95, 0.05, 10))
    controller = session()
    controller.absorb_worker(json.loads(json.dumps(worker.worker_output())))
    assert controller.settings.window("ngram", "coding", 1).confidence == pytest.approx(0.99)
    assert controller.report_data(complete=True)["family"]["gating_decisions"] == 10


def test_under_auto_the_red_rate_is_held_by_default_and_the_undecided_part_is_stated(tmp_path):
    # Issue 52: the GPU A/B workflow's 30 gates at 2.5 % each would bound a false red at 75 %; under
    # gating = "auto" the session holds false FAILs at 5 % unless the rig says otherwise, and says that
    # a gating gate left undecided turns the run red too
    fixtures = copy_fixtures(tmp_path / "fixtures")
    rig_file = fixtures / "rigs" / "cpu-smollm2-quick.toml"
    rig_file.write_text(rig_file.read_text().replace("[gates]\n", '[gates]\ngating = "auto"\n', 1))
    session = SpecgateSession(SessionOptions(
        rig_name="cpu-smollm2-quick", fixtures_dir=fixtures, baselines_path=tmp_path / "b.json",
        run_dir=tmp_path / "run", repo_root=ROOT))
    session.plan_family([("backfire", "ngram", "extraction", 1), ("backfire", "ngram", "summarization", 1),
                         ("throughput", "ngram", "extraction", 1)])  # gates the rig does not leave out
    report = session.report_data(complete=True)
    assert report["family"]["family_false_alarm"] == 0.05 and report["family"]["bound"] == pytest.approx(0.05)
    assert report["family"]["undecided_red"] is True
    text = " ".join(gating_lines(report))
    assert "; in the session at most 5 % (Bonferroni" in text
    assert "stays undecided after its follow-up rounds turns it red as well" in text
