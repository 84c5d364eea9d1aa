"""The session's cost in the plugin (specgate.plugin.cost): the order that decides backfire first
without starting a server twice, the whole-session budget (NOT RUN, reported with the reason),
and the plan printed at the start of a run."""

import json
from pathlib import Path

import pytest

from specgate.plugin.options import parse_duration

pytestmark = pytest.mark.fast
pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent


def _ids(result) -> list[str]:
    return [line.split("::")[1] for line in result.outlines if "test_perf.py::" in line and " " not in line]


def test_each_window_runs_its_gates_backfire_first_and_each_server_still_starts_once(perf_project):
    collected = perf_project.runpytest("--collect-only", "-q", "-m", "cpu", "-p", "no:cacheprovider")
    ids = _ids(collected)
    assert ids[:5] == ["test_backfire[ngram-coding-c1]", "test_throughput[ngram-coding-c1]",
                       "test_lossless[ngram-coding-c1]", "test_acceptance[ngram-coding-c1]",
                       "test_ttft[ngram-coding-c1]", "test_backfire[ngram-math-c1]"][:5]
    # every ngram test before every no_spec one: one block per server
    modes = [i.split("[")[1].split("-")[0] for i in ids]
    assert modes == ["ngram"] * 30 + ["no_spec"] * 6
    plan = perf_project.runpytest("--setup-plan", "-m", "cpu", "-p", "no:cacheprovider")
    assert sum("SETUP    S vllm_server" in line for line in plan.outlines) == 2, plan.stdout.str()


def test_the_order_keeps_a_sequential_rig_s_modes_together(perf_project):
    collected = perf_project.runpytest("--collect-only", "-q", "-m", "gpu", "--specgate-rig", "h200x2-smollm2-pp2",
                                       "-p", "no:cacheprovider")
    ids = _ids(collected)
    modes = [i.split("[")[1].split("-")[0] for i in ids]
    assert modes == ["no_spec"] * 2 + ["no_spec_pp2"] * 2, ids  # the reference first, one block per server
    assert [i.split("[")[1].split("-")[1] for i in ids] == ["coding", "extraction"] * 2


def test_windows_that_do_not_fit_the_session_budget_are_not_run_and_reported(perf_project, no_plots, tmp_path):
    run_dir = tmp_path / "run"
    result = perf_project.runpytest_inprocess(
        "-m", "cpu", "-k", "coding", "-p", "no:cacheprovider", f"--specgate-baselines={ROOT / 'baselines.json'}",
        "--specgate-session-budget=1", f"--specgate-run-dir={run_dir}", "-rs")
    out = result.stdout.str()
    # 4 ngram gates: no server started; throughput against another machine's figures is not run here
    result.assert_outcomes(skipped=4)
    assert "specgate: not run here: 2 throughput gate(s) with only another machine's stored figures" in out
    assert "ngram coding c1 backfire: the session's time budget (1s) has 0s left; its window needs ~" in out
    assert "(with the start of no_spec, ngram)" in out  # the first window would start both servers
    report = json.loads((run_dir / "report.json").read_text())
    assert report["measurements"] == [] and report["servers"] == {}
    not_run = sorted((u["gate"], u["mode"]) for u in report["undecided"] if u["kind"] == "not run")
    assert not_run == [("acceptance", "ngram"), ("backfire", "ngram"), ("lossless", "ngram"), ("ttft", "ngram")]
    # the summary (report.json's, merged across xdist workers) lists each with its reason, and counts them
    assert "NOT RUN ngram coding c1 backfire: the session's time budget (1s)" in out
    assert "DECIDED NOTHING: 4 gate(s): 4 not run (skipped)" in out


