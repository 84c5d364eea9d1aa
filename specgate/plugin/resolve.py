"""The run's options (:class:`SessionOptions`, frozen in ``pytest_configure``) and
:func:`resolve_run`, which turns them into specgate.decide.settings.RunSettings at the run's first
need, so a run without perf tests reads no rig and loads no pydantic."""

from __future__ import annotations

import datetime as dt
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pytest

from specgate.lazy import baselines, fingerprint, settings
from specgate.lazy import rig as config
from specgate.plugin.gpu_split import worker_gpus

if TYPE_CHECKING:
    from specgate.config.rig import AB, Rig
    from specgate.decide.settings import RunSettings

UpdateMode = Literal["off", "update", "regen"]


@dataclass(frozen=True)
class SessionOptions:
    """The --specgate-* options (on an xdist worker, with what the controller sent)."""

    rig_name: str
    fixtures_dir: Path
    baselines_path: Path
    run_dir: Path
    repo_root: Path
    update: UpdateMode = "off"
    baselines_given: bool = False  # a given path that names no file is refused (unless storing)
    strict_fingerprint: bool = False
    attach_url: str | None = None
    attach_mode: str | None = None
    api_key: str | None = None
    record_dir: Path | None = None  # --specgate-record-responses: raw responses here
    gpus: tuple[str, ...] | None = None  # --specgate-gpus: the GPUs to hand out to xdist workers
    worker_id: str | None = None
    worker_count: int = 1  # xdist workers (each runs one server at a time); 1 without xdist
    dist: str | None = None  # xdist's --dist from the controller (workers see "no")
    ab: AB | None = None  # from the --specgate-ab-* options (overrides the rig's [ab])
    time_budget_s: float | None = None  # --specgate-session-budget (None: unbounded)
    keep_servers: bool = False
    started_at: float = field(default_factory=time.monotonic)
    undecided_policy: dict[str, str] | None = None  # --specgate-undecided, over the rig's
    start_seed: int | None = None  # None: drawn
    first_side: str | None = None  # --specgate-first-side, over the seed's pick
    gating: dict[str, str] | None = None  # --specgate-gating, over the rig's
    arrangement: str | None = None  # --specgate-arrangement, over the rig's


def load_run_rig(options: SessionOptions) -> Rig:
    """The rig file as the options amend it (an A/B of the command line, another arrangement)."""
    rig = config.load_rig(options.rig_name, options.fixtures_dir)
    if options.ab is not None:
        rig = rig.model_copy(update={"ab": options.ab})
        config.check_sleep_level(rig, ab_from=" (the --specgate-ab-* options)")
    if options.arrangement is not None:
        rig = rig.model_copy(update={"arrangement_key": options.arrangement})
    return rig


def resolve_run(options: SessionOptions) -> tuple[RunSettings, str | None]:
    """The run's settings, and why this xdist worker may start no server (None where it may);
    ConfigError names a refused file and key."""
    rig = load_run_rig(options)
    refusal = None
    try:
        gpus = worker_gpus(options, rig)
    except pytest.UsageError as exc:
        # raised in a worker it would crash it: its perf tests fail with the reason instead
        gpus, refusal = None, str(exc)
    visible = gpus or os.environ.get("CUDA_VISIBLE_DEVICES")
    run = settings.RunSettings.resolve(
        rig, baselines.load_baselines(options.baselines_path),
        machine=fingerprint.machine_id(rig.tier, visible), worker_gpus=gpus, gpus=visible,
        outcome_policy=options.undecided_policy, gating=options.gating)
    return run, refusal


def default_run_dir(root: Path, rig_name: str) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return root / ".specgate" / "runs" / f"{stamp}-{rig_name}-{os.getpid()}"
