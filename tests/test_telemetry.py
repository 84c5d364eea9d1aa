"""Telemetry (specgate.telemetry) with stand-in readers: summaries over a request's interval,
throttle reasons named, a broken reader left out, and attached to a duet window's requests."""

import pytest

from specgate.telemetry import Telemetry, throttle_names

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
