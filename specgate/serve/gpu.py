"""GPUs from NVML: a start refuses a GPU still held (by an earlier server or anyone else), which
would make it fail in confusing ways, naming the holders."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from specgate.errors import ServerStartError

# Memory a driver and an idle context use on a free GPU; above this the GPU counts as held.
FREE_THRESHOLD_MIB = 1024


@dataclass(frozen=True)
class GpuReading:
    index: int  # NVML index; a MIG instance carries its parent GPU's
    name: str
    used_mib: float
    processes: tuple[tuple[int, float], ...]  # (pid, MiB)
    uuid: str = ""  # "GPU-..." for a whole GPU, "MIG-..." for a MIG instance


def load_pynvml() -> Any | None:
    """nvidia-ml-py's module, else vLLM's vendored copy of it; None without either."""
    try:
        import pynvml

        return pynvml
    except ImportError:
        pass
    try:
        vllm_spec = importlib.util.find_spec("vllm")  # finds the package without running it
    except (ImportError, ValueError):
        return None
    if vllm_spec is None or not vllm_spec.submodule_search_locations:
        return None
    for folder in vllm_spec.submodule_search_locations:
        spec = importlib.util.spec_from_file_location("specgate_vendored_pynvml",
                                                      f"{folder}/third_party/pynvml.py")
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # the module looks itself up there while it loads
        try:
            spec.loader.exec_module(module)
        except Exception:
            del sys.modules[spec.name]
            continue
        return module
    return None


@contextmanager
def nvml() -> Iterator[Any]:
    """The pynvml module (nvidia-ml-py, else vLLM's copy), initialised for the block: specgate's
    one NVML setup (nvmlInit is reference-counted, so blocks may nest or overlap)."""
    pynvml = load_pynvml()
    if pynvml is None:
        raise ImportError("no NVML: install nvidia-ml-py (specgate's gpu extra) or a vLLM that "
                          "ships its copy")
    pynvml.nvmlInit()
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def is_gpu_id(entry: str) -> bool:
    """A CUDA_VISIBLE_DEVICES entry: an index, a GPU UUID ("GPU-...") or a MIG one ("MIG-...")."""
    return entry.isdigit() or entry.startswith(("GPU-", "MIG-"))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _reading(pynvml: Any, index: int, handle: Any) -> GpuReading:
    procs = tuple((p.pid, (p.usedGpuMemory or 0) / 2**20)
                  for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    return GpuReading(index, _text(pynvml.nvmlDeviceGetName(handle)),
                      pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20, procs,
                      _text(pynvml.nvmlDeviceGetUUID(handle)))


def _mig_readings(pynvml: Any, index: int, handle: Any) -> list[GpuReading]:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:  # not a MIG-capable GPU
        return []
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return []
    readings = []
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError:  # an empty slot
            continue
        readings.append(_reading(pynvml, index, mig))
    return readings


def nvml_readings() -> list[GpuReading]:
    """Every GPU, then every MIG instance (each with its own memory and processes)."""
    with nvml() as pynvml:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        gpus = [_reading(pynvml, i, handle) for i, handle in enumerate(handles)]
        migs = [r for i, handle in enumerate(handles) for r in _mig_readings(pynvml, i, handle)]
        return gpus + migs


def _selects(entry: str, reading: GpuReading) -> bool:
    if entry.isdigit():
        return reading.index == int(entry) and not reading.uuid.startswith("MIG-")
    return bool(reading.uuid) and reading.uuid.startswith(entry)  # any unique UUID prefix


def nvml_indices(entries: list[str],
                 read: Callable[[], list[GpuReading]] = nvml_readings) -> list[int] | None:
    """The NVML indices of CUDA_VISIBLE_DEVICES entries (index, GPU UUID or prefix, MIG instance
    as its parent), in order; None when there are none or one cannot be resolved."""
    if not entries or not all(is_gpu_id(e) for e in entries):
        return None
    if all(e.isdigit() for e in entries):
        return [int(e) for e in entries]
    try:
        readings = read()
    except Exception:  # no NVML: nothing to resolve a UUID against
        return None
    found = [next((r.index for r in readings if _selects(e, r)), None) for e in entries]
    return None if None in found else list(dict.fromkeys(i for i in found if i is not None))


def require_free_gpus(visible: str | None, *, count: int,
                      read: Callable[[], list[GpuReading]] = nvml_readings) -> None:
    """Raise ServerStartError naming each held GPU among the ones the server will use."""
    readings = read()
    if visible is None:
        readings = [r for r in readings if not r.uuid.startswith("MIG-")]
    else:
        # CUDA's order: "3,1" makes GPU 3 the server's first device; "" means no GPU at all.
        wanted = [entry.strip() for entry in visible.split(",") if is_gpu_id(entry.strip())]
        matches = (next((r for r in readings if _selects(entry, r)), None) for entry in wanted)
        readings = [r for r in matches if r is not None]
    if len(readings) < count:
        raise ServerStartError(f"the rig needs {count} GPU(s) but {len(readings)} are visible "
                               f"(CUDA_VISIBLE_DEVICES={visible!r})")
    held = [r for r in readings[:count] if r.used_mib > FREE_THRESHOLD_MIB]
    if held:
        lines = [f"GPU {r.index} ({r.name}): {r.used_mib:.0f} MiB used by "
                 + (", ".join(f"pid {pid} ({mib:.0f} MiB)" for pid, mib in r.processes)
                    or "unknown processes")
                 for r in held]
        raise ServerStartError("refusing to start a server: GPU memory is still held\n"
                               + "\n".join(lines))
