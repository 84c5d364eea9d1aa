"""Telemetry (specgate.measure.telemetry) with stand-in readers: summaries over a request's interval,
throttle reasons named, a broken reader left out, and attached to a duet window's requests."""

import os
import subprocess
import sys
import time
import types

import pytest

from specgate.measure import telemetry
from specgate.measure.telemetry import SmiReader, Telemetry, canary_reader, parse_smi_line, throttle_names
from specgate.serve import gpu
from specgate.serve.gpu import load_pynvml

pytestmark = pytest.mark.fast


def test_summary_over_an_interval_and_throttle_reasons():
    t = Telemetry(readers=[])
    t.samples = [(1.0, {"gpu0.sm_clock_mhz": 1980, "gpu0.throttle_mask": 0}),
                 (2.0, {"gpu0.sm_clock_mhz": 1410, "gpu0.throttle_mask": 0x4}),
                 (3.0, {"gpu0.sm_clock_mhz": 1980, "gpu0.throttle_mask": 0})]
    s = t.summary(1.5, 3.5)
    assert s["gpu0.sm_clock_mhz"] == [1410, 1695.0, 1980] and s["samples"] == 2
    assert s["throttle_reasons"] == ["sw_power_cap"]
    assert t.summary(10, 11)["samples"] == 1  # none inside: the nearest sample speaks for it
    assert throttle_names(0x40 | 0x1) == ["gpu_idle", "hw_thermal_slowdown"]


def test_counters_summarise_as_their_increase_and_cpus_as_a_set():
    t = Telemetry(readers=[])
    t.samples = [(1.0, {"proc.a.api.invol_ctx_total": 10, "proc.a.api.cpu_num": 0}),
                 (2.0, {"proc.a.api.invol_ctx_total": 14, "proc.a.api.cpu_num": 1}),
                 (3.0, {"proc.a.api.invol_ctx_total": 30, "proc.a.api.cpu_num": 1}),
                 (4.0, {"proc.a.api.invol_ctx_total": 31, "proc.a.api.cpu_num": 0})]
    s = t.summary(1.5, 2.5)  # from the last sample before to the first after: 10 -> 30
    assert s["proc.a.api.invol_ctx"] == 20 and s["proc.a.api.cpu_num"] == [1]
    assert t.summary(0.5, 4.5)["proc.a.api.cpu_num"] == [0, 1]


def test_a_servers_processes_are_read_with_their_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        t = Telemetry.for_rig("cpu", None, servers=[("no_spec", os.getpid())])
        assert "psutil-processes" in t.sources
        t.sample()
        values = t.samples[-1][1]
        assert values["proc.no_spec.api.cpu_s_total"] > 0
        assert any(k.startswith("proc.no_spec.") and k.endswith(f"-{child.pid}.cpu_num") for k in values)
        assert Telemetry.for_rig("cpu", None, servers=[("gone", 2**22 + 7)]).sources == ["psutil", "canary"]
    finally:
        child.kill()
        child.wait()


def test_a_failing_reader_is_left_out():
    def broken():
        raise RuntimeError("NVML gone")

    t = Telemetry(readers=[broken, lambda: {"cpu_busy_pct": 50.0}], interval_s=0.01)
    with t:
        pass
    assert all(v == {"cpu_busy_pct": 50.0} for _, v in t.samples) and len(t.samples) >= 2


def test_cpu_rig_reads_cpu_signals():
    t = Telemetry.for_rig("cpu", None)
    t.sample()
    assert "cpu_busy_pct" in t.samples[-1][1]
    assert t.samples[-1][1]["cpu_canary_us"] > 0


def test_the_canary_keeps_its_fastest_try():
    # A try cut by a preemption (the 900 us one) does not count: the CPU's pace is the fastest try.
    ticks = iter([0, 30_000, 100_000, 1_000_000, 2_000_000, 2_026_000])
    read = canary_reader(tries=3, clock=lambda: next(ticks))
    assert read() == {"cpu_canary_us": 26.0}


