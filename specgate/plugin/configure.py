"""The run's one SpecgateSession, built in ``pytest_configure`` and kept on the config's stash."""

from __future__ import annotations

import itertools
import os
import tomllib
from pathlib import Path

import pytest

from specgate.config.locations import resolve_fixtures_dir, rig_name_of
from specgate.plugin.options import ab_from_options, parse_duration
from specgate.plugin.output import progress_writer
from specgate.plugin.resolve import SessionOptions, default_run_dir
from specgate.plugin.session import SpecgateSession

SESSION_KEY = pytest.StashKey[SpecgateSession]()


def get_session(config: pytest.Config) -> SpecgateSession:
    return config.stash[SESSION_KEY]


def check_project_config_loaded(config: pytest.Config) -> None:
    """Refuse a run that lost the project's pytest configuration (an option value that is a path
    outside the project moves pytest's config search to ``/``: no markers, xfail_strict)."""
    if config.inipath is not None:
        return
    cwd = Path(config.invocation_params.dir)
    project = cwd / "pyproject.toml"
    if not (cwd / "fixtures" / "rigs").is_dir():
        return  # not a specgate project: another project's run is none of this plugin's business
    try:
        pytest_table = tomllib.loads(project.read_text()).get("tool", {}).get("pytest", {})
        if "ini_options" not in pytest_table:
            return
    except (OSError, ValueError):
        return
    args = list(config.invocation_params.args)
    culprits = [f"{flag} {value}" for flag, value in itertools.pairwise(args)
                if flag.startswith("--") and "=" not in flag and not value.startswith("-")
                and Path(value).exists()
                and not Path(value).resolve().is_relative_to(cwd.resolve())]
    raise pytest.UsageError(
        f"specgate: pytest did not load {project} (rootdir became {config.rootpath}), so the "
        "markers, xfail_strict and the fixtures folder would be wrong. "
        + (f"pytest took the path in {', '.join(repr(c) for c in culprits)} for a test path when "
           "looking for its config. " if culprits else "")
        + "Write such options with '=' (--specgate-run-dir=/tmp/x), or add -c pyproject.toml.")


def session_budget_s(config: pytest.Config) -> float | None:
    """--specgate-session-budget in seconds, or None (an environment value arrives as a string)."""
    budget = config.getoption("specgate_session_budget")
    if budget is None:
        return None
    return budget if isinstance(budget, float) else parse_duration(str(budget))


def configure_session(config: pytest.Config) -> None:
    """Check the project config loaded, then build the session and stash it."""
    check_project_config_loaded(config)
    root = Path(config.rootpath)
    update = "regen" if config.getoption("specgate_regen_baselines") else (
        "update" if config.getoption("specgate_update_baselines") else "off")
    rig_name = config.getoption("specgate_rig")
    workerinput = getattr(config, "workerinput", None)
    run_dir = config.getoption("specgate_run_dir") or (
        Path(workerinput["specgate_run_dir"]) if workerinput and "specgate_run_dir" in workerinput
        else default_run_dir(root, rig_name_of(rig_name)))
    options = SessionOptions(
        rig_name=rig_name,
        fixtures_dir=resolve_fixtures_dir(config.getoption("specgate_fixtures"), root),
        baselines_path=config.getoption("specgate_baselines") or root / "baselines.json",
        baselines_given=config.getoption("specgate_baselines") is not None,
        run_dir=run_dir, worker_id=workerinput["workerid"] if workerinput else None,
        worker_count=int(workerinput["workercount"]) if workerinput else 1,
        dist=workerinput.get("specgate_dist") if workerinput else None,
        gpus=tuple(config.getoption("specgate_gpus") or ()) or None,
        repo_root=root, update=update,
        strict_fingerprint=config.getoption("specgate_strict_fingerprint"),
        attach_url=config.getoption("specgate_vllm_url"),
        attach_mode=config.getoption("specgate_vllm_mode"),
        api_key=config.getoption("specgate_vllm_api_key") or os.environ.get("SPECGATE_API_KEY"),
        record_dir=config.getoption("specgate_record_responses"), ab=ab_from_options(config),
        time_budget_s=session_budget_s(config),
        undecided_policy=config.getoption("specgate_undecided"),
        start_seed=config.getoption("specgate_start_seed"),
        first_side=config.getoption("specgate_first_side"),
        gating=config.getoption("specgate_gating"),
        arrangement=config.getoption("specgate_arrangement"),
        keep_servers=bool(config.getoption("specgate_keep_servers")),
    )
    if options.keep_servers and (workerinput or getattr(config.option, "numprocesses", None)):
        raise pytest.UsageError("--specgate-keep-servers runs in one process: under xdist a "
                                "worker starting its mode would stop a kept server another worker "
                                "is measuring with; drop -n")
    config.stash[SESSION_KEY] = SpecgateSession(options, progress=progress_writer(config))
