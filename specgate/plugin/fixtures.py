"""specgate's fixtures, thin wrappers over the run's SpecgateSession; the server fixtures are
session-scoped and parametrized on the mode (parametrize.py), so each server starts once."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from specgate.errors import SpecgateError
from specgate.lazy import fingerprint, record, registry, sleep
from specgate.lazy import gatekeeper as gatekeeper_mod
from specgate.lazy import server as server_mod
from specgate.plugin.configure import get_session
from specgate.plugin.session import SpecgateSession
from specgate.serve.gpu import require_free_gpus

if TYPE_CHECKING:
    from specgate.plugin.gatekeeper import GateKeeper


@pytest.fixture(scope="session")
def specgate_session(request: pytest.FixtureRequest) -> SpecgateSession:
    return get_session(request.config)


@pytest.fixture(scope="session")
def rig(specgate_session: SpecgateSession):
    return specgate_session.settings.rig


@pytest.fixture(scope="session")
def sleep_controller(specgate_session: SpecgateSession) -> Any:
    """Alternation rigs: the SleepController every server registers with; else None."""
    session = specgate_session
    if session.options.attach_url or session.settings.rig.arrangement.name != "alternation":
        return None
    rig = session.settings.rig
    session.progress(f"arrangement: alternation ({rig.arrangement.reason}); servers start with "
                     "vLLM sleep mode")
    return sleep.SleepController(rig, progress=session.progress,
                                 kept_asleep=registry.asleep_at_sleep_level_1,
                                 gpus=session.settings.gpus)


@pytest.fixture(scope="session")
def reference_server(specgate_session: SpecgateSession, sleep_controller) -> Iterator[Any]:
    """Duet rigs: the no-speculation server, live all session; None elsewhere."""
    session = specgate_session
    rig = session.settings.rig
    if rig.comparing != "duet" or session.options.attach_url:
        yield None
        return
    yield from serve(session, rig.mode(rig.reference_mode), sleeper=sleep_controller)


@pytest.fixture(scope="session")
def partner_server(mode, specgate_session: SpecgateSession, sleep_controller,
                   request: pytest.FixtureRequest) -> Iterator[Any]:
    """The server a mode's windows alternate with: the live reference (duet rigs), the same mode on
    the reference side (A/B), or none."""
    session, rig = specgate_session, specgate_session.settings.rig
    if session.options.attach_url or rig.comparing == "sequential":
        yield None
    elif rig.comparing == "duet":
        yield (None if mode.name == rig.reference_mode
               else request.getfixturevalue("reference_server"))
    # A/B: the session's seed picks the side started first
    elif session.first_side(mode.name) == "reference":
        yield from serve(session, mode, side="reference", sleeper=sleep_controller)
    else:  # the candidate first: started here, handed to vllm_server, torn down after the reference
        first = serve(session, mode, side="candidate", sleeper=sleep_controller)
        session.started_first[mode.name] = next(first)
        try:
            yield from serve(session, mode, side="reference", sleeper=sleep_controller)
        finally:
            session.started_first.pop(mode.name, None)
            first.close()


@pytest.fixture(scope="session")
def vllm_server(mode, partner_server, specgate_session: SpecgateSession, sleep_controller,
                request: pytest.FixtureRequest) -> Iterator[Any]:
    """One server per mode per session (per side in an A/B), torn down after the mode's last test,
    or attached to with --specgate-vllm-url; a duet's reference mode is the reference server."""
    session, rig = specgate_session, specgate_session.settings.rig
    if rig.comparing == "duet" and mode.name == rig.reference_mode \
            and not session.options.attach_url:
        yield request.getfixturevalue("reference_server")
        return
    # an A/B whose candidate side started first (partner_server)
    if mode.name in session.started_first:
        yield session.started_first[mode.name]
        return
    yield from serve(session, mode, side="candidate" if rig.comparing == "ab" else None,
                     sleeper=sleep_controller)


