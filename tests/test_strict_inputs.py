"""Every input checked before any server starts (issue 53): a rig's values taken with no coercion, the
A/B sides' pythons tried before the first start, a --specgate-baselines path that names no file, and a
bare ``pytest`` that selects no tier starting no server. Every damaged input (issue 63): a rig value that
would do harm (a class listed twice, no class, a number that is not finite, a declared backfire of an
unknown class), a baselines figure that is not finite, a damaged report given to --specgate-report-only.
Each refusal is a usage error (exit 4) naming the file and the key; tests/test_loader_fuzz.py fuzzes the
loaders."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from fixture_copy import copy_fixtures

from specgate.cli import main
from specgate.config.rig import AB, Side, load_rig
from specgate.errors import ConfigError
from specgate.exit_codes import ExitCode
from specgate.plugin.resolve import SessionOptions
from specgate.plugin.session import SpecgateSession

pytestmark = pytest.mark.fast
pytest_plugins = ["pytester"]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ROOT = FIXTURES.parent


# -- a rig's values, with no coercion -------------------------------------------------------------
@pytest.fixture
def rig_file(tmp_path: Path) -> Path:
    """cpu-smollm2's rig file in a private copy of fixtures/, to edit."""
    return copy_fixtures(tmp_path / "fixtures") / "rigs" / "cpu-smollm2.toml"


def _edit(rig_file: Path, old: str, new: str) -> None:
    text = rig_file.read_text()
    assert old in text, f"{rig_file} no longer contains {old!r}: update this test"
    rig_file.write_text(text.replace(old, new, 1))


def _refused(rig_file: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_rig("cpu-smollm2", rig_file.parents[1], model_cache=rig_file.parents[2] / "cache")
    return info.value


@pytest.mark.parametrize(("old", "new", "key", "said"), [
    ("repeats = 2 ", 'repeats = "3" ', "protocol.repeats", 'valid integer, not the string "3" (drop the quotes)'),
    ("repeats = 2 ", "repeats = true ", "protocol.repeats", "valid integer, not the boolean true"),
    ("repeats = 2 ", "repeats = 3.0 ", "protocol.repeats", "valid integer, not the float 3.0"),
    ("throughput_tolerance = 0.04", 'throughput_tolerance = "0.05"', "gates.throughput_tolerance",
     'valid number, not the string "0.05" (drop the quotes)'),
    ("throughput_tolerance = 0.04", "throughput_tolerance = false", "gates.throughput_tolerance",
     "valid number, not the boolean false"),
    ("concurrency = [1]", 'concurrency = ["1"]', "protocol.concurrency.0", 'valid integer, not the string "1"'),
    ("ignore_eos = true", "ignore_eos = 1", "protocol.ignore_eos", "valid boolean, not the integer 1"),
    ("server_command = ", "sleep_level = true\nserver_command = ", "sleep_level", "Input should be 1 or 2"),
    # issue 63: accepted before, and each did harm (tests doubled under other ids, a plan of 0 windows, an
    # OverflowError in the plan, a gate no speedup could pass, a declared backfire silently failing the run)
    ('reference_mode = "no_spec"', 'reference_mode = "no_spec"\nclasses = ["coding", "math", "coding"]', "classes",
     "'coding' listed more than once"),
    ('reference_mode = "no_spec"', 'reference_mode = "no_spec"\nclasses = []', "classes",
     "an empty list selects no prompt class"),
    ("startup_s = 45", "startup_s = inf", "estimate.startup_s", "inf is not a finite number"),
    ("tokens_per_s = 20", "tokens_per_s = nan", "estimate.tokens_per_s", "nan is not a finite number"),
    ("min_speedup = 1.0", "min_speedup = inf", "gates.min_speedup", "inf is not a finite number"),
    ("request_timeout_s = 300", "request_timeout_s = inf", "protocol.request_timeout_s", "inf is not a finite number"),
    ("[modes.ngram]", "[modes.ngram]\nspeculative_config = { prompt_lookup_max = -inf }",
     "modes.ngram.speculative_config.prompt_lookup_max", "-inf is not a finite number"),
    ('classes = ["coding", "math", "structured_json", "explanatory"]', 'classes = ["coding", "nosuch"]',
     "declared_backfire[0].classes", "unknown prompt class(es) ['nosuch']"),
    ('classes = ["coding", "math", "structured_json", "explanatory"]', "classes = []",
     "declared_backfire.0.classes", "an empty list declares nothing"),
])
def test_a_rig_value_of_the_wrong_type_or_that_would_do_harm_is_a_usage_error_naming_the_file_and_the_key(
        rig_file, old, new, key, said, monkeypatch, capsys):
    _edit(rig_file, old, new)
    error = _refused(rig_file)
    assert (error.path, error.key) == (str(rig_file), key)
    assert str(error).startswith(f"{rig_file}: {key}: ")
    assert said in str(error)
    monkeypatch.chdir(ROOT)  # `specgate plan` refuses it before pytest collects anything (the inf crashed it: exit 1)
    assert main(["plan", "--rig", "cpu-smollm2", f"--specgate-fixtures={rig_file.parents[1]}"]) == ExitCode.USAGE_ERROR
    assert f"{rig_file}: {key}: " in capsys.readouterr().err


def test_a_float_key_takes_an_integer_and_stays_a_float(rig_file):
    _edit(rig_file, "throughput_tolerance = 0.04", "throughput_tolerance = 0")
    _edit(rig_file, "min_speedup = 1.0", "min_speedup = 1")
    gates = load_rig("cpu-smollm2", rig_file.parents[1], model_cache=rig_file.parents[2] / "cache").gates
    assert (gates.throughput_tolerance, gates.min_speedup) == (0.0, 1.0)
    assert isinstance(gates.min_speedup, float)


def test_a_quoted_repeats_is_a_usage_error_before_any_server_starts(perf_project):
    rig = perf_project.path / "fixtures" / "rigs" / "cpu-smollm2.toml"
    _edit(rig, "repeats = 2 ", 'repeats = "3" ')
    result = perf_project.runpytest("--collect-only", "-m", "cpu", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f'*{rig}: protocol.repeats: Input should be a valid integer, not the string "3"*'])