def test_a_one_mode_level_gate_with_only_another_machine_s_history_starts_no_server(perf_project, tmp_path):
    # The GPU lab's two-machine campaign (docs/journal/lab/two-machine-history.md): on machine B, a plain run of
    # a one-mode sequential rig against machine A's history started a server before saying "other machine".
    baselines = ROOT / "docs/evidence/lab/two-machine-history/HA/baselines.json"
    result = perf_project.runpytest("--collect-only", "-q", "-m", "gpu", "--specgate-rig=h200-wide15b-history",
                                    f"--specgate-baselines={baselines}", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert "specgate: not run here: 1 throughput gate(s) with only another machine's stored figures" in out
    assert "test_throughput[" not in out
    # storing figures runs it: that is how this machine's history starts
    stored = perf_project.runpytest("--collect-only", "-q", "-m", "gpu", "--specgate-rig=h200-wide15b-history",
                                    f"--specgate-baselines={baselines}", "--specgate-update-baselines",
                                    "-p", "no:cacheprovider")
    assert "test_throughput[no_spec-coding-c1]" in stored.stdout.str()


def test_a_sequential_rig_keeps_the_reference_window_its_other_modes_read(perf_project, tmp_path):
    # another machine's histories for every window of a sequential rig with speculative modes
    store = json.loads((ROOT / "docs/evidence/lab/two-machine-history/HA/baselines.json").read_text())
    entries = store["rigs"]["h200-wide15b-history"]["no_spec"]["coding"]["1"]
    store["rigs"] = {"h200-smollm2-acceptance": {mode: {c: {"1": entries} for c in ("coding", "extraction")}
                                                 for mode in ("no_spec", "ngram", "draft_l6")}}
    baselines = tmp_path / "elsewhere.json"
    baselines.write_text(json.dumps(store))
    args = ["--collect-only", "-q", "-m", "gpu", "--specgate-rig=h200-smollm2-acceptance",
            f"--specgate-baselines={baselines}", "-p", "no:cacheprovider"]
    ids = _ids(perf_project.runpytest(*args))
    assert [i for i in ids if i.startswith("test_throughput")] == [
        "test_throughput[no_spec-coding-c1]", "test_throughput[no_spec-extraction-c1]"]  # the backfire gates read them
    assert "test_backfire[ngram-coding-c1]" in ids
    # with no gate that reads it (-k), the reference's window is left out too
    only = _ids(perf_project.runpytest(*args, "-k", "throughput"))
    assert only == []


def test_a_sequential_rig_leaving_out_throughput_still_measures_the_reference_its_other_gates_read(perf_project):
    # [gates] left_out = throughput dropped the reference's throughput test, which measures the window a
    # sequential rig's backfire, lossless and TTFT gates read: they had no reference to compare with
    rig = perf_project.path / "fixtures/rigs/h200-smollm2-acceptance.toml"
    rig.write_text(rig.read_text() + '\n[gates.left_out]\nthroughput = "levels move between leases"\n')
    args = ["--collect-only", "-q", "-m", "gpu", "--specgate-rig=h200-smollm2-acceptance", "-p", "no:cacheprovider"]
    result = perf_project.runpytest(*args)
    ids = _ids(result)
    assert [i for i in ids if i.startswith("test_throughput")] == [
        "test_throughput[no_spec-coding-c1]", "test_throughput[no_spec-extraction-c1]"]
    assert "test_backfire[ngram-coding-c1]" in ids
    assert "left out by rig h200-smollm2-acceptance: throughput (levels move between leases)" in result.stdout.str()
    # no gate that reads the reference: nothing of it is kept
    assert _ids(perf_project.runpytest(*args, "-k", "throughput")) == []


def test_the_plan_is_printed_before_anything_starts(perf_project, no_plots, tmp_path):
    result = perf_project.runpytest_inprocess(
        "-m", "cpu", "-k", "extraction", "-p", "no:cacheprovider", f"--specgate-baselines={ROOT / 'baselines.json'}",
        "--specgate-session-budget=1", f"--specgate-run-dir={tmp_path / 'run'}")
    out = result.stdout.str()
    assert "[specgate] specgate plan: rig cpu-smollm2 (duet): 2 server(s), 1 window(s)" in out
    assert "session budget: 1s (--specgate-session-budget)" in out
    assert "is over it, so the session ends within the budget" in out
    assert out.index("specgate plan:") < out.index("NOT RUN")


@pytest.mark.parametrize(("text", "seconds"), [("1500", 1500), ("90s", 90), ("25m", 1500), ("1h30m", 5400),
                                               ("2h", 7200)])
def test_a_session_budget_is_a_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5", "m", "ten minutes", "5x"])
def test_a_session_budget_that_is_not_a_duration_is_refused(text):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="duration"):
        parse_duration(text)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _item(session, gate: str, mode: str, prompt_class: str, stash: dict):
    from types import SimpleNamespace

    rig = session.settings.rig
    params = {"mode": rig.mode(mode), "prompt_class": next(c for c in rig.prompt_classes if c.name == prompt_class),
              "concurrency": 1}
    return SimpleNamespace(callspec=SimpleNamespace(params=params), fixturenames=("vllm_server", "class_measurement"),
                           originalname=f"test_{gate}", name=f"test_{gate}[{mode}-{prompt_class}-c1]",
                           nodeid=f"perf::test_{gate}[{mode}-{prompt_class}-c1]", config=SimpleNamespace(stash=stash))


