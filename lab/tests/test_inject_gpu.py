"""The GPU-side slowdown injector (specgate_lab.inject's GPU mode) without a GPU: the environment it
answers to, the share it injects (fake CUDA events on a simulated GPU timeline), which runner
classes it patches, and its patch on import."""

import sys
import types

import pytest

from specgate_lab import inject

pytestmark = pytest.mark.fast


class Gpu:
    """A simulated stream: work advances ``busy_until``; an event is done once ``now`` reaches it."""

    def __init__(self, cycles_per_ms: float):
        self.busy_until = 0.0
        self.now = 0.0
        self.cycles_per_ms = cycles_per_ms

    def work(self, ms: float) -> None:
        self.busy_until += ms

    def spin(self, cycles: int) -> None:
        self.work(cycles / self.cycles_per_ms)

    def event(self):
        gpu = self
        at = self.busy_until

        class Event:
            def query(self):
                return gpu.now >= at

            def elapsed_time(self, other):
                return other.at - at

        e = Event()
        e.at = at
        return e


def run_steps(pacer: inject.GpuPacer, gpu: Gpu, steps: int, forward_ms=9.0, sample_ms=1.0, wait=True):
    for _ in range(steps):
        pacer.begin("execute_model")
        gpu.work(forward_ms)
        pacer.end("execute_model")
        pacer.begin("sample_tokens")
        gpu.work(sample_ms)
        pacer.end("sample_tokens")
        if wait:
            gpu.now = gpu.busy_until  # the host caught up: earlier events are done


def pacer_on(gpu: Gpu, fraction: float, calibrated: float) -> inject.GpuPacer:
    calls = []

    def calibrate():
        calls.append(1)
        return calibrated

    pacer = inject.GpuPacer(inject.Slowdown(fraction), make_event=gpu.event, spin=gpu.spin, calibrate=calibrate,
                            log=lambda line: None)
    pacer.calibrate_calls = calls
    return pacer


def test_gpu_mode_is_inert_unless_asked_and_names_a_bad_value():
    assert inject.Slowdown.from_environ({}, gpu=True) is None
    assert inject.Slowdown.from_environ({"SPECGATE_SLOWDOWN": "0.1"}, gpu=True) is None
    assert inject.Slowdown.from_environ({"SPECGATE_GPU_SLOWDOWN": "0.05"}, gpu=True).fraction() == 0.05
    assert inject.Slowdown.from_environ({"SPECGATE_GPU_SLOWDOWN_FILE": "/x"}, gpu=True).path == "/x"
    with pytest.raises(ValueError, match="SPECGATE_GPU_SLOWDOWN"):
        inject.Slowdown.from_environ({"SPECGATE_GPU_SLOWDOWN": "lots"}, gpu=True)


def test_each_step_gets_its_fraction_of_the_median_step_time_on_the_gpu():
    gpu = Gpu(cycles_per_ms=1_000_000)
    pacer = pacer_on(gpu, 0.05, calibrated=1_000_000)
    run_steps(pacer, gpu, inject.MIN_STEPS + 1)
    assert pacer.injected_ms() == pytest.approx(0.05 * 10.0)  # forward 9 ms + sampling 1 ms
    run_steps(pacer, gpu, 200)
    assert pacer.injected_ms_total / pacer.step_ms_total == pytest.approx(0.05, rel=0.06)
    assert pacer.calibrate_calls == [1]  # calibrated once; later from the spins themselves
    assert "asked 5 %" in pacer.report()


def test_a_first_token_spin_lengthens_only_the_steps_that_start_a_request():
    gpu = Gpu(cycles_per_ms=1_000_000)
    logged = []
    pacer = inject.GpuPacer(inject.Slowdown(0.0), make_event=gpu.event, spin=gpu.spin, calibrate=lambda: 1_000_000,
                            log=logged.append, prefill_spin=inject.Slowdown(7.5, maximum=inject.MAX_PREFILL_SPIN_MS))
    run_steps(pacer, gpu, 50)  # decode steps: nothing injected
    assert gpu.busy_until == pytest.approx(50 * 10.0)
    pacer.begin("execute_model", new_requests=True)  # a request's prefill: 7.5 ms more before its sampling
    gpu.work(30.0)
    pacer.end("execute_model")
    assert gpu.busy_until == pytest.approx(50 * 10.0 + 30.0 + 7.5)
    assert pacer.first_token_spins == 1 and "1 first-token spins so far, 7.5 ms each now" in pacer.report()
    assert len(logged) == 1 and "first-token spins" in logged[0]  # the first spin is logged: the server log shows it


