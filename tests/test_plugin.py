"""specgate's pytest wiring: parametrization, one server per mode, config errors at collection,
xdist refusal, and the update workflow of the stored figures (GateKeeper on recorded-shape measurements)."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from fixture_copy import copy_fixtures
from standins import gate_settings
from words import said

from specgate.config.rig import load_rig
from specgate.decide.gates import check_backfire
from specgate.decide.outcome import Outcome
from specgate.measure.client import RequestRecord
from specgate.measure.protocol import ClassMeasurement
from specgate.plugin.gatekeeper import GateKeeper
from specgate.plugin.resolve import SessionOptions
from specgate.plugin.session import SpecgateSession

pytestmark = pytest.mark.fast
pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
PERF_TESTS = (ROOT / "perf_tests" / "test_speculative_perf.py").read_text()


def test_setup_plan_starts_exactly_one_server_per_mode(perf_project):
    result = perf_project.runpytest("--setup-plan", "-m", "cpu", "-p", "no:cacheprovider")
    setups = [line for line in result.outlines if "SETUP    S vllm_server" in line]
    modes = [line.split("[")[1].split("]")[0] for line in result.outlines if "SETUP    S mode[" in line]
    assert len(setups) == 2, result.stdout.str()
    # a duet rig: the reference server starts first (with ngram's partner) and its own tests,
    # which reuse the reference side of ngram's windows, come last
    assert modes == ["Mode('ngram')", "Mode('no_spec')"]
    # 6 classes: throughput for both modes, plus acceptance/backfire/lossless/ttft for ngram.
    assert sum(1 for line in result.outlines if "test_perf.py::" in line) == 6 * 2 + 6 * 4


def test_an_option_path_that_loses_the_project_config_is_refused(pytester, tmp_path_factory):
    # Seen on the GPU lab and in the fault tests: "--specgate-run-dir /existing/dir" made pytest search its
    # config from "/", so the run went on without markers, xfail_strict or the right rootdir.
    copy_fixtures(pytester.path / "fixtures")
    pytester.makepyfile(test_perf=PERF_TESTS)
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\n'
                               'markers = ["perf: p", "cpu: c", "gpu: g", "speculative_only: s"]\n')
    outside = tmp_path_factory.mktemp("elsewhere")
    lost = pytester.runpytest("--collect-only", "-q", "-m", "cpu", "--specgate-run-dir", str(outside),
                              "-p", "no:cacheprovider")
    assert lost.ret == pytest.ExitCode.USAGE_ERROR
    assert f"took the path in '--specgate-run-dir {outside}' for a test path" in lost.stderr.str()
    assert "--specgate-run-dir=/tmp/x" in lost.stderr.str()
    kept = pytester.runpytest("--collect-only", "-q", "-m", "cpu", f"--specgate-run-dir={outside}",
                              "-p", "no:cacheprovider")
    assert kept.ret == pytest.ExitCode.OK, kept.stdout.str()
    # Another project (no fixtures/rigs) with specgate installed: none of the plugin's business.
    shutil.rmtree(pytester.path / "fixtures")
    pytester.makepyfile(test_perf="def test_other():\n    pass\n")
    other = pytester.runpytest("-q", "--specgate-run-dir", str(outside),
                              "-p", "no:cacheprovider")
    assert other.ret == pytest.ExitCode.OK, other.stdout.str() + other.stderr.str()


def test_fast_marker_deselects_every_perf_test(perf_project):
    result = perf_project.runpytest("--collect-only", "-q", "-m", "fast", "-p", "no:cacheprovider")
    # 36 perf tests, plus the 24 speculative-only or live-reference gates of the no-speculation mode
    # (dropped outside an A/B).
    assert "no tests collected (60 deselected)" in result.stdout.str()


def test_tier_marker_comes_from_the_rig(perf_project):
    result = perf_project.runpytest("--collect-only", "-q", "-m", "gpu", "--specgate-rig", "h200-smollm2",
                                    "-p", "no:cacheprovider")
    # The lab rig runs 2 classes: 5 modes x 2 throughput + 3 speculative modes x 4 gates x 2.
    assert sum("::" in line for line in result.outlines) == 34, result.stdout.str()


def test_corrupt_rig_file_is_a_usage_error_naming_file_and_key(perf_project):
    rig = perf_project.path / "fixtures" / "rigs" / "cpu-smollm2.toml"
    rig.write_text(rig.read_text().replace("startup_timeout_s = 600", "startup_timeout_s = 'soon'"))
    before = rig.read_bytes()
    result = perf_project.runpytest("--collect-only", "-m", "cpu", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cpu-smollm2.toml: startup_timeout_s: *"])
    assert rig.read_bytes() == before


@pytest.mark.parametrize("tier", ["cpu", "gpu"])
def test_unknown_rig_lists_the_known_ones(perf_project, tier):
    # -m gpu checks the rig's tier too, for every collected item (a project has other tests beside the
    # perf ones): that check must not turn the refusal into an INTERNALERROR
    perf_project.makepyfile(test_other="def test_other():\n    assert True\n")
    result = perf_project.runpytest("--collect-only", "-m", tier, "--specgate-rig", "nope", "-p", "no:cacheprovider")
    result.stderr.fnmatch_lines(["*no rig named 'nope'*cpu-smollm2*h200-smollm2*"])
    assert "INTERNALERROR" not in result.stdout.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # bad input, naming the rig file (not an interrupted run)


def test_a_rig_file_outside_the_fixtures_folder_is_taken_by_path(perf_project, tmp_path_factory):
    outside = tmp_path_factory.mktemp("elsewhere") / "my-rig.toml"
    outside.write_text((perf_project.path / "fixtures" / "rigs" / "cpu-smollm2.toml").read_text())
    result = perf_project.runpytest("--collect-only", "-q", "-m", "cpu", f"--specgate-rig={outside}",
                                    "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()
    assert any("[no_spec-coding-c1]" in line for line in result.outlines)


def test_a_missing_rig_file_is_refused_at_parse_time_naming_it(perf_project, tmp_path):
    result = perf_project.runpytest("--collect-only", "-m", "cpu", f"--specgate-rig={tmp_path}/nope.toml")
    assert result.ret == 4
    result.stderr.fnmatch_lines([f"*rig file '{tmp_path}/nope.toml' does not exist*"])


def test_the_fixtures_folder_comes_from_the_environment_and_a_bad_one_is_named(perf_project, monkeypatch):
    moved = perf_project.path / "elsewhere"
    (perf_project.path / "fixtures").rename(moved)
    monkeypatch.setenv("SPECGATE_FIXTURES", str(moved))
    ok = perf_project.runpytest("--collect-only", "-q", "-m", "cpu", "-p", "no:cacheprovider")
    assert ok.ret == 0, ok.stdout.str()
    monkeypatch.delenv("SPECGATE_FIXTURES")
    lost = perf_project.runpytest("--collect-only", "-q", "-m", "cpu", "-p", "no:cacheprovider")
    assert lost.ret == pytest.ExitCode.USAGE_ERROR
    lost.stderr.fnmatch_lines([f"*{perf_project.path / 'fixtures'} is not a specgate fixtures folder (no modes.toml "
                               "and no prompts.toml)*--specgate-fixtures DIR*SPECGATE_FIXTURES*"])


def test_the_older_unprefixed_options_are_gone(perf_project):
    # a plugin loads into every pytest run of its environment: an unprefixed --gpus or --run-dir that
    # another project's conftest also defines would stop pytest from starting
    for old in ("--rig=cpu-smollm2", "--run-dir=x", "--gpus=0", "--time-budget=5"):
        result = perf_project.runpytest("--collect-only", "-q", old)
        assert result.ret == 4, old
        result.stderr.fnmatch_lines([f"*unrecognized arguments: {old}*"])


def test_perf_tiers_refuse_xdist_before_any_fixture_runs(tmp_path):
    # A real `-n 2` run takes ~10 s to spawn workers; the hook's decision is what matters here.
    from types import SimpleNamespace

    from specgate.plugin import pytest_runtest_setup
    from specgate.plugin.configure import SESSION_KEY

    session = _session(tmp_path)

    def item(worker: bool, perf: bool, gpus: str | None = None):
        session._settings = dataclasses.replace(session.settings, worker_gpus=gpus)
        config = SimpleNamespace(stash={SESSION_KEY: session})
        if worker:
            config.workerinput = {"workerid": "gw0"}
        return SimpleNamespace(config=config, get_closest_marker=lambda name: object() if perf else None)

    with pytest.raises(pytest.fail.Exception, match="refuse pytest-xdist"):
        pytest_runtest_setup(item(worker=True, perf=True))
    pytest_runtest_setup(item(worker=True, perf=False))  # fast tests run under -n 2
    pytest_runtest_setup(item(worker=False, perf=True))  # perf tests run without -n
    pytest_runtest_setup(item(worker=True, perf=True, gpus="1"))  # a gpu worker with its own GPU


def test_each_worker_gets_its_own_gpus():
    from specgate.plugin.gpu_split import assign_worker_gpus

    visible = ["0", "1", "2", "3", "4", "5", "6", "7"]
    one_each = [assign_worker_gpus(visible, i, 8, 1) for i in range(8)]
    assert one_each == visible  # 8 workers, 8 GPUs: never two servers on one GPU
    pairs = [assign_worker_gpus(visible, i, 4, 2) for i in range(4)]
    assert pairs == ["0,1", "2,3", "4,5", "6,7"]  # tensor parallel 2
    assert assign_worker_gpus(["3", "1"], 1, 2, 1) == "1"  # the visible order is kept
    with pytest.raises(pytest.UsageError, match="need 4 GPUs, but 2 are available"):
        assign_worker_gpus(["0", "1"], 0, 2, 2)


def test_worker_reports_are_merged_on_the_controller(tmp_path):
    controller = _session(tmp_path)
    worker = _session(tmp_path)
    worker = SpecgateSession(dataclasses.replace(worker.options, worker_id="gw1"))
    worker.measurements[("ngram", "coding", 1)] = _measurement("ngram", [40.0] * 3)
    worker.queue_update(worker.measurements[("ngram", "coding", 1)],
                        __import__("specgate.decide.entry", fromlist=["baseline_entry"]).baseline_entry(
                            worker.measurements[("ngram", "coding", 1)],
                            __import__("specgate.store.baselines", fromlist=["Fingerprint"]).Fingerprint()))
    controller.measurements[("no_spec", "coding", 1)] = _measurement("no_spec", [30.0] * 3)

    controller.absorb_worker(json.loads(json.dumps(worker.worker_output())))

    merged = controller.report_data(complete=True)
    assert {(m["mode"], m["prompt_class"]) for m in merged["measurements"]} == {("no_spec", "coding"),
                                                                               ("ngram", "coding")}
    assert ("cpu-smollm2", "ngram", "coding", 1) in controller.pending_updates


def test_the_controller_decides_cross_mode_gates_that_workers_deferred(tmp_path):
    from specgate.plugin.controller import decide_deferred_gates, deferred_test_reports

    # extraction: the cpu rig declares ngram's backfire on the prose/code classes, not on this one
    controller = _session(tmp_path)
    for worker_id, m in (("gw0", _measurement("ngram", [20.0] * 6, "extraction")),
                         ("gw1", _measurement("no_spec", [30.0] * 6, "extraction"))):
        worker = _session(tmp_path)
        worker = SpecgateSession(dataclasses.replace(worker.options, worker_id=worker_id))
        worker.measurements[(m.mode, "extraction", 1)] = m
        if m.mode == "ngram":
            worker.deferred.append(("ngram", "extraction", 1))
            for gate in ("backfire", "lossless"):
                nodeid = f"perf_tests/test_speculative_perf.py::test_{gate}[ngram-extraction-c1]@ngram"
                worker.deferred_tests[nodeid] = [gate, "ngram", "extraction", 1]
        controller.absorb_worker(json.loads(json.dumps(worker.worker_output())))

    assert decide_deferred_gates(controller) is True
    backfire = [r for r in controller.results if r.gate == "backfire"]
    assert len(backfire) == 1 and "ngram is 33 % slower than no speculation on extraction" in said(backfire[0])

    # Each deferred test gets the controller's verdict as a test report (terminal, JUnit, exit code).
    reports = {r.nodeid: r for r in deferred_test_reports(controller)}
    failed = reports["perf_tests/test_speculative_perf.py::test_backfire[ngram-extraction-c1-controller]"]
    assert failed.outcome == "failed" and failed.when == "call"
    assert str(failed.longrepr).startswith("ngram extraction c1 backfire: 0.667x of no speculation (")
    assert str(failed.longrepr).endswith(" [xdist controller]")
    lossless = reports["perf_tests/test_speculative_perf.py::test_lossless[ngram-extraction-c1-controller]"]
    assert lossless.outcome == "passed"


def test_h200_rig_sets_up_each_of_its_five_mode_servers_once(perf_project):
    # Regression: speculative-only tests once got a shorter mode list, so pytest saw other param
    # indices for the same mode and restarted servers (9 starts for 4 modes on the GPU lab).
    result = perf_project.runpytest("--setup-plan", "-m", "gpu", "--specgate-rig", "h200-smollm2",
                                    "-p", "no:cacheprovider")
    assert sum("SETUP    S vllm_server" in line for line in result.outlines) == 5, result.stdout.str()


def test_a_worker_reads_the_reference_window_another_worker_measured(tmp_path):
    measuring = _session(tmp_path)
    measuring = SpecgateSession(dataclasses.replace(measuring.options, worker_id="gw0"))
    waiting = _session(tmp_path)
    waiting = SpecgateSession(dataclasses.replace(waiting.options, worker_id="gw1"))
    measuring._share(("no_spec", "coding", 1), _measurement("no_spec", [30.0] * 3).to_dict())

    reference = waiting.reference_measurement("coding", 1, wait_s=5)

    assert reference is not None and reference.decode_tokens_per_s == pytest.approx([30.0] * 3)
    assert waiting.reference_measurement("math", 1, wait_s=0.1) is None  # bounded wait, then None


def test_attach_mode_runs_only_the_named_mode(perf_project):
    result = perf_project.runpytest("--collect-only", "-q", "-m", "cpu", "--specgate-vllm-url", "http://127.0.0.1:9",
                                    "--specgate-vllm-mode", "ngram", "-p", "no:cacheprovider")
    tests = [line for line in result.outlines if "::" in line]
    assert tests and all("[ngram-" in line for line in tests)


def test_bad_attach_url_is_rejected_at_parse_time(perf_project):
    result = perf_project.runpytest("--specgate-vllm-url", "localhost:8000")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "not an http(s) URL" in result.stderr.str()


# -- the stored-figures workflow, on measurements shaped like real ones -------------------------------
def _measurement(mode: str, tps: list[float], prompt_class: str = "coding") -> ClassMeasurement:
    records = []
    for i, rate in enumerate(tps):
        span = 63 / rate  # 64 tokens: (64 - 1) / span == rate
        records.append(RequestRecord(
            request_id=f"{mode}/{prompt_class}/p{i}#0", mode=mode, prompt_class=prompt_class, prompt_id=f"p{i}",
            concurrency=1, started_at=0.0, first_token_at=0.1, last_token_at=0.1 + span,
            finished_at=0.1 + span, chunk_times=[0.1, 0.1 + span], prompt_tokens=10, completion_tokens=64,
            text=f"output {i}", finish_reason="length"))
    return ClassMeasurement(rig="cpu-smollm2", mode=mode, prompt_class=prompt_class, concurrency=1, records=records,
                            acceptance=None, server_decode_tokens_per_s=None, server_metric_source=None, wall_s=1.0)


def _session(tmp_path: Path, update: str = "off") -> SpecgateSession:
    return SpecgateSession(SessionOptions(
        rig_name="cpu-smollm2", fixtures_dir=ROOT / "fixtures", baselines_path=tmp_path / "baselines.json",
        run_dir=tmp_path / "run", repo_root=ROOT, update=update))


def test_missing_baseline_fails_with_the_command_that_creates_it(tmp_path):
    session = _session(tmp_path)
    with pytest.raises(pytest.fail.Exception, match=r"^no_spec coding c1 throughput: nothing stored; python -m "
                                                    r"specgate build-history --rig cpu-smollm2 --starts 10 \[fails"):
        GateKeeper(session).throughput(_measurement("no_spec", [30.0] * 6))
    (undecided,) = session.report_data(complete=True)["undecided"]
    assert (undecided["gate"], undecided["kind"], undecided["mode"]) == ("throughput", "no stored figures", "no_spec")


def test_a_left_out_throughput_gate_kept_to_measure_skips_saying_so(tmp_path):
    # kept only where a sequential rig's other gates read the window (tests/test_cost.py): never decides
    fixtures = copy_fixtures(tmp_path / "fixtures")
    rig = fixtures / "rigs/cpu-smollm2.toml"
    rig.write_text(rig.read_text() + '\n[gates.left_out]\nthroughput = "levels move between machines"\n')
    session = SpecgateSession(SessionOptions(
        rig_name="cpu-smollm2", fixtures_dir=fixtures, baselines_path=tmp_path / "baselines.json",
        run_dir=tmp_path / "run", repo_root=ROOT))
    with pytest.raises(pytest.skip.Exception, match=r"^no_spec coding c1 throughput: left out by rig cpu-smollm2; "
                                                    r"measured for the other modes' gates$"):
        GateKeeper(session).throughput(_measurement("no_spec", [30.0] * 6))
    assert session.results == [] and session.undecided == []


def test_a_left_out_gate_kept_to_measure_is_not_of_the_family(tmp_path):
    fixtures = copy_fixtures(tmp_path / "fixtures")
    rig = fixtures / "rigs/h200-smollm2-acceptance.toml"
    rig.write_text(rig.read_text().replace("[gates]\n", "[gates]\nfamily_false_alarm = 0.05\n")
                   + '\n[gates.left_out]\nthroughput = "levels move between machines"\n')

    def session() -> SpecgateSession:
        return SpecgateSession(SessionOptions(
            rig_name="h200-smollm2-acceptance", fixtures_dir=fixtures, baselines_path=tmp_path / "b.json",
            run_dir=tmp_path / "run", repo_root=ROOT))

    gates = [("backfire", "ngram", "coding", 1), ("lossless", "ngram", "coding", 1),
             ("acceptance", "draft_l6", "coding", 1), ("backfire", "draft_l6", "coding", 1)]
    with_kept, without = session(), session()
    with_kept.plan_family([("throughput", "no_spec", "coding", 1), *gates])
    without.plan_family(gates)
    confidence = without.settings.window("ngram", "coding", 1).confidence
    assert without.settings.family.gating == 3 and confidence == pytest.approx(1 - 2 * 0.05 / 3)
    assert with_kept.settings.window("ngram", "coding", 1).confidence == confidence
    reference = _measurement("no_spec", [30.0] * 6)
    assert with_kept.gates_selected_for(reference) == set()  # no follow-up rounds for a gate that never decides


def test_update_fails_then_a_plain_run_passes_then_a_slowdown_fails(tmp_path):
    measured = [30.0, 31.0, 29.5, 30.5, 30.2, 29.8]
    updating = _session(tmp_path, update="update")
    with pytest.raises(pytest.fail.Exception, match="never passes silently"):
        GateKeeper(updating).throughput(_measurement("no_spec", measured))
    assert not (tmp_path / "baselines.json").exists()  # written once, at the end of the session
    updating.flush_updates()
    stored = json.loads((tmp_path / "baselines.json").read_text())
    (history,) = stored["rigs"]["cpu-smollm2"]["no_spec"]["coding"]["1"]
    assert history["n"] == 6 and history["starts"][0]["machine"] == updating.settings.machine

    GateKeeper(_session(tmp_path)).throughput(_measurement("no_spec", [x * 1.01 for x in measured]))

    # 30 % slower against a level from another start: the rig's 10 % start noise keeps the interval
    # across the 0.75 line, so the gate says undecided (skipped, listed), never "passed"
    session = _session(tmp_path)
    with pytest.raises(pytest.skip.Exception, match=r"^no_spec coding c1 throughput: 0\.700x of stored level \("
                                                    r"0\.\d+-0\.\d+\) spans 0\.75 line \[6 pairs\] \[undecided\]$"):
        GateKeeper(session).throughput(_measurement("no_spec", [x * 0.7 for x in measured]))
    assert [u["kind"] for u in session.undecided] == ["undecided"]

    with pytest.raises(pytest.fail.Exception, match=r"^no_spec coding c1 throughput: 0\.500x of stored level .* < "):
        GateKeeper(_session(tmp_path)).throughput(_measurement("no_spec", [x * 0.5 for x in measured]))


def test_regen_writes_and_passes(tmp_path):
    session = _session(tmp_path, update="regen")
    GateKeeper(session).throughput(_measurement("no_spec", [30.0] * 6))
    assert session.flush_updates() == tmp_path / "baselines.json"


# -- requests without a decode rate (the CI failure of stop 10) ---------------------------------
def _untimed(m: ClassMeasurement, index: int, **changes) -> ClassMeasurement:
    """Make one request of ``m`` give no decode rate (by default a one-token answer)."""
    m.records[index] = dataclasses.replace(m.records[index], **(changes or {"completion_tokens": 1}))
    return m


def test_backfire_pairs_on_the_requests_both_modes_timed():
    # Real CI, stop 10: no speculation on coding had 5 timed requests of 6, ngram 6 of 6;
    # the backfire gate raised "paired comparison ... needs samples of equal length".
    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    reference = _untimed(_measurement("no_spec", [33.0, 32.9, 32.8, 33.7, 34.4, 33.1]), 2)
    ngram = _measurement("ngram", [27.5, 29.5, 29.2, 43.0, 31.9, 31.0])
    result = check_backfire(gate_settings(rig, ngram), ngram, reference)
    assert result.details["n"] == 5  # 5 pairs: too few for an interval, and the message says so
    assert "Hodges-Lehmann" in result.details["method"] and "too few for an interval" in said(result)
    assert "p2#0 (no speculation) (1 token(s) generated)" in said(result)
    assert "left out (timed on one side only): p2#0" in said(result)


def _stored_then_fresh(tmp_path: Path, measured: list[float]) -> SpecgateSession:
    """Store no_spec's figures on coding from ``measured`` (an --specgate-update-baselines session), then
    return a plain session that gates against them."""
    updating = _session(tmp_path, update="update")
    with pytest.raises(pytest.fail.Exception):
        GateKeeper(updating).throughput(_measurement("no_spec", measured))
    updating.flush_updates()
    return _session(tmp_path)


def test_throughput_names_the_request_without_a_decode_rate(tmp_path):
    measured = [30.0, 31.0, 29.5, 30.5, 30.2, 29.8]
    session = _stored_then_fresh(tmp_path, measured)
    # 5 timed pairs give the stored level no interval: undecided (skipped), the untimed request named
    with pytest.raises(pytest.skip.Exception, match=r"\(no interval\) .*\[5 pairs\] \[undecided\]$"):
        GateKeeper(session).throughput(_untimed(_measurement("no_spec", measured), 0, last_token_at=0.1))
    (entry,) = session.undecided
    assert entry["details"]["n"] == 5
    assert "p0#0 (all 64 tokens arrived in one chunk)" in entry["message"]


def test_a_sequential_rig_measures_the_reference_first_whatever_its_order(tmp_path):
    fixtures = tmp_path / "fixtures"
    copy_fixtures(fixtures)
    rig = fixtures / "rigs" / "cpu-smollm2.toml"
    text = rig.read_text().replace("duet = true", "duet = false")
    rig.write_text(text.replace("[modes.no_spec]\n[modes.ngram]", "[modes.ngram]\n[modes.no_spec]"))
    session = SpecgateSession(SessionOptions(rig_name="cpu-smollm2", fixtures_dir=fixtures,
                                             baselines_path=tmp_path / "b.json", run_dir=tmp_path, repo_root=tmp_path))
    assert [m.name for m in session.settings.rig.modes] == ["ngram", "no_spec"]
    assert [m.name for m in session.modes_to_run()] == ["no_spec", "ngram"]


# -- a window whose client timings disagree with the server's own -------------------------------------
def _with_server_rate(m: ClassMeasurement, factor: float) -> ClassMeasurement:
    """Give ``m`` the server-side decode rate that its requests' timings would give times ``factor``."""
    m.server_decode_tokens_per_s = m.client_decode_tokens_per_s * factor
    return m


