"""Environment telemetry beside a measurement, so a slow window explains itself: a background
:class:`Telemetry` sampler of GPU clocks, power, temperature and throttle reasons (NVML, else
``nvidia-smi``), CPU frequency, busy share, steal and load, a CPU canary, and each server process's
CPU and context switches, stamped with ``time.perf_counter()``. Reading never fails a run."""

from __future__ import annotations

import contextlib
import shutil
import statistics
import subprocess
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specgate.serve.gpu import nvml, nvml_indices

# NVML's clocksThrottleReasons bits (nvml.h) that say why a clock is low
THROTTLE_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}

Reader = Callable[[], dict[str, float]]
_warned_no_gpu_reader: list[bool] = []


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


def nvml_reader(gpu_indices: list[int] | None = None) -> Reader | None:
    """A reader of the GPUs' clocks, power, temperature and throttle mask; None without NVML.
    NVML stays initialised (specgate.serve.gpu.nvml) until the reader's ``close``."""
    session = contextlib.ExitStack()
    try:
        pynvml = session.enter_context(nvml())
        # Renamed "clocks event reasons" in newer NVML; same bits.
        reasons = (getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                   or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons)
        count = pynvml.nvmlDeviceGetCount()
        handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i))
                   for i in (gpu_indices or range(count)) if i < count]
    except Exception:
        session.close()
        return None

    def read() -> dict[str, float]:
        out: dict[str, float] = {}
        p = pynvml
        for i, h in handles:
            for key, fn, args in (
                    ("sm_clock_mhz", p.nvmlDeviceGetClockInfo, (h, p.NVML_CLOCK_SM)),
                    ("mem_clock_mhz", p.nvmlDeviceGetClockInfo, (h, p.NVML_CLOCK_MEM)),
                    ("power_w", lambda h: p.nvmlDeviceGetPowerUsage(h) / 1000.0, (h,)),
                    ("temperature_c", p.nvmlDeviceGetTemperature, (h, p.NVML_TEMPERATURE_GPU)),
                    ("gpu_util_pct", lambda h: p.nvmlDeviceGetUtilizationRates(h).gpu, (h,)),
                    ("throttle_mask", reasons, (h,))):
                with contextlib.suppress(Exception):
                    out[f"gpu{i}.{key}"] = float(fn(*args))
        return out

    read.source = "nvml"  # type: ignore[attr-defined]
    read.close = session.close  # type: ignore[attr-defined]
    return read


# nvidia-smi's names for the signals NVML gives; the throttle field was renamed in newer drivers.
SMI_FIELDS = ("index", "clocks.sm", "clocks.mem", "power.draw", "temperature.gpu")
SMI_KEYS = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c")
SMI_REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
_smi_reason_field: list[str] = []  # the one this driver accepts, found once per process


def parse_smi_line(line: str) -> dict[str, float]:
    """One ``nvidia-smi --query-gpu=<SMI_FIELDS>,<reasons> --format=csv,noheader,nounits`` line
    -> ``{"gpu0.sm_clock_mhz": 1980.0, ...}``; "[N/A]" left out."""
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != len(SMI_FIELDS) + 1 or not cells[0].isdigit():
        return {}
    prefix, out = f"gpu{cells[0]}.", {}
    for key, cell in zip(SMI_KEYS, cells[1:-1]):
        try:
            out[prefix + key] = float(cell)
        except ValueError:
            continue
    with contextlib.suppress(ValueError):
        out[prefix + "throttle_mask"] = float(int(cells[-1], 16))
    return out


