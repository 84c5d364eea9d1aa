"""GPU memory check before a server start: a GPU still held by an earlier server (or anyone
else) makes the next start fail in confusing ways, so refuse with the GPU and the holders named.

The reading comes from NVML (nvidia-ml-py); tests inject their own reading."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specgate.errors import ServerStartError

# Memory a driver and an idle context use on a free GPU; above this the GPU counts as held.
FREE_THRESHOLD_MIB = 1024


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    used_mib: float
    processes: tuple[tuple[int, float], ...]  # (pid, MiB)


def nvml_readings() -> list[GpuReading]:
    import pynvml

    pynvml.nvmlInit()
    try:
        readings = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            used = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
            procs = tuple((p.pid, (p.usedGpuMemory or 0) / 2**20)
                          for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
            readings.append(GpuReading(index, name.decode() if isinstance(name, bytes) else name, used, procs))
        return readings
    finally:
        pynvml.nvmlShutdown()


def require_free_gpus(visible: str | None, *, count: int,
                      read: Callable[[], list[GpuReading]] = nvml_readings) -> None:
    """Raise ServerStartError naming each held GPU among the ones the server will use."""
    readings = read()
    if visible is not None:
        # CUDA's order: "3,1" makes GPU 3 the server's first device; "" means no GPU at all.
        by_index = {r.index: r for r in readings}
        wanted = [int(i) for i in visible.split(",") if i.strip().isdigit()]
        readings = [by_index[i] for i in wanted if i in by_index]
    if len(readings) < count:
        raise ServerStartError(f"the rig needs {count} GPU(s) but {len(readings)} are visible "
                               f"(CUDA_VISIBLE_DEVICES={visible!r})")
    held = [r for r in readings[:count] if r.used_mib > FREE_THRESHOLD_MIB]
    if held:
        lines = [f"GPU {r.index} ({r.name}): {r.used_mib:.0f} MiB used by "
                 + (", ".join(f"pid {pid} ({mib:.0f} MiB)" for pid, mib in r.processes) or "unknown processes")
                 for r in held]
        raise ServerStartError("refusing to start a server: GPU memory is still held\n" + "\n".join(lines))