def test_the_prefill_spin_is_read_from_its_variable_or_followed_in_its_file(tmp_path):
    assert inject.Slowdown.prefill_ms({}) is None
    assert inject.Slowdown.prefill_ms({"SPECGATE_GPU_PREFILL_SPIN_MS": "0"}).inert
    assert inject.Slowdown.prefill_ms({"SPECGATE_GPU_PREFILL_SPIN_MS": " 7.5 "}).fraction() == 7.5
    spin_file = tmp_path / "spin"
    spin = inject.Slowdown.prefill_ms({"SPECGATE_GPU_PREFILL_SPIN_MS_FILE": str(spin_file)})
    assert not spin.inert and spin.fraction() == 0.0  # no file yet: no spin
    spin_file.write_text("40")  # ms, not a fraction: above MAX_FRACTION and still taken
    spin._checked = float("-inf")
    assert spin.fraction() == 40.0


@pytest.mark.parametrize("raw", ["soon", "-1", "5000"])
def test_a_bad_prefill_spin_names_its_variable(raw):
    with pytest.raises(ValueError, match="SPECGATE_GPU_PREFILL_SPIN_MS"):
        inject.Slowdown.prefill_ms({"SPECGATE_GPU_PREFILL_SPIN_MS": raw})


def test_a_wrong_calibration_is_corrected_by_the_spins_it_measures():
    gpu = Gpu(cycles_per_ms=1_500_000)  # the clock under load is faster than the calibration said
    pacer = pacer_on(gpu, 0.10, calibrated=1_000_000)
    run_steps(pacer, gpu, 300)
    pacer.injected_ms_total = pacer.step_ms_total = 0.0
    run_steps(pacer, gpu, 100)
    assert pacer.injected_ms_total / pacer.step_ms_total == pytest.approx(0.10, rel=0.02)


def test_steps_still_running_are_not_read_and_nothing_waits_for_them():
    gpu = Gpu(cycles_per_ms=1_000_000)
    pacer = pacer_on(gpu, 0.05, calibrated=1_000_000)
    run_steps(pacer, gpu, 20, wait=False)  # the host runs ahead: no event is done yet
    assert not pacer.step_ms and pacer.injected_ms() == 0.0 and len(pacer.pending) == 20
    gpu.now = gpu.busy_until
    run_steps(pacer, gpu, 1)
    assert len(pacer.step_ms) == 20


def runner_module(name="fake_runner"):
    module = types.ModuleType(name)
    calls = []

    class GPUModelRunner:
        def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False):
            calls.append(("execute_model", dummy_run))
            return "forward"

        def sample_tokens(self, grammar_output):
            calls.append(("sample_tokens", None))
            return "sampled"

    module.GPUModelRunner = GPUModelRunner
    module.calls = calls
    return module


class Pacer:
    def __init__(self):
        self.seen = []

    def begin(self, phase, new_requests=False):
        self.seen.append(("begin", phase) + (("new",) if new_requests else ()))

    def end(self, phase):
        self.seen.append(("end", phase))


def test_both_runners_are_patched_once_and_dummy_runs_pass_untouched():
    v2, v1 = runner_module("vllm.v1.worker.gpu.model_runner"), runner_module("vllm.v1.worker.gpu_model_runner")
    modules = {m.__name__: m for m in (v2, v1)}
    pacer = Pacer()

    def import_module(name):
        return modules[name]

    names = inject.patch_gpu_runners(lambda runner: pacer, import_module=import_module)
    assert names == [f"{m}.GPUModelRunner.{meth}" for m in inject.GPU_RUNNER_MODULES
                     for meth in ("execute_model", "sample_tokens")]
    assert inject.patch_gpu_runners(lambda runner: pacer, import_module=import_module) == []  # once
    runner = v2.GPUModelRunner()
    step = types.SimpleNamespace(total_num_scheduled_tokens=3)
    assert runner.execute_model(step) == "forward" and runner.sample_tokens(None) == "sampled"
    assert pacer.seen == [("begin", "execute_model"), ("end", "execute_model"),
                          ("begin", "sample_tokens"), ("end", "sample_tokens")]
    runner.execute_model(types.SimpleNamespace(total_num_scheduled_tokens=40, scheduled_new_reqs=["r1"]))
    assert pacer.seen[-2:] == [("begin", "execute_model", "new"), ("end", "execute_model")]
    del pacer.seen[4:]
    runner.execute_model(step, dummy_run=True)
    runner.execute_model(types.SimpleNamespace(total_num_scheduled_tokens=0))
    assert len(pacer.seen) == 4  # neither a dummy run nor an empty step is timed