# -- the A/B sides' pythons -----------------------------------------------------------------------
def _stand_in_python(tmp_path: Path, *, imports: bool) -> Path:
    """A stand-in for an environment's python: answers ``-c "import vllm"`` as one with (or without)
    vLLM would, and logs each call with the MARK variable it was given."""
    script = tmp_path / ("python-with-vllm" if imports else "python-without-vllm")
    answer = "exit 0\n" if imports else "echo \"ModuleNotFoundError: No module named 'vllm'\" >&2\nexit 1\n"
    script.write_text('#!/bin/sh\necho "$* MARK=$MARK" >> "$0.calls"\n'
                      '[ "$1" = "-c" ] && [ "$2" = "import vllm" ] || exit 9\n' + answer)
    script.chmod(0o755)
    return script


def _session(tmp_path: Path, *, rig: str = "cpu-smollm2", ab: AB | None = None, **options) -> SpecgateSession:
    return SpecgateSession(SessionOptions(rig_name=rig, fixtures_dir=FIXTURES, baselines_path=ROOT / "baselines.json",
                                          run_dir=tmp_path / "run", repo_root=ROOT, ab=ab, **options))


def _candidate(python: Path | str, **side) -> AB:
    return AB(candidate=Side(python=str(python), **side))


def test_a_candidate_python_that_does_not_exist_is_a_usage_error_naming_the_option(perf_project):
    result = perf_project.runpytest("--collect-only", "-m", "cpu", "-p", "no:cacheprovider",
                                    "--specgate-ab-candidate-python=/nonexistent/bin/python")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*/nonexistent/bin/python: the A/B candidate side's python "
                                 "(--specgate-ab-candidate-python) does not exist*"])


@pytest.mark.parametrize("kind", ["folder", "not executable", "not on PATH"])
def test_a_candidate_python_that_cannot_run_is_refused_saying_why(tmp_path, kind):
    python = {"folder": str(tmp_path), "not on PATH": "python-of-no-environment"}.get(kind, tmp_path / "python")
    if kind == "not executable":
        Path(python).write_text("#!/bin/sh\n")
    with pytest.raises(ConfigError) as info:
        _session(tmp_path, ab=_candidate(python)).validate_inputs(imports=False)
    assert (info.value.path, info.value.key) == (str(python), None)
    assert "(--specgate-ab-candidate-python) " + {"folder": "is a folder", "not executable": "is not executable",
                                                   "not on PATH": "is not on PATH"}[kind] in str(info.value)


