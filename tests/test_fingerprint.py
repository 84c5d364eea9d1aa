"""Issue 14, point 1: a stored figure is compared only with a run that measured the same thing.

The fingerprint covers the prompt texts, the protocol, the server arguments and environment, the
software (vLLM, torch, CUDA) and the machine (CPU model, GPU name/count); ``comparability`` says
what a difference means. Old entries without the new fields still load and still gate."""

import inspect
import json
import textwrap
from pathlib import Path

import pytest
from fixture_copy import copy_fixtures

from specgate.config.rig import load_rig
from specgate.decide.outcome import Outcome
from specgate.measure.client import RequestRecord
from specgate.measure.protocol import ClassMeasurement
from specgate.store.baselines import (
    OTHER_MACHINE,
    OTHER_MEASUREMENT,
    OTHER_SETUP,
    SAME,
    BaselineEntry,
    Fingerprint,
    baseline_notes,
    comparability,
)
from specgate.store.fingerprint import measured_with, torch_cuda_versions

pytestmark = pytest.mark.fast
pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def rig():
    return load_rig("cpu-smollm2", ROOT / "fixtures")


def _now(rig, **changes) -> Fingerprint:
    fields = measured_with(rig, rig.mode("ngram"), environ={"VLLM_CPU_OMP_THREADS_BIND": "all", "HOME": "/x"})
    base = {"accelerator": "AMD EPYC", "accelerator_count": 2, "cpu_model": "AMD EPYC", "vllm_version": "0.32.0",
            "torch_version": "2.13.0+cpu", "model": "smollm2-135m"}
    return Fingerprint(**{**base, **fields, **changes})


def test_the_fingerprint_holds_what_changes_a_measurement(rig):
    fp = _now(rig)
    assert set(fp.prompts) == {c.name for c in rig.prompt_classes}
    protocol = rig.protocol
    assert fp.protocol == {"api": protocol.api, "max_tokens": protocol.max_tokens, "ignore_eos": protocol.ignore_eos,
                           "temperature": protocol.temperature, "warmup_requests": protocol.warmup_requests,
                           "repeats": protocol.repeats, "concurrency": list(protocol.concurrency),
                           "prefix_caching": protocol.prefix_caching}
    assert fp.server_args == list(rig.extra_args) and "--max-model-len" in fp.server_args
    # the rig's env and the inherited vLLM knobs; unrelated variables stay out
    assert fp.env["VLLM_CPU_KVCACHE_SPACE"] == "1" and fp.env["VLLM_CPU_OMP_THREADS_BIND"] == "all"
    assert "HOME" not in fp.env
    window = fp.for_window("coding", 1)
    assert list(window.prompts) == ["coding"] and window.protocol["concurrency"] == 1


def test_same_setup_compares(rig):
    assert comparability(_now(rig).for_window("coding", 1), _now(rig).for_window("coding", 1)).kind == SAME


def test_an_edited_prompt_is_another_measurement_naming_the_prompt(rig):
    edited = rig.model_copy(update={"prompt_classes": tuple(
        c.model_copy(update={"prompts": (c.prompts[0].model_copy(update={"text": "changed"}), *c.prompts[1:])})
        if c.name == "coding" else c for c in rig.prompt_classes)})
    stored, now = _now(rig).for_window("coding", 1), _now(edited).for_window("coding", 1)
    fit = comparability(stored, now)
    assert fit.kind == OTHER_MEASUREMENT
    (difference,) = fit.differences
    assert difference.startswith(f"prompts of class coding: text of {rig.prompt_classes[0].prompts[0].id} changed")
    # another class's window is untouched by the edit
    assert comparability(_now(rig).for_window("math", 1), _now(edited).for_window("math", 1)).kind == SAME


@pytest.mark.parametrize(("change", "kind", "text"), [
    ({"protocol": {"max_tokens": 999}}, OTHER_MEASUREMENT, "protocol max_tokens: stored 64, now 999"),
    ({"cpu_model": "Intel Xeon", "accelerator": "Intel Xeon"}, OTHER_MACHINE, "cpu_model: stored 'AMD EPYC'"),
    ({"accelerator_count": 16}, OTHER_MACHINE, "accelerator_count: stored 2, now 16"),
    ({"torch_version": "2.14.0"}, OTHER_SETUP, "torch_version: stored '2.13.0+cpu', now '2.14.0'"),
    ({"server_args": ["--dtype", "float16"]}, OTHER_SETUP, "server_args: stored"),
    ({"env": {"VLLM_CPU_KVCACHE_SPACE": "4"}}, OTHER_SETUP, "env: stored"),
])
def test_each_difference_has_its_kind(rig, change, kind, text):
    stored = _now(rig)
    if "protocol" in change:
        change = {"protocol": {**stored.protocol, **change["protocol"]}}
    fit = comparability(stored, stored.model_copy(update=change))
    assert fit.kind == kind
    assert any(d.startswith(text) for d in fit.differences), fit.differences


