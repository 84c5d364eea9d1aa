"""report.json and the files rendered from it: one process's report, built from the session's
state; the xdist controller's, merged with its workers'; report.json written atomically with its
break-even rows; summary.md, report.html and the plots beside it, and the GitHub job summary."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specgate.decide.breakeven import from_report
from specgate.files import atomic_write_json
from specgate.lazy import terminal

REPORT_NAME = "report.json"


def own_report(state: Any, *, complete: bool) -> dict[str, Any]:
    """This process's report of ``state`` (the SpecgateSession: what it measured and decided)."""
    run, options = state.settings, state.options
    rig = run.rig
    selected = dict.fromkeys((mode, c, n) for _, mode, c, n in state.selected_tests or [])
    return {
        "specgate_report": 1,
        "complete": complete,
        "written_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "rig": {"name": rig.name, "tier": rig.tier, "model": rig.model,
                "reference_mode": rig.reference_mode,
                "protocol": rig.protocol.model_dump(mode="json"),
                "modes": {m.name: m.speculative_config for m in rig.modes}},
        "attached": options.attach_url is not None,
        "fingerprints": {k: v.model_dump(mode="json") for k, v in state.fingerprints.items()},
        "servers": state.servers,
        "measurements": [m.to_dict() for m in state.measurements.values()],
        "worker": options.worker_id,
        "deferred": [list(k) for k in dict.fromkeys(state.deferred)],
        "deferred_tests": state.deferred_tests,
        "failures": [{"mode": k[0], "prompt_class": k[1], "concurrency": k[2], "error": str(e)}
                     for k, e in state.failures.items()],
        "server_failures": list(state.server_failures),
        "gates": [r.to_dict() for r in state.results],
        "undecided": list(state.undecided),
        "outcome_policy": dict(run.outcome_policy),
        **({"start_order": {"seed": state.start_seed, "first": dict(state.start_order)}}
           if state.start_order else {}),
        **({"family": run.family.to_dict()} if run.family is not None else {}),
        **({"red_runs": run.red_runs.to_dict()} if getattr(run, "red_runs",
                                                           None) is not None else {}),
        **({"gating": dict(run.gating)} if run.gating else {}),
        # every window a gate of the run decides on
        "settings": [run.window(*key).to_dict() for key in selected],
    }


def merged(own: dict[str, Any], worker_reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The xdist controller's report: its own with every worker's windows, gates and failures."""
    if not worker_reports:
        return own
    reports = [own, *worker_reports]
    seen = set()
    measurements = []
    for report in reports:
        for m in report["measurements"]:
            key = (m["mode"], m["prompt_class"], m["concurrency"])
            if key not in seen:  # a worker may hold a copy of another's reference window
                seen.add(key)
                measurements.append(m)
        own["fingerprints"].update(report["fingerprints"])
        own["servers"].update(report["servers"])
    own["measurements"] = measurements
    own["gates"] = [g for r in reports for g in r["gates"]]
    own["undecided"] = [u for r in reports for u in r.get("undecided", [])]
    failures = {(f["mode"], f["prompt_class"], f["concurrency"]): f for r in reports
                for f in r["failures"]}
    own["failures"] = [f for k, f in failures.items() if k not in seen]
    own["server_failures"] = [f for r in reports for f in r.get("server_failures", [])]
    windows = {(w["mode"], w["prompt_class"], w["concurrency"]): w for r in [*worker_reports, own]
               for w in r.get("settings", [])}
    own["settings"] = list(windows.values())
    if "family" not in own:  # the controller collects nothing: a worker counted the family
        own.update({k: r[k] for r in worker_reports for k in ("family", "gating",
                                                              "red_runs") if k in r})
    orders = [r["start_order"] for r in reports if r.get("start_order")]
    if orders:  # each worker draws its own seed unless --specgate-start-seed gives one
        seeds = sorted({o["seed"] for o in orders})
        own["start_order"] = {"seed": seeds[0] if len(seeds) == 1 else seeds,
                              "first": {k: v for o in orders for k, v in o["first"].items()}}
    return own


def write_report(data: dict[str, Any], run_dir: Path) -> Path:
    """report.json in ``run_dir``, with the break-even rows derived for its readers."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / REPORT_NAME
    atomic_write_json(path, {**data, "breakeven": from_report(data)})
    return path


def write_renderings(data: dict[str, Any], run_dir: Path,
                     environ: Mapping[str, str]) -> dict[str, Path]:
    """summary.md, report.html and the plots into ``run_dir``, and summary.md appended to the GitHub
    job summary (``GITHUB_STEP_SUMMARY``) where there is one."""
    written = terminal.render_all(data, run_dir)
    summary_env = environ.get("GITHUB_STEP_SUMMARY")
    if summary_env:
        with contextlib.suppress(OSError), open(summary_env, "a") as handle:
            handle.write(step_summary(written["summary"].read_text(), environ))
    return written


def step_summary(markdown: str, environ: Mapping[str, str]) -> str:
    """What the GitHub job summary gets: summary.md, whose link to report.html resolves beside
    report.json only, and where GitHub names the run, the run's page, whose artifacts hold it."""
    server, repo, run = (environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY",
                                                  "GITHUB_RUN_ID"))
    if not (server and repo and run):
        return markdown
    return (f"{markdown}\nThe page (report.html, with the plots and the run's facts) is in this "
            f"run's artifacts: {server}/{repo}/actions/runs/{run}#artifacts\n")
