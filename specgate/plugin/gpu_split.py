"""The xdist GPU split: each worker gets its own GPUs, so no GPU hosts two servers; the perf tiers
refuse xdist where that cannot hold (a cpu rig, too few GPUs, a --dist other than loadgroup)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from specgate.serve.gpu import nvml_readings

if TYPE_CHECKING:
    from specgate.config.rig import Rig
    from specgate.plugin.resolve import SessionOptions

XDIST_REFUSAL = ("specgate: the perf tiers refuse pytest-xdist (-n) unless the rig is a gpu rig "
                 "and each worker gets its own GPUs (--dist loadgroup, enough GPUs for -n): "
                 "otherwise two servers would share an accelerator and measure each other's load. "
                 "Run them without -n.")


def visible_gpus(explicit: tuple[str, ...] | None) -> list[str]:
    """The GPUs to hand out: ``explicit``, else CUDA_VISIBLE_DEVICES, else all NVML sees."""
    if explicit:
        return list(explicit)
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [v.strip() for v in env.split(",") if v.strip()]
    try:
        return [str(r.index) for r in nvml_readings() if not r.uuid.startswith("MIG-")]
    except Exception:  # no NVML: no GPU to hand out
        return []


def assign_worker_gpus(visible: list[str], worker_index: int, worker_count: int,
                       per_server: int) -> str:
    """Worker i gets GPUs [i*per_server, (i+1)*per_server): disjoint sets; refuse when too few."""
    needed = worker_count * per_server
    if len(visible) < needed:
        raise pytest.UsageError(
            f"specgate: {worker_count} xdist workers x {per_server} GPU(s) per server need "
            f"{needed} GPUs, but {len(visible)} are available ({','.join(visible) or 'none'}); use "
            f"-n {len(visible) // per_server or 1} or fewer, or pass --specgate-gpus")
    return ",".join(visible[worker_index * per_server:(worker_index + 1) * per_server])


def worker_gpus(options: SessionOptions, rig: Rig) -> str | None:
    """This xdist worker's GPUs, or None when perf tests may not run here (see XDIST_REFUSAL)."""
    if options.worker_id is None or rig.tier != "gpu":
        return None
    if options.dist != "loadgroup":
        raise pytest.UsageError("specgate: under xdist the perf tiers need --dist loadgroup, so "
                                "that all tests of one mode run on one worker and its server "
                                "starts once")
    index = int(options.worker_id.removeprefix("gw"))
    return assign_worker_gpus(visible_gpus(options.gpus), index, options.worker_count,
                              rig.gpus_per_server)
