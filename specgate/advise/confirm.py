"""``pytest --specgate-rig RIG --specgate-advise-confirm=SCHEDULE.json``: the schedule `advise`
wrote, served (mode ``<mode>-schedule``) against no speculation (the backfire gate) and static k
(the A/B throughput gate) in duet windows at each concurrency and class. Losing to either anywhere
FAILS (exit 1); undecided follows the outcome policy. Runs no test."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specgate.advise.schedule import SCHEDULE_KEY
from specgate.advise.spans import simple_table
from specgate.config.rig import Mode, Rig, load_rig
from specgate.decide.gates import ab_throughput, check_backfire
from specgate.decide.outcome import pytest_action
from specgate.decide.settings import window_settings
from specgate.decide.verdict import GateResult
from specgate.errors import ConfigError, SpecgateError
from specgate.exit_codes import ExitCode
from specgate.files import atomic_write_json
from specgate.measure.protocol import ClassMeasurement, Duet, Measurer
from specgate.report.verdicts import worded

AGAINST_NONE, AGAINST_STATIC = "no speculation", "static k"


def read_schedule(path: Path, rig: Rig) -> tuple[Mode, Mode]:
    """The schedule's mode and the static-k mode; ConfigError (exit 4) naming file and key."""
    not_one = "not a schedule file `python -m specgate advise` wrote"
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(path, None, f"{not_one}: {exc}") from None
    if not isinstance(data, dict) or data.get("specgate_schedule") != 1:
        raise ConfigError(path, "specgate_schedule", not_one)
    if data.get("rig") != rig.name:
        raise ConfigError(path, "rig",
                          f"the schedule is of rig {data.get('rig')!r}, not {rig.name!r}")
    config, static = data.get("speculative_config"), data.get("static_config")
    if not isinstance(config, dict) or not isinstance(config.get(SCHEDULE_KEY), list):
        raise ConfigError(path, "speculative_config", f"no {SCHEDULE_KEY}: the schedule turns "
                          "speculation off everywhere: nothing to serve but no speculation")
    if not isinstance(static, dict) or not static.get("method"):
        raise ConfigError(path, "static_config", "no static config to compare it with")
    name = str(data.get("mode") or static["method"])
    return Mode(name=f"{name}-schedule", description="the schedule", speculative_config=config), \
        Mode(name=name, description="static k", speculative_config=static)


def confirm_rig(rig: Rig, schedule: Mode, static: Mode) -> Rig:
    """``rig`` with the two modes (each with the served mode's server arguments and environment)."""
    base = static.name if static.name in rig.mode_extra_args else next(
        (m.name for m in rig.modes if m.is_speculative), static.name)
    extra = {**rig.mode_extra_args, schedule.name: rig.mode_extra_args.get(base, ()),
             static.name: rig.mode_extra_args.get(base, ())}
    env = {**rig.mode_env, schedule.name: rig.mode_env.get(base, {}),
           static.name: rig.mode_env.get(base, {})}
    modes = (rig.mode(rig.reference_mode), static, schedule)
    return rig.model_copy(update={"modes": modes, "mode_extra_args": extra, "mode_env": env,
                                  "declared_backfire": ()})


def decide(rig: Rig, windows: Sequence[ClassMeasurement]) -> list[GateResult]:
    """Each window's gate: A/B throughput against static k, backfire against no speculation."""
    results = []
    for m in windows:
        settings = window_settings(rig, m.mode, m.prompt_class, m.concurrency)
        result = ab_throughput(settings, m) if m.ab else check_backfire(settings, m, m.partner)
        result.details["against"] = AGAINST_STATIC if m.ab else AGAINST_NONE
        results.append(worded(result))
    return results


def verdict(results: Sequence[GateResult], policy: dict[str, str]) -> tuple[int, list[str]]:
    """The exit code under the outcome rules and the lines of the windows that fail the run."""
    failed = [r for r in results if pytest_action(r.outcome, policy) == "failed"]
    lines = [f"FAILED against {r.details['against']} at concurrency {r.concurrency} on "
             f"{r.prompt_class}: {r.message}" for r in failed]
    return (ExitCode.GATE_FAILED if failed else ExitCode.OK), lines


