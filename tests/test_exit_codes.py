"""Exit codes that say what happened (specgate.exit_codes; the table in docs/reports-and-ci.md):
pytest's own codes, and 6 for a job that broke. One test per code, through whole runs where a
whole run is what decides the code; the cpu tier adds a real server killed during a window
(perf_tests/test_faults.py)."""

import sys
import textwrap
from pathlib import Path

import pytest
from fixture_copy import copy_fixtures

import specgate.serve.server
from specgate.cli import main
from specgate.exit_codes import ExitCode, broken_job, session_exit_code

pytestmark = pytest.mark.fast
pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
PERF_INI = "[pytest]\nmarkers =\n    perf: p\n    cpu: c\n    gpu: g\n    speculative_only: s\n"


def test_the_codes_are_pytests_plus_one_for_a_broken_job():
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4, 5, 6]
    for name in ("OK", "INTERRUPTED", "INTERNAL_ERROR", "USAGE_ERROR"):
        assert ExitCode[name] == pytest.ExitCode[name]
    assert ExitCode.GATE_FAILED == pytest.ExitCode.TESTS_FAILED
    assert ExitCode.NO_TESTS == pytest.ExitCode.NO_TESTS_COLLECTED


BROKEN = {"server_failures": [{"server": "ngram@candidate", "error": "exited with code -9\nlog tail"}],
          "failures": [{"mode": "no_spec", "prompt_class": "coding", "concurrency": 1,
                        "error": "server no_spec died during the run"}]}


def test_a_broken_job_outranks_a_failed_gate_and_nothing_else():
    assert broken_job(BROKEN) == ["server ngram@candidate could not start: exited with code -9",
                                  "window no_spec / coding / c1 not measured: server no_spec died during the run"]
    assert broken_job({"failures": [], "server_failures": []}) == []
    for pytest_status in (0, 1):
        assert session_exit_code(pytest_status, BROKEN) == ExitCode.JOB_BROKEN
        assert session_exit_code(pytest_status, {"failures": []}) == pytest_status
    for kept in (2, 3, 4, 5):  # an interrupt, an internal or a usage error, nothing run: pytest's code stands
        assert session_exit_code(kept, BROKEN) == kept


# -- whole runs: one per code ------------------------------------------------------------------------
GATE = textwrap.dedent('''
    import os

    from specgate.decide.verdict import GateResult
    from specgate.decide.outcome import Outcome


    def test_gate(gatekeeper):
        outcome = Outcome[os.environ["GATE_OUTCOME"]]
        gatekeeper._finish(GateResult("throughput", "ngram", "coding", 1, outcome, "stand-in verdict"))
''')


@pytest.fixture
def gate_project(pytester: pytest.Pytester) -> pytest.Pytester:
    copy_fixtures(pytester.path / "fixtures")
    pytester.makepyfile(test_gate=GATE)
    return pytester


@pytest.mark.parametrize(("outcome", "code"), [("PASS", ExitCode.OK), ("FAIL", ExitCode.GATE_FAILED)])
def test_0_every_gate_passed_and_1_a_gate_said_no(gate_project, monkeypatch, outcome, code):
    monkeypatch.setenv("GATE_OUTCOME", outcome)
    assert gate_project.runpytest("-p", "no:cacheprovider").ret == code


def test_2_interrupted_by_an_error_while_collecting(gate_project):
    # Ctrl-C gives the same code: perf_tests/test_faults.py sends a real SIGINT to a cpu-tier run
    gate_project.makepyfile(test_broken="import no_such_module_anywhere\n")
    assert gate_project.runpytest("-p", "no:cacheprovider").ret == ExitCode.INTERRUPTED


def test_3_internal_error(gate_project, monkeypatch):
    monkeypatch.setenv("GATE_OUTCOME", "PASS")
    gate_project.makeconftest("def pytest_runtest_logreport(report):\n    raise RuntimeError('a plugin bug')\n")
    assert gate_project.runpytest("-p", "no:cacheprovider").ret == ExitCode.INTERNAL_ERROR


@pytest.fixture
def perf_run(pytester: pytest.Pytester) -> pytest.Pytester:
    copy_fixtures(pytester.path / "fixtures")
    pytester.makepyfile(test_perf=(ROOT / "perf_tests" / "test_speculative_perf.py").read_text())
    pytester.makeini(PERF_INI)
    return pytester


def test_4_usage_error_an_invalid_rig_is_refused_before_any_server_starts(perf_run):
    unknown = perf_run.runpytest("-m", "cpu", "--specgate-rig=nope", "-p", "no:cacheprovider")
    assert unknown.ret == ExitCode.USAGE_ERROR  # not 2: it is bad input, not an interrupted run
    unknown.stderr.fnmatch_lines(["*no rig named 'nope'*(checked before any server starts)*"])
    rig = perf_run.path / "fixtures" / "rigs" / "cpu-smollm2-quick.toml"
    rig.write_text(rig.read_text().replace("repeats = 1\n", "repeats = 0\n"))
    invalid = perf_run.runpytest("-m", "cpu", "--specgate-rig=cpu-smollm2-quick", "-p", "no:cacheprovider")
    assert invalid.ret == ExitCode.USAGE_ERROR
    invalid.stderr.fnmatch_lines([f"*{rig}: protocol.repeats: *"])


