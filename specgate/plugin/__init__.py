"""specgate's pytest plugin: options, parametrization, fixtures, gates and the run's report.

``pytest_configure`` builds one :class:`SpecgateSession` and stores it on the config; the
fixtures below are thin wrappers over it. The server fixture is session-scoped and parametrized
directly on the rig's modes, so pytest groups the tests per mode and starts each server once
(check with ``pytest --setup-plan -m cpu``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import json
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specgate.errors import ConfigError, SpecgateError
from specgate.session import SessionOptions, SpecgateSession, default_run_dir

SESSION_KEY = pytest.StashKey[SpecgateSession]()


# -- options ---------------------------------------------------------------------------------
def parse_url(value: str) -> str:
    if not value.startswith(("http://", "https://")) or value.rstrip("/")[-3:] == "://":
        raise argparse.ArgumentTypeError(f"{value!r} is not an http(s) URL, e.g. http://127.0.0.1:8000")
    return value.rstrip("/")


def parse_gpu_list(value: str) -> list[str]:
    from specgate.gpu import is_gpu_id

    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items or not all(is_gpu_id(v) for v in items) or len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"{value!r} is not a list of distinct GPUs like 0,1,2 "
                                         f"(indices, GPU-<uuid> or MIG-<uuid>, as CUDA_VISIBLE_DEVICES takes)")
    return items


def parse_rig_name(value: str) -> str:
    if not value or "/" in value or value.startswith("."):
        raise argparse.ArgumentTypeError(f"{value!r} is not a rig name (a file stem under fixtures/rigs/)")
    return value


def parse_env_assignment(value: str) -> tuple[str, str]:
    name, sep, val = value.partition("=")
    if not sep or not name or not name.replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(f"{value!r} is not NAME=VALUE, e.g. SPECGATE_SLOWDOWN=0.10")
    return name, val


AB_SIDES = ("reference", "candidate")


def ab_from_options(config: pytest.Config):
    """An A/B from the --ab-* options, or None when none is given (the rig's [ab], if any, holds)."""
    import shlex

    from specgate.config import AB, Side

    given = {side: {"python": config.getoption(f"ab_{side}_python"),
                    "extra_args": tuple(shlex.split(config.getoption(f"ab_{side}_args") or "")),
                    "env": dict(config.getoption(f"ab_{side}_env") or [])} for side in AB_SIDES}
    if not any(v for side in given.values() for v in side.values()):
        return None
    return AB(**{side: Side(**values) for side, values in given.items()})


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specgate", "specgate: vLLM speculative-decoding performance gates")
    group.addoption("--rig", type=parse_rig_name, default=os.environ.get("SPECGATE_RIG", "cpu-smollm2"),
                    help="rig to run: fixtures/rigs/NAME.toml (default: cpu-smollm2, or $SPECGATE_RIG)")
    group.addoption("--specgate-fixtures", type=Path, default=None,
                    help="folder holding modes.toml, prompts.toml and rigs/ (default: <rootdir>/fixtures)")
    group.addoption("--baselines", type=Path, default=None, help="baselines file (default: <rootdir>/baselines.json)")
    group.addoption("--run-dir", type=Path, default=None,
                    help="where server logs and reports go (default: <rootdir>/.specgate/runs/<time>-<rig>)")
    group.addoption("--update-baselines", action="store_true",
                    help="write the measured values as baselines; those tests still FAIL, "
                         "so CI never updates silently")
    group.addoption("--regen-baselines", action="store_true",
                    help="write the measured values as baselines and let those tests pass")
    group.addoption("--strict-fingerprint", action="store_true",
                    help="fail a throughput gate when the baseline was measured on another accelerator/vLLM/model")
    group.addoption("--vllm-url", type=parse_url, default=None,
                    help="attach mode: test an already running server (starts nothing)")
    group.addoption("--vllm-mode", default=None,
                    help="attach mode: the rig's mode the running server was started with "
                         "(default: the reference mode)")
    group.addoption("--vllm-api-key", default=None,
                    help="attach mode: API key (or $SPECGATE_API_KEY); never printed or stored")
    group.addoption("--gpus", type=parse_gpu_list, default=None,
                    help="GPUs specgate may use: indices (0,1,2,3) or GPU-/MIG- UUIDs (default: "
                         "CUDA_VISIBLE_DEVICES, else all NVML sees); under xdist each worker gets "
                         "gpus_per_server of them for its servers")
    group.addoption("--record-responses", type=Path, default=None, metavar="DIR",
                    help="also record each started server's raw responses and /metrics into DIR, for the "
                         "fast tier's replay tests (as `python -m specgate record`, without extra starts)")
    for side in AB_SIDES:
        group.addoption(f"--ab-{side}-python", default=None, metavar="PYTHON",
                        help=f"A/B: the {side} side's python (its vLLM build's environment); "
                             "any --ab-* option makes the run an A/B: every mode on both sides, alternated")
        group.addoption(f"--ab-{side}-args", default=None, metavar="'ARGS'",
                        help=f"A/B: extra `vllm serve` arguments of the {side} side (one quoted string)")
        group.addoption(f"--ab-{side}-env", type=parse_env_assignment, action="append", default=None,
                        metavar="NAME=VALUE", help=f"A/B: an environment variable of the {side} side's servers "
                        "(repeatable), e.g. SPECGATE_SLOWDOWN=0.10 for a real injected slowdown")
    group.addoption("--report-only", type=Path, default=None, metavar="REPORT_JSON",
                    help="render the summary, Markdown and plots again from a saved report.json; runs no test")


def _check_project_config_loaded(config: pytest.Config) -> None:
    """Refuse a run that lost the project's pytest configuration.

    pytest looks for its config file from the common ancestor of the command line's path
    arguments, and before plugins load it cannot tell ``--run-dir /tmp/x`` from a test path: an
    option value that is an existing path outside the project moves the search to ``/``. The run
    would then go on without the markers, ``xfail_strict`` and the rootdir (where specgate finds
    ``fixtures/``), failing later and obscurely; say so now, with the way out.
    """
    if config.inipath is not None:
        return
    cwd = Path(config.invocation_params.dir)
    project = cwd / "pyproject.toml"
    if not (cwd / "fixtures" / "rigs").is_dir():
        return  # not a specgate project: another project's run is none of this plugin's business
    try:
        import tomllib

        if "ini_options" not in tomllib.loads(project.read_text()).get("tool", {}).get("pytest", {}):
            return
    except (OSError, ValueError):
        return
    args = list(config.invocation_params.args)
    culprits = [f"{flag} {value}" for flag, value in itertools.pairwise(args)
                if flag.startswith("--") and "=" not in flag and not value.startswith("-")
                and Path(value).exists() and not Path(value).resolve().is_relative_to(cwd.resolve())]
    raise pytest.UsageError(
        f"specgate: pytest did not load {project} (rootdir became {config.rootpath}), so the markers, "
        f"xfail_strict and the fixtures folder would be wrong. "
        + (f"pytest took the path in {', '.join(repr(c) for c in culprits)} for a test path when looking "
           "for its config. " if culprits else "")
        + "Write such options with '=' (--run-dir=/tmp/x), or add -c pyproject.toml.")


def pytest_configure(config: pytest.Config) -> None:
    _check_project_config_loaded(config)
    root = Path(config.rootpath)
    update = "regen" if config.getoption("regen_baselines") else (
        "update" if config.getoption("update_baselines") else "off")
    rig_name = config.getoption("rig")
    workerinput = getattr(config, "workerinput", None)
    run_dir = config.getoption("run_dir") or (
        Path(workerinput["specgate_run_dir"]) if workerinput and "specgate_run_dir" in workerinput
        else default_run_dir(root, rig_name))
    options = SessionOptions(
        rig_name=rig_name,
        fixtures_dir=config.getoption("specgate_fixtures") or root / "fixtures",
        baselines_path=config.getoption("baselines") or root / "baselines.json",
        run_dir=run_dir, worker_id=workerinput["workerid"] if workerinput else None,
        worker_count=int(workerinput["workercount"]) if workerinput else 1,
        repo_root=root, update=update, strict_fingerprint=config.getoption("strict_fingerprint"),
        attach_url=config.getoption("vllm_url"), attach_mode=config.getoption("vllm_mode"),
        api_key=config.getoption("vllm_api_key") or os.environ.get("SPECGATE_API_KEY"),
        record_dir=config.getoption("record_responses"), ab=ab_from_options(config),
    )
    config.stash[SESSION_KEY] = SpecgateSession(options, progress=_progress_writer(config))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: every worker writes into the controller's run directory."""
    node.workerinput["specgate_run_dir"] = str(get_session(node.config).options.run_dir)
    node.workerinput["specgate_dist"] = node.config.getoption("dist", "no")  # workers see "no"


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist controller: collect a finished worker's measurements, gate results and updates."""
    output = getattr(node, "workeroutput", {}).get("specgate")
    if output:
        get_session(node.config).absorb_worker(json.loads(output))


def visible_gpus(config: pytest.Config) -> list[str]:
    explicit = config.getoption("gpus")
    if explicit:
        return explicit
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [v.strip() for v in env.split(",") if v.strip()]
    try:
        from specgate.gpu import nvml_readings

        return [str(r.index) for r in nvml_readings() if not r.uuid.startswith("MIG-")]
    except Exception:  # no NVML: no GPU to hand out
        return []


def assign_worker_gpus(visible: list[str], worker_index: int, worker_count: int, per_server: int) -> str:
    """Worker i gets GPUs [i*per_server, (i+1)*per_server) of the visible list: disjoint sets, so no
    GPU ever hosts two servers. Refuse when there are not enough."""
    needed = worker_count * per_server
    if len(visible) < needed:
        raise pytest.UsageError(
            f"specgate: {worker_count} xdist workers x {per_server} GPU(s) per server need {needed} GPUs, "
            f"but {len(visible)} are available ({','.join(visible) or 'none'}); "
            f"use -n {len(visible) // per_server or 1} or fewer, or pass --gpus")
    return ",".join(visible[worker_index * per_server:(worker_index + 1) * per_server])


def _worker_gpus(config: pytest.Config, session: SpecgateSession) -> str | None:
    """This xdist worker's GPUs, or None when perf tests may not run here (see XDIST_REFUSAL)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or session.rig.tier != "gpu":
        return None
    if workerinput.get("specgate_dist") != "loadgroup":
        raise pytest.UsageError("specgate: under xdist the perf tiers need --dist loadgroup, so that all "
                                "tests of one mode run on one worker and its server starts once")
    index = int(workerinput["workerid"].removeprefix("gw"))
    return assign_worker_gpus(visible_gpus(config), index, int(workerinput["workercount"]),
                              session.rig.gpus_per_server)


def _progress_writer(config: pytest.Config):
    def emit(line: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        capman = config.pluginmanager.get_plugin("capturemanager")
        text = f"[specgate] {line}"
        if reporter is None:
            print(text, file=sys.stderr, flush=True)
            return
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            reporter.ensure_newline()
            reporter.write_line(text)
            reporter.flush()  # stdout to a file or CI log is block-buffered: show it now
    return emit


def get_session(config: pytest.Config) -> SpecgateSession:
    return config.stash[SESSION_KEY]


# -- parametrization ----------------------------------------------------------------------------
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Only tests that use a server (directly or through class_measurement) are perf tests; other
    # tests may use the same argument names for their own parametrization.
    if "vllm_server" not in metafunc.fixturenames:
        return
    session = get_session(metafunc.config)
    try:
        rig = session.rig
        modes = session.modes_to_run()
    except ConfigError as exc:
        pytest.fail(f"specgate configuration error: {exc}", pytrace=False)
    tier_marks = (getattr(pytest.mark, rig.tier), pytest.mark.perf)
    if "mode" in metafunc.fixturenames:
        # Every test gets the same mode list (same param indices): pytest keys its session-scoped
        # fixture cache and test reordering on them, so a shorter list for speculative-only tests
        # would start servers again. Non-speculative items of those tests are deselected later.
        # xdist_group: with --dist loadgroup every test of a mode runs on one worker (one server).
        metafunc.parametrize("mode", [pytest.param(m, id=m.name, marks=(*tier_marks, pytest.mark.xdist_group(m.name)))
                                      for m in modes], scope="session")
    if "prompt_class" in metafunc.fixturenames:
        metafunc.parametrize("prompt_class", [pytest.param(c, id=c.name, marks=tier_marks)
                                              for c in rig.prompt_classes])
    if "concurrency" in metafunc.fixturenames:
        metafunc.parametrize("concurrency", [pytest.param(n, id=f"c{n}", marks=tier_marks)
                                             for n in rig.protocol.concurrency])


XDIST_REFUSAL = ("specgate: the perf tiers refuse pytest-xdist (-n) unless the rig is a gpu rig and each worker "
                 "gets its own GPUs (--dist loadgroup, enough GPUs for -n): otherwise two servers would share "
                 "an accelerator and measure each other's load. Run them without -n.")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop speculative-only gates of the no-speculation mode (see pytest_generate_tests)."""
    keep, drop = [], []
    for item in items:
        mode = getattr(item, "callspec", None) and item.callspec.params.get("mode")
        if item.get_closest_marker("speculative_only") and mode is not None and not mode.is_speculative:
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    session = get_session(config)
    if keep and config.option.markexpr.strip() == "gpu" and session.rig.tier != "gpu":
        warnings.warn(f"-m gpu selected but rig {session.rig.name!r} is a {session.rig.tier} rig: "
                      "pass --rig NAME of a gpu rig", stacklevel=1)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Fail before any fixture runs, so no server is started by an xdist worker.
    if hasattr(item.config, "workerinput") and item.get_closest_marker("perf"):
        session = get_session(item.config)
        if session.options.worker_gpus is None:
            pytest.fail(session.options.worker_refusal or XDIST_REFUSAL, pytrace=False)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    specgate = get_session(session.config)
    if hasattr(session.config, "workerinput"):
        try:
            specgate.options.worker_gpus = _worker_gpus(session.config, specgate)
        except ConfigError:
            return  # reported at collection, with the file and key
        except pytest.UsageError as exc:
            # Raising here would crash the worker (and xdist would restart it 8 times): fail the
            # perf tests with the reason instead, before any server starts.
            specgate.options.worker_refusal = str(exc)


# -- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def specgate_session(request: pytest.FixtureRequest) -> SpecgateSession:
    return get_session(request.config)


@pytest.fixture(scope="session")
def rig(specgate_session: SpecgateSession):
    return specgate_session.rig


@pytest.fixture(scope="session")
def reference_server(specgate_session: SpecgateSession) -> Iterator[Any]:
    """Duet rigs: the no-speculation server, started before any other and live for the whole
    session; every mode's windows alternate requests with it. None on other designs."""
    session = specgate_session
    if session.rig.design != "duet" or session.options.attach_url:
        yield None
        return
    yield from serve(session, session.rig.mode(session.rig.reference_mode))


@pytest.fixture(scope="session")
def partner_server(mode, specgate_session: SpecgateSession, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The server a mode's windows alternate with: the live reference (duet rigs; none for the
    reference mode itself), the same mode on the reference side (A/B), or none (one at a time)."""
    session, rig = specgate_session, specgate_session.rig
    if session.options.attach_url or rig.design == "sequential":
        yield None
    elif rig.design == "duet":
        yield None if mode.name == rig.reference_mode else request.getfixturevalue("reference_server")
    else:  # A/B: the reference side starts first
        yield from serve(session, mode, side="reference")


@pytest.fixture(scope="session")
def vllm_server(mode, partner_server, specgate_session: SpecgateSession,
                request: pytest.FixtureRequest) -> Iterator[Any]:
    """One server per mode per session (per side in an A/B): started here, torn down (whole
    process group) after the mode's last test, or attached to with --vllm-url. A duet rig's
    reference mode is the live reference server itself."""
    session, rig = specgate_session, specgate_session.rig
    if rig.design == "duet" and mode.name == rig.reference_mode and not session.options.attach_url:
        yield request.getfixturevalue("reference_server")
        return
    yield from serve(session, mode, side="candidate" if rig.design == "ab" else None)


def serve(session: SpecgateSession, mode, *, side: str | None = None) -> Iterator[Any]:
    """Start (or attach to) one server of ``mode`` (on an A/B ``side``), record what it runs on,
    yield it, tear it down."""
    from specgate.fingerprint import collect, measured_with, server_vllm_version
    from specgate.server import AttachedServer, VLLMServer

    rig = session.rig
    label = f"{mode.name}@{side}" if side else mode.name
    if session.options.attach_url:
        server: Any = AttachedServer(session.options.attach_url, label=mode.name, api_key=session.options.api_key)
    else:
        if mode.optional_dependency and rig.argv_prefix[0] == sys.executable \
                and importlib.util.find_spec(mode.optional_dependency) is None:
            pytest.skip(f"mode {mode.name} needs the optional package {mode.optional_dependency!r} "
                        "in the server's environment")
        # A second live server (duet, A/B) shares the GPU on purpose: only the first is guarded.
        guard = gpu_guard(rig, session.options.worker_gpus) if not session.live_servers else None
        server = VLLMServer(build_server_spec(session, mode, side), progress=session.progress, before_start=guard)
    with server:
        session.live_servers += 1
        try:
            session.servers[label] = {
                "base_url": "attached" if session.options.attach_url else server.base_url,
                "ready_after_s": server.ready_after_s, "log": str(server.log_path) if server.log_path else None,
                "worker": session.options.worker_id, "side": side, "live_with": session.live_servers - 1,
                "gpus": session.options.worker_gpus or os.environ.get("CUDA_VISIBLE_DEVICES")}
            session.fingerprints[mode.name if side in (None, "candidate") else label] = collect(
                tier=rig.tier, model=rig.model, speculative_config=mode.speculative_config,
                vllm_version=server_vllm_version(server.base_url, server.api_key), repo=session.options.repo_root,
                gpus=session.options.worker_gpus or os.environ.get("CUDA_VISIBLE_DEVICES"),
                concurrent_servers=session.options.worker_count, **measured_with(rig, mode))
            if session.options.record_dir is not None and side != "reference":
                _record(session, server, mode)
            yield server
        finally:
            session.live_servers -= 1


def _record(session: SpecgateSession, server, mode) -> None:
    import httpx

    from specgate.record import record_server

    record_dir = session.options.record_dir
    try:
        record_server(server.base_url, session.rig.served_model_name, mode.name, record_dir, api_key=server.api_key,
                      timeout_s=session.rig.protocol.request_timeout_s)
        session.progress(f"recorded {mode.name}'s responses and /metrics into {record_dir}")
    except (httpx.HTTPError, OSError) as exc:  # the recording is a by-product: the run goes on
        warnings.warn(f"--record-responses: recording mode {mode.name} into {record_dir} failed: "
                      f"{type(exc).__name__}: {exc}", stacklevel=1)


def build_server_spec(session: SpecgateSession, mode, side: str | None = None):
    from specgate.server import spec_for_mode

    rig = session.rig
    return spec_for_mode(rig, mode, log_dir=session.options.run_dir, gpus=session.options.worker_gpus,
                         side=getattr(rig.ab, side) if (side and rig.ab) else None, side_name=side)


def gpu_guard(rig, worker_gpus: str | None):
    """Before a gpu-tier start: refuse when GPU memory is still held (by an earlier server)."""
    if rig.tier != "gpu":
        return None
    from specgate.gpu import require_free_gpus

    visible = worker_gpus if worker_gpus is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    return lambda: require_free_gpus(visible, count=rig.gpus_per_server)


@pytest.fixture
def class_measurement(request: pytest.FixtureRequest, vllm_server, partner_server, mode, prompt_class, concurrency,
                      specgate_session: SpecgateSession):
    """The measurement window of (mode, class, concurrency), taken once and shared by every gate.

    The test that takes it also records it with pytest-benchmark (one round per pass over the
    class's prompts), so ``--benchmark-autosave`` / ``--benchmark-compare`` keep a history."""
    key = (mode.name, prompt_class.name, concurrency)
    rig = specgate_session.rig
    reused = (specgate_session.reference_from_duets(prompt_class.name, concurrency)
              if rig.design == "duet" and mode.name == rig.reference_mode else None)
    if reused is not None:  # the reference side of a duet window: measured (and benchmarked) there
        return reused
    fresh = key not in specgate_session.measurements and key not in specgate_session.failures
    benchmark = request.getfixturevalue("benchmark") if fresh and _benchmark_usable(request) else None
    kwargs = {}
    if benchmark is not None:
        benchmark.group = f"{specgate_session.rig.name}/{prompt_class.name}/c{concurrency}"
        kwargs["run_rounds"] = lambda round_fn, rounds: benchmark.pedantic(round_fn, rounds=rounds, iterations=1)
    try:
        if partner_server is not None:
            ab = rig.design == "ab"
            kwargs.update(partner=partner_server, partner_side="reference" if ab else "partner",
                          partner_mode=mode if ab else rig.mode(rig.reference_mode))
        measurement = specgate_session.measure(vllm_server, mode, prompt_class, concurrency, **kwargs)
    except SpecgateError as exc:
        pytest.fail(str(exc), pytrace=False)
    if benchmark is not None:
        benchmark.extra_info.update(_benchmark_info(measurement))
    return measurement


def _benchmark_usable(request: pytest.FixtureRequest) -> bool:
    """pytest-benchmark present and enabled (it disables itself under xdist and with
    --benchmark-disable, and then runs a target once: the plain loop must run the rounds)."""
    bs = getattr(request.config, "_benchmarksession", None)
    return bs is not None and not bs.disabled


def _benchmark_info(m) -> dict[str, Any]:
    import statistics

    rates = m.decode_tokens_per_s
    info: dict[str, Any] = {"rig": m.rig, "mode": m.mode, "prompt_class": m.prompt_class,
                            "concurrency": m.concurrency,
                            "decode_tokens_per_s_median": statistics.median(rates) if rates else None,
                            "aggregate_tokens_per_s": m.aggregate_tokens_per_s, "requests": len(m.records)}
    if m.acceptance is not None:
        info.update(mean_acceptance_length=m.acceptance.mean_acceptance_length,
                    acceptance_rate=m.acceptance.acceptance_rate,
                    per_position_rates=list(m.acceptance.per_position_rates))
    return info


@pytest.fixture
def gatekeeper(specgate_session: SpecgateSession) -> GateKeeper:
    return GateKeeper(specgate_session)


class GateKeeper:
    """Runs one gate on one measurement, records the result and fails the test with its reason."""

    def __init__(self, session: SpecgateSession) -> None:
        self.session = session
        self.rig = session.rig

    def _where(self, m) -> str:
        return f"rig {self.rig.name} / mode {m.mode} / class {m.prompt_class} / concurrency {m.concurrency}"

    def _update(self, m, gate: str) -> bool:
        """In update mode, queue the measured values as the new baseline; True when the gate is done."""
        from specgate.gates import baseline_entry

        update = self.session.options.update
        if update == "off":
            return False
        fingerprint = self.session.fingerprints.get(m.mode)
        from specgate.baselines import Fingerprint, lookup

        previous = lookup(self.session.store, self.rig.name, m.mode, m.prompt_class, m.concurrency)
        entry = baseline_entry(m, fingerprint or Fingerprint(), previous)
        self.session.queue_update(m, entry)
        message = (f"baseline of {self._where(m)} will be written to {self.session.options.baselines_path} "
                   f"at the end of the run (median {entry.median:.1f} tok/s, n={entry.n})")
        self.session.record_undecided(gate, m, "baseline update", message)
        if update == "update":
            pytest.fail(f"{message}; this test fails so an update never passes silently: run again without "
                        "--update-baselines", pytrace=False)
        return True

    def _stored(self, m, gate: str):
        from specgate.baselines import lookup

        entry = lookup(self.session.store, self.rig.name, m.mode, m.prompt_class, m.concurrency)
        if entry is None:
            message = (f"no baseline for {self._where(m)} in {self.session.options.baselines_path}; create it "
                       f"with: pytest -m {self.rig.tier} --rig {self.rig.name} --update-baselines")
            self.session.record_undecided(gate, m, "no baseline", message)
            pytest.fail(message, pytrace=False)
        return entry

    def _finish(self, result) -> None:
        __tracebackhide__ = True
        if result.details.get("undecided"):  # the interval straddles the threshold: say so, never "passed"
            self.session.record_undecided(result.gate, result, "inconclusive", result.message)
            pytest.skip(f"{result.gate} gate undecided: {result.message}")
        self.session.record(result)
        if result.passed:
            return
        if result.declared:
            pytest.xfail(f"declared backfire, reported and not failed: {result.message}")
        pytest.fail(f"{result.gate} gate: {result.message}", pytrace=False)

    def throughput(self, m) -> None:
        __tracebackhide__ = True
        from specgate.baselines import baseline_notes
        from specgate.gates import check_throughput

        if self._update(m, "throughput"):
            return
        if m.partner is not None and m.partner.side == "reference":  # A/B: the live reference side decides
            self._finish(check_throughput(self.rig, m, None))
            return
        stored = self._stored(m, "throughput")
        fit = self._comparable(m, stored, "throughput")
        from specgate.baselines import OTHER_MACHINE

        if fit.kind == OTHER_MACHINE:
            # A level or a speedup ratio from another CPU or GPU says nothing about this one (one dev
            # machine ran the cpu tier at ~33 tok/s, another at ~59): never compared, said so.
            note = f"baseline of {self._where(m)} {fit.describe()}; not compared; refresh it with: {self._refresh(m)}"
            self.session.record_undecided("throughput", m, "other machine", note)
            pytest.skip(f"throughput gate undecided: {note}")
        result = check_throughput(self.rig, m, stored)
        result.details.update(baseline_notes(fit, m.decode_tokens_per_s, stored.median, self._refresh(m)))
        self._finish(result)

    def _refresh(self, m) -> str:
        return (f"pytest -m {self.rig.tier} --rig {self.rig.name} --update-baselines "
                f"-k '{m.mode}-{m.prompt_class}-c{m.concurrency}'")

    def _comparable(self, m, stored, gate: str):
        """Refuse a stored figure measured on other prompts or with another protocol (the gate is
        undecided, naming what differs); another machine or setup is reported, and refused under
        --strict-fingerprint. The one decision is baselines.comparability."""
        from specgate.baselines import OTHER_MEASUREMENT, SAME, comparability

        now = self.session.fingerprints.get(m.mode)
        fit = comparability(stored.fingerprint, now and now.for_window(m.prompt_class, m.concurrency))
        strict = fit.kind != SAME and gate == "throughput" and self.session.options.strict_fingerprint
        if fit.kind == OTHER_MEASUREMENT or strict:
            note = f"baseline of {self._where(m)} {fit.describe()}; refresh it with: {self._refresh(m)}"
            self.session.record_undecided(gate, m, "fingerprint", note)
            if fit.kind == OTHER_MEASUREMENT and not strict:  # undecided: reported, never a pass or a failure
                pytest.skip(f"{gate} gate undecided: {note}")
            pytest.fail(note + (" (--strict-fingerprint)" if strict else ""), pytrace=False)
        if fit.kind != SAME and gate == "throughput":
            warnings.warn(f"baseline of {self._where(m)} {fit.describe()}", stacklevel=1)
        return fit

    def acceptance(self, m) -> None:
        __tracebackhide__ = True
        from specgate.gates import check_acceptance

        if self._update(m, "acceptance"):
            return
        if m.partner is not None and m.partner.side == "reference":  # A/B: against the reference side's window
            from specgate.baselines import Fingerprint
            from specgate.gates import baseline_entry

            stored = baseline_entry(m.partner, Fingerprint())
        else:
            stored = self._stored(m, "acceptance")
            self._comparable(m, stored, "acceptance")
        result = check_acceptance(self.rig, m, stored)
        if result.details.get("undecided"):  # too few drafts: neither a pass nor a failure
            self.session.record_undecided("acceptance", m, "too few drafts", result.message)
            pytest.skip(f"acceptance gate undecided: {result.message}")
        self._finish(result)

    def _reference(self, m):
        if m.partner is not None and m.partner.side != "reference" and m.partner.mode == self.rig.reference_mode:
            return m.partner  # a duet window: its alternated no-speculation side
        if self.session.options.attach_url:
            pytest.skip("attach mode measures one server: the same-session no-speculation reference "
                        "this gate needs is not available")
        if self.session.options.worker_id is not None and self.session.reference_measurement(
                m.prompt_class, m.concurrency, wait_s=0) is None:
            # Waiting here could deadlock: xdist may hand the reference mode to a worker only after
            # this one finishes. The controller decides this gate once every worker is done.
            self.session.deferred.append((m.mode, m.prompt_class, m.concurrency))
            current = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
            if current:
                gate = current.split("::")[-1].split("[")[0].removeprefix("test_")
                self.session.deferred_tests[current] = [gate, m.mode, m.prompt_class, m.concurrency]
            pytest.skip("under xdist this cross-mode gate is decided on the controller after all workers "
                        "finish (see the specgate summary)")
        reference = self.session.reference_measurement(m.prompt_class, m.concurrency)
        if reference is None:
            key = (self.rig.reference_mode, m.prompt_class, m.concurrency)
            why = self.session.failures.get(key)
            pytest.fail(f"{m.mode} on {m.prompt_class}: the no-speculation mode {self.rig.reference_mode!r} was not "
                        "measured in this session" + (f" ({str(why).splitlines()[0]})" if why else
                                                      " (select it too, e.g. drop -k / --deselect)"), pytrace=False)
        return reference

    def backfire(self, m) -> None:
        __tracebackhide__ = True
        from specgate.gates import check_backfire

        result = check_backfire(self.rig, m, self._reference(m))
        if result.passed and result.declared and not result.details.get("undecided"):
            warnings.warn(f"{m.mode} on {m.prompt_class} is declared to backfire but did not this run: "
                          f"{result.message}", stacklevel=1)
        self._finish(result)

    def lossless(self, m) -> None:
        __tracebackhide__ = True
        from specgate.gates import check_lossless

        self._finish(check_lossless(self.rig, m, self._reference(m)))


# -- end of the run ----------------------------------------------------------------------------
def _has_perf_work(session: SpecgateSession) -> bool:
    return bool(session.measurements or session.failures or session.servers or session.worker_reports)


def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """--report-only: render a saved report again (summary, Markdown, plots), start nothing."""
    path = config.getoption("report_only")
    if path is None:
        return None
    from specgate.report import render_all, render_text
    from specgate.session import load_report

    try:
        report = load_report(path)
    except SpecgateError as exc:
        print(f"specgate: {exc}", file=sys.stderr)
        return int(pytest.ExitCode.USAGE_ERROR)
    print(render_text(report))
    written = render_all(report, Path(path).parent)
    for name, out in written.items():
        print(f"{name}: {out}")
    return int(pytest.ExitCode.OK)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    specgate = get_session(session.config)
    if hasattr(session.config, "workerinput"):
        if _has_perf_work(specgate):
            session.config.workeroutput["specgate"] = json.dumps(specgate.worker_output())
        return
    if not _has_perf_work(specgate):
        return
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    if specgate.deferred_failed:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if interrupted:
        if specgate.pending_updates:
            specgate.progress(
                f"{len(specgate.pending_updates)} baseline update(s) not written: the run was interrupted, and a "
                "cut-short run never touches the baselines. To keep the windows that finished: "
                f"python -m specgate adopt-baselines {specgate.report_path}")
        specgate.pending_updates.clear()
    else:
        written = specgate.flush_updates()
        if written:
            specgate.progress(f"baselines written to {written}")
    from specgate.report import render_all

    path = specgate.write_report(complete=not interrupted)
    written = render_all(specgate.report_data(complete=not interrupted), specgate.options.run_dir)
    markdown = written["summary"].read_text()
    summary_env = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_env:
        with contextlib.suppress(OSError), open(summary_env, "a") as handle:
            handle.write(markdown)
    specgate.progress(f"report: {path}")


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session):
    """xdist controller, once every worker is done (not after an interrupt: the yield raises):
    decide the cross-mode gates workers deferred, and report each as a test result, so the
    terminal, JUnit XML and the exit code carry it like any other test."""
    result = yield
    specgate = get_session(session.config)
    if not hasattr(session.config, "workerinput") and specgate.worker_reports:
        _decide_deferred_gates(specgate)
        for report in deferred_test_reports(specgate):
            # As xdist relays a worker's report: the terminal, JUnit XML and session.testsfailed see it.
            session.config.hook.pytest_runtest_logreport(report=report)
    return result


def deferred_test_reports(specgate: SpecgateSession) -> list[pytest.TestReport]:
    """One call-phase report per test a worker deferred, with the controller's verdict, under the
    test's node id with "-controller" added to its parameters (the worker reported it as skipped)."""
    decided = {(r.gate, r.mode, r.prompt_class, r.concurrency): r for r in specgate.results}
    reports = []
    for worker in specgate.worker_reports:
        for nodeid, (gate, mode, prompt_class, concurrency) in worker.get("deferred_tests", {}).items():
            result = decided.get((gate, mode, prompt_class, concurrency))
            if result is None:  # a window is missing: already reported as NOT MEASURED
                continue
            if result.passed:
                outcome, longrepr = "passed", None
            elif result.declared:  # as the worker would have: an expected failure
                outcome, longrepr = "skipped", None
            else:
                outcome, longrepr = "failed", f"{gate} gate (decided on the xdist controller): {result.message}"
            base = nodeid.split("@")[0]  # without xdist's "@<group>" suffix
            controller_id = f"{base[:-1]}-controller]" if base.endswith("]") else f"{base}[controller]"
            path, _, name = controller_id.partition("::")
            report = pytest.TestReport(nodeid=controller_id, location=(path, None, name), keywords={},
                                       outcome=outcome, longrepr=longrepr, when="call")
            if result.declared and not result.passed:
                report.wasxfail = f"declared backfire: {result.declared}"
            reports.append(report)
    return reports


def _decide_deferred_gates(specgate: SpecgateSession) -> bool:
    """xdist controller: the backfire and lossless gates workers deferred, on the merged windows.
    Returns True when one of them failed (the run then exits as failed)."""
    from specgate.gates import check_backfire, check_lossless
    from specgate.measure import ClassMeasurement

    merged = specgate.report_data(complete=True)
    windows = {(m["mode"], m["prompt_class"], m["concurrency"]): m for m in merged["measurements"]}
    deferred = {tuple(key) for report in specgate.worker_reports for key in report.get("deferred", [])}
    failed = False
    for mode, prompt_class, concurrency in sorted(deferred):
        mine = windows.get((mode, prompt_class, concurrency))
        ref = windows.get((specgate.rig.reference_mode, prompt_class, concurrency))
        if mine is None or ref is None:
            continue  # the missing window is already reported as NOT MEASURED
        m, r = ClassMeasurement.from_dict(mine), ClassMeasurement.from_dict(ref)
        for result in (check_backfire(specgate.rig, m, r), check_lossless(specgate.rig, m, r)):
            specgate.record(result)
            failed |= not result.passed and not result.declared
    specgate.deferred_failed = failed
    return failed


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    specgate = get_session(config)
    if not _has_perf_work(specgate):
        return
    from specgate.report import render_text

    terminalreporter.section("specgate summary")
    terminalreporter.write_line(render_text(specgate.report_data(
        complete=exitstatus != pytest.ExitCode.INTERRUPTED)))
    terminalreporter.write_line(f"run directory: {specgate.options.run_dir}")