def test_an_old_entry_without_the_new_fields_loads_and_still_compares(rig):
    # as in the committed baselines.json before issue 14: no prompts, protocol, versions
    old = BaselineEntry.model_validate({"decode_tokens_per_s": [33.0], "median": 33.0, "mad": 0.0, "n": 1,
                                        "fingerprint": {"accelerator": "AMD EPYC", "accelerator_count": 2,
                                                        "vllm_version": "0.32.0", "model": "smollm2-135m"}})
    assert old.fingerprint.prompts is None and old.fingerprint.torch_version is None
    assert comparability(old.fingerprint, _now(rig).for_window("coding", 1)).kind == SAME
    moved = _now(rig, accelerator="Intel Xeon").for_window("coding", 1)
    assert comparability(old.fingerprint, moved).kind == OTHER_MACHINE


def test_a_stale_figure_is_reported_with_the_refresh_command():
    notes = baseline_notes(comparability(Fingerprint(), None), [59.0, 60.0, 58.0], 33.0,
                           "pytest --specgate-update-baselines")
    assert notes["baseline_fingerprint"] == {"kind": SAME, "differences": []}
    assert notes["stale_baseline"].startswith("this run's median 59.0 tok/s is 1.79x the stored 33.0")
    assert notes["stale_baseline"].endswith("refresh it with: pytest --specgate-update-baselines")
    assert "stale_baseline" not in baseline_notes(comparability(Fingerprint(), None), [40.0], 33.0, "x")