def table(results: Sequence[GateResult], static: Mode) -> str:
    """One row per concurrency and class: the schedule's ratio to each, interval and outcome."""
    cells: dict[tuple[int, str], dict[str, str]] = {}
    for r in results:
        d = r.details
        low, high = d.get("ci_low"), d.get("ci_high")
        interval = f" ({low:.3f}-{high:.3f})" if low and high else ""
        said = d.get("verdict") or r.outcome.value
        text = f"{d['ratio']:.3f}{interval} {said}" if d.get("ratio") else said
        text += f", {r.outcome.value}" if r.outcome.value != said else ""
        cells.setdefault((r.concurrency, r.prompt_class), {})[d["against"]] = text
    k = (static.speculative_config or {}).get("num_speculative_tokens")
    rows = [[f"c{level}", cls, row.get(AGAINST_NONE, "-"), row.get(AGAINST_STATIC, "-")]
            for (level, cls), row in sorted(cells.items())]
    headers = ["concurrency", "class", "schedule / no speculation", f"schedule / static k={k}"]
    return simple_table(rows, headers)


def measure(rig: Rig, schedule: Mode, static: Mode, run_dir: Path, progress: Callable[[str], None]
            ) -> list[ClassMeasurement]:
    """The schedule's server up throughout; no speculation beside it for one duet window per
    concurrency and class, then static k for one A/B window each (two servers live at a time)."""
    from specgate.serve.server import VLLMServer, spec_for_mode

    measurer = Measurer(rig, progress=progress)
    levels, classes = rig.protocol.concurrency, rig.prompt_classes
    windows = []

    def server(mode: Mode) -> VLLMServer:
        return VLLMServer(spec_for_mode(rig, mode, log_dir=run_dir), progress=progress)

    with server(schedule) as scheduled:
        for partner_mode, ab in ((rig.mode(rig.reference_mode), False), (static, True)):
            with server(partner_mode) as partner:
                duet = Duet(scheduled, partner, schedule, partner_mode, ab)
                windows += [measurer.measure_duet(duet, cls, level)
                            for level in levels for cls in classes]
    return windows


def confirm_command(path: Path, *, rig_name: str, fixtures_dir: Path, run_dir: Path,
                    policy: dict[str, str] | None = None) -> int:
    """Measure, decide, print the table and the verdict, write ``<run_dir>/confirm.json``; exit 1
    when the schedule lost anywhere, 4 for a bad input, 6 when the job broke."""
    def progress(line: str) -> None:
        print(f"[specgate] {line}", flush=True)

    try:
        rig = load_rig(rig_name, fixtures_dir)
        schedule, static = read_schedule(path, rig)
        rig = confirm_rig(rig, schedule, static)
    except SpecgateError as exc:
        print(f"specgate: {exc}", file=sys.stderr)
        return ExitCode.USAGE_ERROR
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    progress(f"confirming {path}: {schedule.speculative_config} against static k and none")
    try:
        windows = measure(rig, schedule, static, run_dir, progress)
    except SpecgateError as exc:
        print(f"specgate: the job broke: {exc}", file=sys.stderr)
        return ExitCode.JOB_BROKEN
    results = decide(rig, windows)
    code, failed = verdict(results, {**rig.gates.outcome_policy, **(policy or {})})
    report: dict[str, Any] = {
        "schedule": str(path), "rig": rig.name, "speculative_config": schedule.speculative_config,
        "static_config": static.speculative_config, "wall_s": time.monotonic() - started,
        "results": [r.to_dict() for r in results], "measurements": [m.to_dict() for m in windows]}
    atomic_write_json(run_dir / "confirm.json", report)
    print(table(results, static))
    print("\n".join(failed) or "the schedule lost to neither static k nor no speculation anywhere")
    print(f"report: {run_dir / 'confirm.json'}")
    return code