def test_a_candidate_python_without_vllm_is_refused_with_its_import_error(tmp_path):
    python = _stand_in_python(tmp_path, imports=False)
    with pytest.raises(ConfigError) as info:
        _session(tmp_path, ab=_candidate(python)).validate_inputs()
    assert info.value.path == str(python)
    assert ("the A/B candidate side's python (--specgate-ab-candidate-python) cannot import vllm (exit code 1: "
            "ModuleNotFoundError: No module named 'vllm')") in str(info.value)


def test_the_import_is_tried_once_a_session_in_the_sides_environment_and_not_by_a_collection(tmp_path):
    python = _stand_in_python(tmp_path, imports=True)
    calls = Path(f"{python}.calls")
    session = _session(tmp_path, ab=_candidate(python, env={"MARK": "candidate"}))
    session.validate_inputs(imports=False)  # --collect-only, --setup-plan: existence only
    assert not calls.exists()
    session.validate_inputs()
    session.validate_inputs()
    assert calls.read_text().splitlines() == ["-c import vllm MARK=candidate"]


def test_a_rigs_own_ab_python_is_refused_naming_the_rig_file_and_key(tmp_path):
    rig = tmp_path / "ab-rig.toml"
    rig.write_text((FIXTURES / "rigs" / "cpu-smollm2.toml").read_text() + '\n[ab.reference]\npython = "/nonexistent"\n')
    with pytest.raises(ConfigError) as info:
        _session(tmp_path, rig=str(rig)).validate_inputs(imports=False)
    assert (info.value.path, info.value.key) == (str(rig), "ab.reference.python")
    assert f"{rig}: ab.reference.python: '/nonexistent' does not exist" in str(info.value)


def test_a_side_python_needs_a_server_command_that_starts_with_the_python_placeholder(tmp_path):
    rig = tmp_path / "vllm-on-path.toml"
    shipped = (FIXTURES / "rigs" / "cpu-smollm2.toml").read_text()
    rig.write_text(shipped.replace('server_command = ["${python}", "-m", "vllm.entrypoints.openai.api_server"]',
                                   'server_command = ["vllm", "serve"]'))
    with pytest.raises(ConfigError) as info:
        _session(tmp_path, rig=str(rig), ab=_candidate(_stand_in_python(tmp_path, imports=True))).validate_inputs()
    assert (info.value.path, info.value.key) == (str(rig), "server_command")
    assert "(--specgate-ab-candidate-python) replaces ${python} there, but it starts with 'vllm'" in str(info.value)


# -- the baselines file ---------------------------------------------------------------------------
def test_a_baselines_path_that_names_no_file_is_a_usage_error_unless_the_run_stores(perf_project, tmp_path):
    missing = tmp_path / "none.json"
    refused = perf_project.runpytest("--collect-only", "-m", "cpu", "-p", "no:cacheprovider",
                                     f"--specgate-baselines={missing}")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines([f"*{missing}: no such baselines file (--specgate-baselines)*"
                                  "--specgate-update-baselines*"])
    for update in ("update", "regen"):  # --specgate-update-baselines, --specgate-regen-baselines
        stores = SpecgateSession(SessionOptions(rig_name="cpu-smollm2", fixtures_dir=FIXTURES, baselines_path=missing,
                                                run_dir=tmp_path / "run", repo_root=ROOT, update=update,
                                                baselines_given=True))
        stores.validate_inputs()
    assert not missing.exists()  # written with the run's figures at the session's end, never by a check


@pytest.mark.parametrize("update", ["update", "regen"])
def test_a_run_that_stores_into_a_missing_folder_is_refused_before_it_measures(tmp_path, update):
    path = tmp_path / "no-such-folder" / "baselines.json"
    session = SpecgateSession(SessionOptions(rig_name="cpu-smollm2", fixtures_dir=FIXTURES, baselines_path=path,
                                             run_dir=tmp_path / "run", repo_root=ROOT, update=update,
                                             baselines_given=True))
    with pytest.raises(ConfigError) as info:
        session.validate_inputs()
    assert info.value.path == str(path)
    assert f"the folder {path.parent} does not exist" in str(info.value)
    assert f"--specgate-{update}-baselines" in str(info.value)


