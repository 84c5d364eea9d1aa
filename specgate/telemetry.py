"""Environment telemetry beside a measurement: what the machine did while a window ran, so a slow
window explains itself (a lower SM clock, a power cap, a throttle reason, a busy CPU).

A :class:`Telemetry` sampler is a background thread that reads, every ``interval_s``:
- on GPU rigs (NVML, from nvidia-ml-py): per visible GPU the SM clock (MHz), memory clock,
  power (W), temperature (C) and the active clock-throttle reasons;
- on every rig: the CPU frequency (MHz, mean over cores) and CPU busy share (psutil).
Samples carry ``time.perf_counter()`` stamps, the clock request records use, so
:meth:`Telemetry.summary` can say what happened during any request or window.
Reading never fails a run: a signal that cannot be read is left out and named in ``unavailable``.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# NVML's clocksThrottleReasons bits (nvml.h) that say why a clock is low
THROTTLE_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}

Reader = Callable[[], dict[str, float]]


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


def nvml_reader(gpu_indices: list[int] | None = None) -> Reader | None:
    """A reader of the GPUs' clocks, power, temperature and throttle mask; None without NVML."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in (gpu_indices or range(count)) if i < count]
    except Exception:
        return None

    def read() -> dict[str, float]:
        out: dict[str, float] = {}
        for i, h in handles:
            for key, fn in (("sm_clock_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
                            ("mem_clock_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)),
                            ("power_w", lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
                            ("temperature_c", lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
                            ("gpu_util_pct", lambda: pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
                            ("throttle_mask", lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))):
                try:
                    out[f"gpu{i}.{key}"] = float(fn())
                except Exception:
                    continue
        return out

    return read


def cpu_reader() -> Reader:
    import psutil

    psutil.cpu_percent(None)  # prime: the first call has no interval to measure

    def read() -> dict[str, float]:
        out = {"cpu_busy_pct": float(psutil.cpu_percent(None))}
        freq = psutil.cpu_freq()
        if freq is not None and freq.current:
            out["cpu_mhz"] = float(freq.current)
        return out

    return read


@dataclass
class Telemetry:
    """Background sampler; use as a context manager around the measurement."""

    readers: list[Reader]
    interval_s: float = 0.1
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    clock: Callable[[], float] = time.perf_counter
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @classmethod
    def for_rig(cls, tier: str, gpus: str | None, interval_s: float = 0.1) -> Telemetry:
        readers: list[Reader] = [cpu_reader()]
        if tier == "gpu":
            indices = [int(g) for g in gpus.split(",") if g.strip().isdigit()] if gpus else None
            gpu = nvml_reader(indices)
            if gpu is not None:
                readers.append(gpu)
        return cls(readers, interval_s)

    def sample(self) -> None:
        values: dict[str, float] = {}
        for read in self.readers:
            try:
                values.update(read())
            except Exception:
                continue
        self.samples.append((self.clock(), values))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> Telemetry:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="specgate-telemetry", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sample()

    def summary(self, t0: float, t1: float) -> dict[str, Any]:
        """min / median / max of each signal over [t0, t1] (the nearest sample when none falls
        inside), and the throttle reasons seen."""
        inside = [v for t, v in self.samples if t0 <= t <= t1]
        if not inside and self.samples:
            mid = (t0 + t1) / 2
            inside = [min(self.samples, key=lambda s: abs(s[0] - mid))[1]]
        keys = sorted({k for v in inside for k in v})
        out: dict[str, Any] = {"samples": len(inside)}
        reasons: set[str] = set()
        for key in keys:
            values = [v[key] for v in inside if key in v]
            if key.endswith("throttle_mask"):
                for mask in values:
                    reasons.update(throttle_names(int(mask)))
                continue
            out[key] = [round(min(values), 1), round(statistics.median(values), 1), round(max(values), 1)]
        if reasons:
            out["throttle_reasons"] = sorted(reasons)
        return out