def test_nvidia_smi_lines_parse_and_skip_what_is_not_available():
    line = "0, 1980, 3201, 123.45, 41, 0x0000000000000004"
    assert parse_smi_line(line) == {"gpu0.sm_clock_mhz": 1980.0, "gpu0.mem_clock_mhz": 3201.0, "gpu0.power_w": 123.45,
                                    "gpu0.temperature_c": 41.0, "gpu0.throttle_mask": 4.0}
    assert parse_smi_line("1, 1755, 3201, [N/A], 38, 0x0000000000000001") == {
        "gpu1.sm_clock_mhz": 1755.0, "gpu1.mem_clock_mhz": 3201.0, "gpu1.temperature_c": 38.0,
        "gpu1.throttle_mask": 1.0}
    assert parse_smi_line("No devices were found") == {}


def test_nvidia_smi_stream_keeps_the_latest_values_and_stops(tmp_path):
    script = ("import sys, time\n"
              "for clock in (1410, 1980):\n"
              "    print(f'0, {clock}, 3201, 300.5, 45, 0x4', flush=True)\n"
              "time.sleep(60)\n")
    reader = SmiReader([sys.executable, "-c", script])
    deadline = time.monotonic() + 10
    while reader().get("gpu0.sm_clock_mhz") != 1980.0 and time.monotonic() < deadline:
        time.sleep(0.02)
    t = Telemetry(readers=[reader], interval_s=0.01)
    with t:
        pass
    assert t.summary(0, float("inf"))["gpu0.sm_clock_mhz"] == [1980, 1980, 1980]
    assert t.summary(0, float("inf"))["throttle_reasons"] == ["sw_power_cap"]
    assert reader._proc.poll() is not None  # closed with the sampler, not left running


class _FakeNvml(types.ModuleType):
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self):
        super().__init__("pynvml")
        self.shutdowns = 0

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"h{i}"

    def nvmlDeviceGetClockInfo(self, h, kind):
        return {1: 1980, 2: 3201}[kind] if h == "h1" else 0

    def nvmlDeviceGetPowerUsage(self, h):
        return 250_000  # mW

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 50

    def nvmlDeviceGetUtilizationRates(self, h):
        raise RuntimeError("not supported")  # a signal that cannot be read is left out

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x40

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        raise AssertionError("the older name is used only where the newer one is missing")


def test_nvml_reader_reads_the_selected_gpus_and_shuts_nvml_down(monkeypatch):
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    t = Telemetry.for_rig("gpu", "1")
    assert t.sources == ["psutil", "canary", "nvml"]
    t.sample()
    gpu = {k: v for k, v in t.samples[-1][1].items() if k.startswith("gpu")}
    assert gpu == {"gpu1.sm_clock_mhz": 1980.0, "gpu1.mem_clock_mhz": 3201.0, "gpu1.power_w": 250.0,
                   "gpu1.temperature_c": 50.0, "gpu1.throttle_mask": 64.0}
    with t:
        pass
    assert fake.shutdowns == 1
    assert t.summary(0, float("inf"))["throttle_reasons"] == ["hw_thermal_slowdown"]


def test_without_pynvml_vllms_vendored_copy_is_loaded_without_importing_vllm(monkeypatch, tmp_path):
    (tmp_path / "vllm" / "third_party").mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("raise RuntimeError('vllm itself must not be imported')\n")
    # Like the real file, it looks itself up in sys.modules while it loads.
    (tmp_path / "vllm" / "third_party" / "pynvml.py").write_text(
        "import sys\nVENDORED = sys.modules[__name__].__name__ == __name__\n")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_pynvml().VENDORED is True


def test_a_gpu_rig_without_any_gpu_reader_warns_and_keeps_the_cpu_signals(monkeypatch):
    monkeypatch.setattr(gpu, "load_pynvml", lambda: None)
    monkeypatch.setattr(telemetry.shutil, "which", lambda name: None)
    monkeypatch.setattr(telemetry, "_warned_no_gpu_reader", [])
    with pytest.warns(UserWarning, match="nvidia-smi"):
        t = Telemetry.for_rig("gpu", "0")
    assert t.sources == ["psutil", "canary"]
    t.sample()
    assert {"cpu_busy_pct", "cpu_busiest_core_pct"} <= set(t.samples[-1][1])