def test_the_budget_runs_what_fits_at_the_measured_pace_and_leaves_follow_ups_what_later_windows_leave(tmp_path):
    from types import SimpleNamespace

    from specgate.plan.estimate import plan_session, stored_rates
    from specgate.plan.progress import SessionProgress
    from specgate.plugin.cost import COST_KEY, SessionCost, check_budget, session_state
    from specgate.plugin.resolve import SessionOptions
    from specgate.plugin.session import SpecgateSession
    from specgate.store.baselines import load_baselines

    clock = Clock(1000.0)
    session = SpecgateSession(SessionOptions(rig_name="cpu-smollm2", fixtures_dir=ROOT / "fixtures",
                                             baselines_path=ROOT / "baselines.json", run_dir=tmp_path,
                                             repo_root=ROOT, time_budget_s=800.0, started_at=clock.now))
    rates = stored_rates(load_baselines(ROOT / "baselines.json"), "cpu-smollm2")
    windows = [("ngram", "coding", 1), ("ngram", "extraction", 1)]
    plan = plan_session(session.settings.rig, windows, rates)
    coding, extraction = (plan.window(k).seconds for k in windows)
    progress = SessionProgress(plan, session_state(session), started_at=clock.now, clock=clock)
    stash = {COST_KEY: SessionCost(plan, progress, rates)}

    check_budget(_item(session, "backfire", "ngram", "coding", stash), session, clock=clock)  # fits: runs
    starts = sum(s.startup_s for s in plan.servers)
    spare = 800 - (coding + starts) - extraction  # what the later window's first look leaves
    assert session.measurer.deadline == pytest.approx(clock.now + coding + spare)

    # the window took twice the plan: the next one is expected to as well, and does not fit
    session.measurements[windows[0]] = SimpleNamespace(wall_s=2 * coding)
    session.servers.update({"no_spec": {}, "ngram": {}})
    clock.now += starts + 2 * coding
    left = 800 - (starts + 2 * coding)
    assert left < 2 * extraction
    with pytest.raises(pytest.skip.Exception, match=r"^ngram extraction c1 backfire: .* \[not run\]$"):
        check_budget(_item(session, "backfire", "ngram", "extraction", stash), session, clock=clock)
    assert [(u["gate"], u["prompt_class"], u["kind"]) for u in session.undecided] == [
        ("backfire", "extraction", "not run")]
    # a gate of a window already measured always runs: it costs nothing
    check_budget(_item(session, "lossless", "ngram", "coding", stash), session, clock=clock)


def test_kept_servers_are_refused_under_xdist(perf_project):
    # a worker starting its mode stops the rig's other kept servers: under xdist one of those may be
    # another worker's live server
    result = perf_project.runpytest("--collect-only", "-q", "-m", "cpu", "-n", "1", "--specgate-keep-servers",
                                    "-p", "no:cacheprovider")
    assert result.ret != 0
    assert "--specgate-keep-servers runs in one process" in "\n".join(result.errlines + result.outlines)