def serve(session: SpecgateSession, mode, *, side: str | None = None,
          sleeper: Any = None) -> Iterator[Any]:
    """Start (or attach to) one server of ``mode`` (on an A/B ``side``), record it, yield it, tear
    it down; with ``sleeper`` it starts with sleep mode and takes turns."""
    label = f"{mode.name}@{side}" if side else mode.name
    with contextlib.ExitStack() as stack:
        try:
            server = _server(session, mode, side, sleeper)
            stack.enter_context(server)
        except (SpecgateError, pytest.fail.Exception) as exc:  # pytest.fail: a start's timeout
            session.record_server_failure(label, exc)
            raise
        yield from _serving(session, server, mode, side, label, sleeper)


def _server(session: SpecgateSession, mode, side: str | None, sleeper: Any) -> Any:
    """``mode``'s server object (on an A/B ``side``): attached, kept or new, not entered."""
    rig = session.settings.rig
    if session.options.attach_url:
        return server_mod.AttachedServer(session.options.attach_url, label=mode.name,
                                         api_key=session.options.api_key)
    if mode.optional_dependency and rig.argv_prefix[0] == sys.executable \
            and importlib.util.find_spec(mode.optional_dependency) is None:
        pytest.skip(f"mode {mode.name} needs the optional package {mode.optional_dependency!r} "
                    "in the server's environment")
    server_mod.check_local_paths(rig, mode)
    # a second live server (duet, A/B) shares the GPU on purpose: only the first is guarded,
    # but in an alternation every start is
    guard = gpu_guard(rig, session.settings.worker_gpus) if not session.live_servers else None
    spec = session.server_spec(mode, side)
    if sleeper is not None:
        spec = sleep.with_sleep_mode(spec)
        guard = (lambda: sleeper.require_room(spec)) if rig.tier == "gpu" else None
        try:
            sleep.run(sleeper.make_room())
        except SpecgateError as exc:
            pytest.fail(str(exc), pytrace=False)
    if session.options.keep_servers:
        return _kept_or_started(session, mode, side, spec, guard, alternating=sleeper is not None)
    return server_mod.VLLMServer(spec, progress=session.progress, before_start=guard)


def _serving(session: SpecgateSession, server: Any, mode, side: str | None, label: str,
             sleeper: Any) -> Iterator[Any]:
    """An entered server: recorded in the session (address, fingerprint), yielded, left."""
    rig = session.settings.rig
    session.live_servers += 1
    if sleeper is not None:
        asleep_at = getattr(server, "asleep_at", None)  # a kept one an earlier session left asleep
        sleeper.add(server, asleep_at=asleep_at() if asleep_at else None)
    try:
        session.servers[label] = {
            "base_url": "attached" if session.options.attach_url else server.base_url,
            "ready_after_s": server.ready_after_s,
            "log": str(server.log_path) if server.log_path else None,
            "worker": session.options.worker_id, "side": side,
            "live_with": session.live_servers - 1, "gpus": session.settings.gpus}
        name = mode.name if side in (None, "candidate") else label
        session.fingerprints[name] = fingerprint.collect(
            tier=rig.tier, model=rig.model, speculative_config=mode.speculative_config,
            vllm_version=fingerprint.server_vllm_version(server.base_url, server.api_key),
            repo=session.options.repo_root, gpus=session.settings.gpus,
            concurrent_servers=session.options.worker_count, **fingerprint.measured_with(rig, mode))
        if session.options.record_dir is not None and side != "reference":
            _record(session, server, mode)
        yield server
    finally:
        session.live_servers -= 1
        if sleeper is not None:
            sleep.run(sleeper.leave(server, stays_running=session.options.keep_servers))


def _kept_or_started(session: SpecgateSession, mode, side: str | None, spec, guard, *,
                     alternating: bool):
    """--specgate-keep-servers: a kept server of the same fingerprint, else a new one kept after the
    session. On a one-at-a-time GPU rig the other kept servers are stopped first; in an alternation
    a kept one is reused awake, or asleep at sleep level 1 (one at sleep level 2 is restarted)."""
    rig = session.settings.rig
    label = f"{mode.name}@{side}" if side else mode.name
    one_at_a_time = rig.tier == "gpu" and rig.comparing == "sequential" and not alternating
    others = [m.name for m in rig.modes if m.name != mode.name] if one_at_a_time else []
    return registry.kept_or_started(spec, rig=rig, mode_label=label, progress=session.progress,
                                    before_start=guard, stop_others=others,
                                    refuse=functools.partial(registry.awake_or_why,
                                                             api_key=spec.api_key)
                                    if alternating else None)