def test_backfire_is_undecided_when_the_client_timed_a_window_wrongly():
    # Seen for real (this session, a local cpu calibration with a busy loop on the client's CPU): the
    # client read the streams in bursts and timed a server decoding ~19 tok/s at 245,643 tok/s.
    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    reference = _with_server_rate(_measurement("no_spec", [30.0, 31.0, 29.5, 30.5, 30.2, 29.8]), 1.0005)
    starved = _with_server_rate(_measurement("ngram", [245_643.0, 19.1, 262_931.6, 19.0, 18.5, 19.2]), 0.001)
    result = check_backfire(gate_settings(rig, starved), starved, reference)
    assert result.outcome is Outcome.UNDECIDED and not result.passed
    assert "undecided: the client timed ngram at" in said(result)
    assert "client_server_tolerance" in said(result) and "not measurements" in said(result)
    # the same windows, timed right (client within 0.05 % of the server): decided on the pairs as before
    honest = _with_server_rate(_measurement("ngram", [20.0, 21.0, 19.5, 20.5, 20.2, 19.8]), 0.9995)
    decided = check_backfire(gate_settings(rig, honest), honest, reference)
    assert not decided.passed and decided.details["method"].startswith("Hodges-Lehmann")


def test_throughput_is_undecided_when_its_window_was_timed_wrongly(tmp_path):
    measured = [30.0, 31.0, 29.5, 30.5, 30.2, 29.8]
    session = _stored_then_fresh(tmp_path, measured)
    # 8 % apart: over the rig's default 5 % (a correct run: <= 0.1 % on cpu, <= 0.33 % in the lab)
    with pytest.raises(pytest.skip.Exception, match=r"\[undecided\]$"):
        GateKeeper(session).throughput(_with_server_rate(_measurement("no_spec", measured), 1.08))
    assert "(0.93x it; the rig allows ±5 %" in session.undecided[0]["message"]
    assert [u["kind"] for u in session.undecided] == ["undecided"]


def test_the_time_budget_becomes_the_measurers_deadline(tmp_path):
    # --specgate-session-budget=DURATION -> SessionOptions.time_budget_s -> the Measurer's deadline, counted from the
    # session's start; without it, nothing bounds the follow-ups.
    session = _session(tmp_path)
    assert session.measurer.deadline is None
    bounded = SpecgateSession(dataclasses.replace(_session(tmp_path).options, time_budget_s=1800.0))
    assert bounded.measurer.deadline == bounded.options.started_at + 1800.0