@pytest.mark.parametrize("written", ["Infinity", "-Infinity", "NaN"])
def test_a_baselines_figure_that_is_not_finite_is_a_usage_error_naming_the_file_and_the_key(tmp_path, monkeypatch,
                                                                                            capsys, written):
    """Python's json reads all three; NaN was refused only where a bound caught it (a median > 0), Infinity not."""
    path = tmp_path / "baselines.json"
    shipped = (ROOT / "baselines.json").read_text()
    first = json.loads(shipped)["rigs"]["cpu-smollm2"]["no_spec"]["coding"]["1"][0]["decode_tokens_per_s"][0]
    path.write_text(shipped.replace(repr(first), written, 1))
    monkeypatch.chdir(ROOT)
    assert main(["history", "--rig", "cpu-smollm2", "--baselines", str(path)]) == ExitCode.USAGE_ERROR
    key = "rigs.cpu-smollm2.no_spec.coding.1.0.decode_tokens_per_s.0"
    assert f"{path}: {key}: Input should be a finite number" in capsys.readouterr().err


def test_the_default_baselines_path_may_be_missing(tmp_path):
    session = SpecgateSession(SessionOptions(rig_name="cpu-smollm2", fixtures_dir=FIXTURES,
                                             baselines_path=tmp_path / "baselines.json", run_dir=tmp_path / "run",
                                             repo_root=tmp_path))
    session.validate_inputs()  # a project that has stored nothing yet: its gates say "not stored"
    assert session.settings.store.rigs == {}


# -- a damaged report (--specgate-report-only) ---------------------------------------------------------
KEPT_REPORT = ROOT / "docs/evidence/eagle3-runs/cpu-2026-11-30/trained/report.json.gz"


def _damage_gate(r):
    del r["gates"][0]["mode"]


def _damage_records(r):
    del r["measurements"][0]["records"]


def _null_records(r):
    r["measurements"][0]["records"] = None


def _worded_concurrency(r):
    r["measurements"][0]["concurrency"] = "one"


@pytest.mark.parametrize(("damage", "key", "said"), [
    (_damage_gate, "gates[0].mode", "Field required"),
    (_damage_records, "measurements[0].records", "Field required"),
    (_null_records, "measurements[0].records", "Input should be a valid list"),
    (_worded_concurrency, "measurements[0].concurrency", "Input should be a valid integer"),
], ids=["gate without mode", "measurement without records", "records null", "concurrency a word"])
def test_a_damaged_report_is_a_usage_error_naming_the_file_and_the_key(pytester, damage, key, said):
    """Each was a traceback and exit 1, which CI reads as a failed gate."""
    report = json.loads(gzip.decompress(KEPT_REPORT.read_bytes()))
    damage(report)
    path = pytester.path / "report.json"
    path.write_text(json.dumps(report))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", f"--specgate-report-only={path}")
    assert result.ret == ExitCode.USAGE_ERROR
    assert f"specgate: {path}: {key}: {said}" in result.stderr.str()  # fnmatch would read [0] as a set
    assert sorted(p.name for p in pytester.path.iterdir()) == ["report.json"]  # nothing rendered


# -- a bare pytest ----------------------------------------------------------------------------------
def test_a_run_that_names_no_tier_deselects_every_test_that_starts_a_server(perf_project):
    perf_project.makepyfile(test_other="import pytest\n\n"
                                       "@pytest.mark.cpu\ndef test_a_fault():\n    pass\n\n"
                                       "def test_plain():\n    pass\n")
    # bare: the 36 perf tests of the rig and the fault test (the no-speculation mode's 24 speculative-only
    # gates are dropped as in every run); "not speculative_only" keeps the 18 throughput and TTFT tests of it
    for tierless, count in (([], 37), (["-m", "not speculative_only"], 19)):
        # --collect-only: were the deselection broken, a real run could start a server of the rig
        result = perf_project.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", *tierless)
        assert result.ret == pytest.ExitCode.OK, result.stdout.str()
        assert [line for line in result.outlines if "::" in line] == ["test_other.py::test_plain"]
        result.stdout.fnmatch_lines([f"*specgate: {count} test(s) marked cpu, gpu or perf deselected: they start "
                                     "vLLM servers, so a run selects them with -m cpu or -m gpu*",
                                     "*1/62 tests collected (61 deselected)*"])
    named = perf_project.runpytest("--collect-only", "-q", "-m", "cpu", "-p", "no:cacheprovider")
    assert "test_other.py::test_a_fault" in named.stdout.str()
    assert "marked cpu, gpu or perf deselected" not in named.stdout.str()