def test_torch_and_cuda_versions_are_read_without_importing_torch(tmp_path, monkeypatch):
    import importlib.machinery
    import importlib.util

    package = tmp_path / "torch"
    package.mkdir()
    (package / "version.py").write_text("__version__ = '2.9.1+cu128'\ncuda: Optional[str] = '12.8'\n")
    spec = importlib.machinery.ModuleSpec("torch", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    assert torch_cuda_versions() == ("2.9.1+cu128", "12.8")


# -- the gates in a pytest run: undecided, reported, refused under --specgate-strict-fingerprint ----------
def window(mode: str, prompt_class: str, tps: list[float]) -> ClassMeasurement:
    records = []
    for i, rate in enumerate(tps):
        span = 63 / rate  # 64 tokens: (64 - 1) / span == rate
        records.append(RequestRecord(
            request_id=f"{mode}/{prompt_class}/p{i}#0", mode=mode, prompt_class=prompt_class,
            prompt_id=f"p{i}", concurrency=1, started_at=0.0, first_token_at=0.1,
            last_token_at=0.1 + span, finished_at=0.1 + span, chunk_times=[0.1, 0.1 + span],
            prompt_tokens=10, completion_tokens=64, text="x", finish_reason="length"))
    return ClassMeasurement(rig="cpu-smollm2", mode=mode, prompt_class=prompt_class, concurrency=1,
                            records=records, acceptance=None, server_decode_tokens_per_s=None,
                            server_metric_source=None, wall_s=1.0)


GATE_TESTS = textwrap.dedent('''
    import pytest
    from specgate.store.baselines import Fingerprint, merge_updates
    from specgate.measure.client import RequestRecord
    from specgate.store.fingerprint import measured_with
    from specgate.decide.entry import baseline_entry
    from specgate.measure.protocol import ClassMeasurement


    def fingerprint(rig, **changes):
        return Fingerprint(accelerator="AMD EPYC", accelerator_count=2, cpu_model="AMD EPYC",
                           model="smollm2-135m", machine="machine-id stand-in",
                           **{**measured_with(rig, rig.mode("no_spec"), environ={}),
                                                    **changes})


    @pytest.mark.parametrize("case", ["prompts", "machine", "stale"])
    def test_throughput(specgate_session, gatekeeper, case):
        rig = specgate_session.settings.rig
        prompt_class = {"prompts": "coding", "machine": "math", "stale": "extraction"}[case]
        stored = fingerprint(rig)
        if case == "prompts":
            stored.prompts["coding"].prompts[rig.prompt_classes[0].prompts[0].id] = "0" * 12
            stored.prompts["coding"].sha256 = "0" * 64
        if case == "machine":
            stored = stored.model_copy(update={"accelerator": "Intel Xeon", "cpu_model": "Intel Xeon"})
        m = window("no_spec", prompt_class, [30.0] * 6)
        merge_updates(specgate_session.options.baselines_path, {
            ("cpu-smollm2", "no_spec", prompt_class, 1):
                baseline_entry(window("no_spec", prompt_class, [15.0 if case == "stale" else 30.0] * 6), stored)})
        specgate_session._settings = None  # resolved again: the baselines file written above is read
        specgate_session.fingerprints["no_spec"] = fingerprint(rig)
        specgate_session.measurements[("no_spec", prompt_class, 1)] = m
        gatekeeper.throughput(m)
''')


@pytest.fixture
def gate_project(pytester: pytest.Pytester) -> pytest.Pytester:
    copy_fixtures(pytester.path / "fixtures")
    pytester.makepyfile(test_fingerprint_gates=GATE_TESTS + "\n\n" + inspect.getsource(window))
    return pytester


@pytest.mark.usefixtures("no_plots")
def test_gates_refuse_other_prompts_and_report_another_machine_and_a_stale_figure(gate_project):
    result = gate_project.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "-W", "ignore::UserWarning", "-rs")
    result.assert_outcomes(passed=1, skipped=2)
    out = result.stdout.str()
    # other prompts: undecided (skipped, never passed or failed); the terminal's line says so, the report
    # (summary.md) names the prompt and the refresh
    assert "FINGERPRINT no_spec coding c1 throughput: stored figures of other prompts or another protocol" in out
    report = json.loads(next((gate_project.path / ".specgate" / "runs").glob("*/report.json")).read_text())
    said = " ".join(u["message"] for u in report["undecided"])
    assert "prompts of class coding: text of" in said
    assert ("refresh it with: pytest -m cpu --specgate-rig cpu-smollm2 --specgate-update-baselines "
            "-k 'no_spec-coding-c1'") in said
    # another machine: undecided (a level from another CPU says nothing here), reported in the summary
    assert "the stored entry was measured on another machine: accelerator: stored 'Intel Xeon', now 'AMD EPYC'; " \
           "cpu_model: stored 'Intel Xeon', now 'AMD EPYC'; not compared" in said
    assert "OTHER MACHINE no_spec math c1 throughput: stored figures of another machine: not compared" in out
    # a run twice as fast as the stored figure: reported with the command that refreshes it
    assert "STALE FIGURES [no_spec-extraction-c1]: this run's median 30.0 tok/s is 2.00x the stored 15.0" in out


def test_strict_fingerprint_fails_on_another_machine(rig, tmp_path):
    from specgate.decide.entry import baseline_entry
    from specgate.plugin.gatekeeper import GateKeeper
    from specgate.plugin.resolve import SessionOptions
    from specgate.plugin.session import SpecgateSession
    from specgate.store.baselines import merge_updates

    m = window("no_spec", "math", [30.0] * 6)
    session = SpecgateSession(SessionOptions(
        rig_name="cpu-smollm2", fixtures_dir=ROOT / "fixtures", baselines_path=tmp_path / "baselines.json",
        run_dir=tmp_path / "run", repo_root=ROOT, strict_fingerprint=True))
    now = _now(rig).model_copy(update={"machine": "machine-id stand-in"})  # one machine's history
    merge_updates(session.options.baselines_path, {("cpu-smollm2", "no_spec", "math", 1): baseline_entry(
        m, now.model_copy(update={"accelerator": "Intel Xeon", "cpu_model": "Intel Xeon"}))})
    session.fingerprints["no_spec"] = now

    with pytest.raises(pytest.fail.Exception, match=r"^no_spec math c1 throughput: refused \(--specgate-strict-"
                                                    r"fingerprint\): the stored entry was measured on another machine"):
        GateKeeper(session).throughput(m)
    # a failed gate in the summary, not one that decided nothing
    assert session.undecided == []
    assert [(g.gate, g.outcome) for g in session.results] == [("throughput", Outcome.FAIL)]