class SmiReader:
    """The latest values from a ``nvidia-smi -lms`` stream (a drain thread keeps them)."""

    source = "nvidia-smi"

    def __init__(self, command: list[str]) -> None:
        self._latest: dict[str, float] = {}
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True)
        self._thread = threading.Thread(target=self._drain, name="specgate-nvidia-smi", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            values = parse_smi_line(line)
            if values:
                with self._lock:
                    self._latest.update(values)

    def __call__(self) -> dict[str, float]:
        with self._lock:
            return dict(self._latest)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._thread.join(timeout=5)


def smi_reader(gpu_indices: list[int] | None = None, interval_ms: int = 100) -> SmiReader | None:
    """The nvidia-smi stream for the GPUs; None without nvidia-smi or a working query."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    select = ["-i", ",".join(map(str, gpu_indices))] if gpu_indices else []
    if not _smi_reason_field:
        for field_name in SMI_REASON_FIELDS:
            query = f"--query-gpu={','.join((*SMI_FIELDS, field_name))}"
            try:
                probe = subprocess.run([smi, query, "--format=csv,noheader,nounits", *select],
                                       capture_output=True, text=True, timeout=20, check=False)
            except (OSError, subprocess.TimeoutExpired):
                return None
            lines = probe.stdout.splitlines()
            if probe.returncode == 0 and any(parse_smi_line(line) for line in lines):
                _smi_reason_field.append(field_name)
                break
        else:
            return None
    query = f"--query-gpu={','.join((*SMI_FIELDS, _smi_reason_field[0]))}"
    return SmiReader([smi, query, "--format=csv,noheader,nounits", "-lms", str(interval_ms),
                      *select])


def cpu_reader() -> Reader:
    import psutil

    psutil.cpu_percent(None, percpu=True)  # prime: the first call has no interval to measure

    def read() -> dict[str, float]:
        per_core = psutil.cpu_percent(None, percpu=True)
        out = {"cpu_busy_pct": float(sum(per_core) / len(per_core)),
               "cpu_busiest_core_pct": float(max(per_core))}
        try:
            freqs = [f.current for f in psutil.cpu_freq(percpu=True) if f.current]
        except (AttributeError, NotImplementedError, OSError):  # no cpufreq on this machine
            freqs = []
        if freqs:
            out["cpu_mhz"] = float(sum(freqs) / len(freqs))
            out["cpu_slowest_core_mhz"] = float(min(freqs))
        with contextlib.suppress(AttributeError, OSError):
            out["load_1min"] = float(psutil.getloadavg()[0])
        steal = getattr(psutil.cpu_times_percent(None), "steal", None)  # Linux only
        if steal is not None:
            out["cpu_steal_pct"] = float(steal)
        return out

    psutil.cpu_times_percent(None)  # prime, as above
    read.source = "psutil"  # type: ignore[attr-defined]
    return read


def canary_work() -> int:
    """The canary's fixed piece of work: ~25 us of interpreted Python on a 2-3 GHz core."""
    total = 0
    for i in range(1000):
        total += i
    return total


def canary_reader(tries: int = 3, clock: Callable[[], int] = time.perf_counter_ns) -> Reader:
    """``cpu_canary_us``: the fastest of ``tries`` timings of :func:`canary_work` (a try cut by a
    thread switch does not count; what remains is the CPU's pace)."""

    def read() -> dict[str, float]:
        best = None
        for _ in range(tries):
            begin = clock()
            canary_work()
            took = clock() - begin
            best = took if best is None else min(best, took)
        return {"cpu_canary_us": best / 1000.0}

    read.source = "canary"  # type: ignore[attr-defined]
    return read


def process_name(proc: Any, leader_pid: int) -> str:
    """A short, stable name for one of a server's processes: "api" for the process specgate
    started, else its title (vLLM titles its engine core "VLLM::EngineCore") with the pid."""
    if proc.pid == leader_pid:
        return "api"
    try:
        title = proc.name().split("::")[-1] or "proc"
    except Exception:
        title = "proc"
    return f"{title}-{proc.pid}"


def process_reader(servers: list[tuple[str, int]]) -> Reader | None:
    """Signals of each ``(label, pid)`` server's process and its descendants now; None if none."""
    import psutil

    procs: list[tuple[str, Any]] = []
    for label, pid in servers:
        try:
            leader = psutil.Process(pid)
            family = [leader, *leader.children(recursive=True)]
        except (psutil.Error, OSError):
            continue
        procs.extend((f"proc.{label}.{process_name(p, pid)}", p) for p in family)
    if not procs:
        return None

    def read() -> dict[str, float]:
        out: dict[str, float] = {}
        for prefix, proc in procs:
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    out[f"{prefix}.cpu_s_total"] = float(times.user + times.system)
                    out[f"{prefix}.invol_ctx_total"] = float(proc.num_ctx_switches().involuntary)
                    out[f"{prefix}.cpu_num"] = float(proc.cpu_num())
            except (psutil.Error, OSError, AttributeError):
                continue
        return out

    read.source = "psutil-processes"  # type: ignore[attr-defined]
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
    def for_rig(cls, tier: str, gpus: str | None, interval_s: float = 0.1,
                servers: list[tuple[str, int]] | None = None) -> Telemetry:
        """The readers for a rig's tier; ``servers`` (label, pid) adds their processes' signals."""
        readers: list[Reader] = [cpu_reader(), canary_reader()]
        procs = process_reader(servers) if servers else None
        if procs is not None:
            readers.append(procs)
        if tier == "gpu":
            # NVML indexes GPUs in PCI order; an entry it cannot resolve: every GPU is read.
            indices = nvml_indices([g.strip() for g in gpus.split(",")] if gpus else [])
            gpu = nvml_reader(indices) or smi_reader(
                indices, interval_ms=max(int(interval_s * 1000), 100))
            if gpu is not None:
                readers.append(gpu)
            elif not _warned_no_gpu_reader:
                _warned_no_gpu_reader.append(True)
                warnings.warn("specgate telemetry: neither NVML (pynvml, or vLLM's copy) nor "
                              "nvidia-smi could be read; GPU clocks, power and throttle reasons "
                              "are not recorded", stacklevel=2)
        return cls(readers, interval_s)

    @property
    def sources(self) -> list[str]:
        return [getattr(read, "source", getattr(read, "__name__", "reader"))
                for read in self.readers]

    def sample(self) -> None:
        values: dict[str, float] = {}
        for read in self.readers:
            with contextlib.suppress(Exception):
                values.update(read())
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
        for read in self.readers:
            close = getattr(read, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()

    def summary(self, t0: float, t1: float) -> dict[str, Any]:
        """min / median / max of each signal over [t0, t1] (else the nearest sample), the throttle
        reasons, each counter's increase and the CPUs a process ran on."""
        inside = [v for t, v in self.samples if t0 <= t <= t1]
        before = [v for t, v in self.samples if t < t0][-1:]
        after = [v for t, v in self.samples if t > t1][:1]
        bracket = before + inside + after
        if not inside and self.samples:
            mid = (t0 + t1) / 2
            inside = [min(self.samples, key=lambda s: abs(s[0] - mid))[1]]
        keys = sorted({k for v in inside for k in v})
        out: dict[str, Any] = {"samples": len(inside)}
        reasons: set[str] = set()
        for key in keys:
            values = [v[key] for v in inside if key in v]
            if key.endswith("_total"):
                seen = [v[key] for v in bracket if key in v]
                out[key.removesuffix("_total")] = round(max(seen) - min(seen), 3)
                continue
            if key.endswith(".cpu_num"):
                out[key] = sorted({int(x) for x in values})
                continue
            if key.endswith("throttle_mask"):
                for mask in values:
                    reasons.update(throttle_names(int(mask)))
                continue
            out[key] = [round(min(values), 1), round(statistics.median(values), 1),
                        round(max(values), 1)]
        if reasons:
            out["throttle_reasons"] = sorted(reasons)
        return out


def window_sampler(tier: str, gpus: str | None) -> Callable[[list[Any]], Telemetry]:
    """What a Measurer calls per window with its servers: a sampler of the rig and those servers."""
    return lambda servers: Telemetry.for_rig(
        tier, gpus, interval_s=0.1 if tier == "gpu" else 0.5,
        servers=[(s.label, s.process.pid) for s in servers
                 if getattr(s, "process", None) is not None])