def test_4_usage_error_from_the_command_line_tool(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(["plan", "--rig", "nope"]) == ExitCode.USAGE_ERROR
    assert "no rig named 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as no_command:
        main([])
    assert no_command.value.code == ExitCode.USAGE_ERROR  # argparse's own would be 2 ("interrupted")
    assert main(["adopt-baselines", str(tmp_path / "none.json"), "--baselines", str(tmp_path / "b.json")]) == 4
    assert main(["servers", "--stop", "no-such-server"]) == ExitCode.USAGE_ERROR


def test_4_plan_refuses_a_folder_that_is_not_a_fixtures_folder_and_looks_a_rig_up_in_the_one_given(
        tmp_path, monkeypatch, capsys):
    # it exited 1 after pytest's collection, and looked the rig up in ./fixtures whatever the option said
    monkeypatch.chdir(ROOT)
    assert main(["plan", "--rig", "cpu-smollm2-quick", f"--specgate-fixtures={tmp_path}"]) == ExitCode.USAGE_ERROR
    captured = capsys.readouterr()
    assert f"specgate: {tmp_path / 'modes.toml'}: file not found: {tmp_path} is not a specgate fixtures folder" \
        in captured.err
    assert captured.out == ""  # nothing collected, nothing dumped
    fixtures = copy_fixtures(tmp_path / "fixtures")
    (fixtures / "rigs" / "cpu-smollm2-quick.toml").rename(fixtures / "rigs" / "only-here.toml")
    assert main(["plan", "--rig", "only-here", "--specgate-fixtures", str(fixtures)]) == ExitCode.OK
    assert "specgate plan: rig only-here (duet)" in capsys.readouterr().out


@pytest.mark.parametrize("command", [["history", "--rig", "cpu-smollm2"], ["advise", "--seed"]])
def test_4_an_out_folder_that_cannot_be_written_is_named(tmp_path, monkeypatch, capsys, command):
    # a file where the folder should be (as root, a read-only folder would not stop the write): a traceback, exit 1
    monkeypatch.chdir(ROOT)
    in_the_way = tmp_path / "plots"
    in_the_way.write_text("a file")
    for out in (in_the_way, in_the_way / "sub"):
        assert main([*command, "--out", str(out)]) == ExitCode.USAGE_ERROR
        assert f"specgate: {out}: cannot write there (--out): {in_the_way} is a file, not a folder" \
            in capsys.readouterr().err


def test_5_no_tests(perf_run, monkeypatch):
    # -m gpu with the default rig, a cpu one: nothing selected
    assert perf_run.runpytest("-m", "gpu", "-p", "no:cacheprovider").ret == ExitCode.NO_TESTS
    monkeypatch.chdir(ROOT)
    assert main(["plan", "--rig", "cpu-smollm2-quick", "-k", "no-such-test"]) == ExitCode.NO_TESTS


def test_6_a_server_that_cannot_start_breaks_the_job(perf_run, fake, tmp_path, monkeypatch):
    # A real process that exits while loading (as vLLM does on CUDA out of memory): not "a gate said no".
    rig = perf_run.path / "fixtures" / "rigs" / "broken.toml"
    rig.write_text(textwrap.dedent(f'''
        tier = "cpu"
        model = "fake-model"
        server_command = ["{sys.executable}", "-S", "{fake}", "--behaviour", "exit3", "--state", "{tmp_path / 's'}"]
        startup_timeout_s = 30
        classes = ["coding"]
        [modes.no_spec]
        [modes.ngram]
        [protocol]
        repeats = 1
    '''))
    # The run polls its server every 50 ms, not every second: the server has exited long before.
    monkeypatch.setattr(specgate.serve.server, "POLL_EVERY_S", 0.05)
    # In-process: tests/conftest.py imports httpcore before any such run (a server started by an in-process
    # run that first imported it left this process's HTTP client raising raw httpcore errors in later tests,
    # as pytester restores modules). A real process exiting 6: perf_tests/test_faults.py (cpu tier).
    result = perf_run.runpytest_inprocess("-m", "cpu", "--specgate-rig=broken", "-k", "throughput and no_spec",
                                          f"--specgate-run-dir={tmp_path / 'run'}", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert result.ret == ExitCode.JOB_BROKEN, out
    assert "JOB BROKEN (exit code 6" in out and "server no_spec could not start" in out
    import json

    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert [f["server"] for f in report["server_failures"]] == ["no_spec"]
    assert "exited with code 3" in report["server_failures"][0]["error"]