def test_a_missing_runner_module_is_skipped():
    def import_module(name):
        if name == "vllm.v1.worker.gpu.model_runner":
            raise ImportError(name)
        return runner_module(name)

    assert inject.patch_gpu_runners(lambda r: None, import_module=import_module) == [
        "vllm.v1.worker.gpu_model_runner.GPUModelRunner.execute_model",
        "vllm.v1.worker.gpu_model_runner.GPUModelRunner.sample_tokens"]


def test_the_runner_is_patched_when_vllm_imports_it(tmp_path, monkeypatch):
    (tmp_path / "specgate_fake_runner_mod.py").write_text(
        "class GPUModelRunner:\n    def execute_model(self, s):\n        return 1\n"
        "    def sample_tokens(self, g):\n        return 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    patched = []
    finder = inject._PatchOnImport(("specgate_fake_runner_mod",),
                                   lambda module: patched.append(inject.patch_runner_module(module, lambda r: None)))
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    import specgate_fake_runner_mod

    assert patched == [["specgate_fake_runner_mod.GPUModelRunner.execute_model",
                        "specgate_fake_runner_mod.GPUModelRunner.sample_tokens"]]
    assert specgate_fake_runner_mod.GPUModelRunner().execute_model(None) == 1
    monkeypatch.delitem(sys.modules, "specgate_fake_runner_mod")


def test_register_stays_inert_without_either_variable(monkeypatch):
    for name in ("SPECGATE_SLOWDOWN", "SPECGATE_SLOWDOWN_FILE", "SPECGATE_GPU_SLOWDOWN", "SPECGATE_GPU_SLOWDOWN_FILE",
                 "SPECGATE_GPU_PREFILL_SPIN_MS", "SPECGATE_GPU_PREFILL_SPIN_MS_FILE", "SPECGATE_PREFILL_WAIT_MS",
                 "SPECGATE_PREFILL_WAIT_MS_FILE"):
        monkeypatch.delenv(name, raising=False)
    before = list(sys.meta_path)
    inject.register()
    assert sys.meta_path == before


def test_a_prefill_wait_pauses_the_host_only_before_a_step_that_starts_a_request():
    module = runner_module("fake_runner_wait")
    paused, logged = [], []
    waiting = inject.Slowdown.prefill_ms({"SPECGATE_PREFILL_WAIT_MS": "40"}, host=True)
    module.GPUModelRunner.execute_model = inject.prefill_waited(module.GPUModelRunner.execute_model, waiting,
                                                                log=logged.append, pause=paused.append)
    runner = module.GPUModelRunner()
    runner.execute_model(types.SimpleNamespace(total_num_scheduled_tokens=1, scheduled_new_reqs=[]))
    runner.execute_model(types.SimpleNamespace(total_num_scheduled_tokens=40, scheduled_new_reqs=["r"]), dummy_run=True)
    assert paused == []  # a decode step and a dummy run: no wait
    assert runner.execute_model(types.SimpleNamespace(total_num_scheduled_tokens=40, scheduled_new_reqs=["r"])) \
        == "forward"
    assert paused == [0.04] and len(logged) == 1 and "1 prefill waits so far, 40 ms each now" in logged[0]
    assert [c for c, _ in module.calls] == ["execute_model"] * 3  # the step itself always runs


def test_the_prefill_wait_has_its_own_variable_and_is_in_the_fingerprint_prefixes():
    assert inject.Slowdown.prefill_ms({"SPECGATE_GPU_PREFILL_SPIN_MS": "5"}, host=True) is None
    assert inject.Slowdown.prefill_ms({"SPECGATE_PREFILL_WAIT_MS_FILE": "/x"}, host=True).path == "/x"
    assert any("SPECGATE_PREFILL_WAIT_MS_FILE".startswith(p) for p in inject.ENV_PREFIXES)
    with pytest.raises(ValueError, match="SPECGATE_PREFILL_WAIT_MS"):
        inject.Slowdown.prefill_ms({"SPECGATE_PREFILL_WAIT_MS": "later"}, host=True)