def _record(session: SpecgateSession, server, mode) -> None:
    import httpx

    record_dir = session.options.record_dir
    try:
        record.record_server(server.base_url, session.settings.rig.served_model_name, mode.name,
                             record_dir, api_key=server.api_key,
                             timeout_s=session.settings.rig.protocol.request_timeout_s)
        session.progress(f"recorded {mode.name}'s responses and /metrics into {record_dir}")
    except (httpx.HTTPError, OSError) as exc:  # the recording is a by-product: the run goes on
        warnings.warn(f"--specgate-record-responses: recording mode {mode.name} into {record_dir} "
                      f"failed: {type(exc).__name__}: {exc}", stacklevel=1)


def gpu_guard(rig, worker_gpus: str | None):
    """Before a gpu-tier start: refuse when GPU memory is still held (by an earlier server)."""
    if rig.tier != "gpu":
        return None
    visible = worker_gpus if worker_gpus is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    return lambda: require_free_gpus(visible, count=rig.gpus_per_server)


@pytest.fixture
def class_measurement(request: pytest.FixtureRequest, vllm_server, partner_server, mode,
                      prompt_class, concurrency,
                      specgate_session: SpecgateSession, sleep_controller):
    """The window of (mode, class, concurrency), taken once and shared by every gate; recorded with
    pytest-benchmark when usable (one round per pass over the prompts)."""
    key = (mode.name, prompt_class.name, concurrency)
    rig = specgate_session.settings.rig
    reused = (specgate_session.reference_from_duets(prompt_class.name, concurrency)
              if rig.comparing == "duet" and mode.name == rig.reference_mode else None)
    if reused is not None:  # the reference side of a duet window: measured (and benchmarked) there
        return reused
    fresh = key not in specgate_session.measurements and key not in specgate_session.failures
    benchmark = (request.getfixturevalue("benchmark")
                 if fresh and _benchmark_usable(request) else None)
    kwargs = {}
    if benchmark is not None:
        benchmark.group = f"{specgate_session.settings.rig.name}/{prompt_class.name}/c{concurrency}"
        kwargs["run_rounds"] = lambda round_fn, rounds: benchmark.pedantic(
            round_fn, rounds=rounds, iterations=1)
    try:
        if partner_server is not None:
            ab = rig.comparing == "ab"
            kwargs.update(partner=partner_server, ab=ab,
                          partner_mode=mode if ab else rig.mode(rig.reference_mode))
            if sleep_controller is not None:
                kwargs["sleeper"] = sleep_controller
        # a window of its own on an alternation's server: wake it
        elif sleep_controller is not None and fresh:
            sleep.run(sleep_controller.activate(vllm_server))
        measurement = specgate_session.measure(vllm_server, mode, prompt_class, concurrency,
                                               **kwargs)
    except SpecgateError as exc:
        pytest.fail(str(exc), pytrace=False)
    if benchmark is not None:
        benchmark.extra_info.update(_benchmark_info(measurement))
    return measurement


def _benchmark_usable(request: pytest.FixtureRequest) -> bool:
    """pytest-benchmark present and enabled (else the plain loop runs the rounds)."""
    bs = getattr(request.config, "_benchmarksession", None)
    return bs is not None and not bs.disabled


def _benchmark_info(m) -> dict[str, Any]:
    import statistics

    rates = m.decode_tokens_per_s
    info: dict[str, Any] = {"rig": m.rig, "mode": m.mode, "prompt_class": m.prompt_class,
                            "concurrency": m.concurrency,
                            "decode_tokens_per_s_median": statistics.median(rates) if rates
                            else None, "aggregate_tokens_per_s": m.aggregate_tokens_per_s,
                            "requests": len(m.records)}
    if m.acceptance is not None:
        info.update(mean_acceptance_length=m.acceptance.mean_acceptance_length,
                    acceptance_rate=m.acceptance.acceptance_rate,
                    per_position_rates=list(m.acceptance.per_position_rates))
    return info


@pytest.fixture
def gatekeeper(specgate_session: SpecgateSession) -> GateKeeper:
    # the gates load here (specgate.lazy): they bring numpy, scipy and pydantic
    return gatekeeper_mod.GateKeeper(specgate_session)

