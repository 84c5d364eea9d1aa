"""What the run prints and writes: progress lines, the end of the run (baseline updates, then
report.json and its renderings), the terminal summary, and ``--specgate-report-only``."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

from specgate.errors import SpecgateError
from specgate.exit_codes import ExitCode, broken_job
from specgate.lazy import terminal as report_mod
from specgate.plugin.session import SpecgateSession
from specgate.report import run_report
from specgate.report.safe_text import without_control_chars
from specgate.store.saved_report import read_saved_report


def progress_writer(config: pytest.Config):
    def emit(line: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        capman = config.pluginmanager.get_plugin("capturemanager")
        text = f"[specgate] {without_control_chars(line)}"
        if reporter is None:
            print(text, file=sys.stderr, flush=True)
            return
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            reporter.ensure_newline()
            if getattr(reporter, "_width_of_current_line", 0):
                reporter.write("\n")  # a test's result letter after an earlier line of ours
            reporter.write_line(text)
            reporter.flush()  # stdout to a file or CI log is block-buffered: show it now
    return emit


def has_perf_work(session: SpecgateSession) -> bool:
    # undecided: a session whose every gate was NOT RUN (its time budget) still reports them
    return bool(session.measurements or session.failures or session.servers
                or session.worker_reports or session.undecided or session.server_failures)


def rendered_dir(path: Path) -> Path:
    """Where --specgate-report-only renders without --specgate-run-dir: a folder named after the
    report, beside it (``ab/report.json.gz`` -> ``ab/report-rendered/``)."""
    path = Path(path)
    name = path.name.removesuffix(".gz").removesuffix(".json")
    return path.with_name(f"{name or path.name}-rendered")


def render_saved_report(path: Path, run_dir: Path | None = None) -> int:
    """--specgate-report-only: render a saved report (plain or gzip) into ``run_dir``, else
    :func:`rendered_dir`; exit 0, or 4 naming what the file lacks."""
    try:
        report = read_saved_report(path)
    except SpecgateError as exc:
        print(f"specgate: {exc}", file=sys.stderr)
        return int(pytest.ExitCode.USAGE_ERROR)
    print(report_mod.render_text(report))
    written = report_mod.render_all(report, run_dir or rendered_dir(path))
    for name, out in written.items():
        print(f"{name}: {out}")
    return int(pytest.ExitCode.OK)


def write_run_output(run_session: SpecgateSession, *, interrupted: bool) -> None:
    """The end of a run on the controller: queued baseline updates (none after an interrupt), then
    the report and its renderings."""
    if interrupted:
        if run_session.pending_updates:
            run_session.progress(
                f"{len(run_session.pending_updates)} window(s)' figures not stored: the run was "
                "interrupted, and a cut-short run never touches the stored figures. To keep the "
                "windows that finished: python -m specgate adopt-baselines "
                f"{run_session.report_path}")
        run_session.pending_updates.clear()
    else:
        written = run_session.flush_updates()
        if written:
            run_session.progress(f"stored figures written to {written}")
    data = run_session.report_data(complete=not interrupted)
    path = run_report.write_report(data, run_session.options.run_dir)
    run_report.write_renderings(data, run_session.options.run_dir, os.environ)
    run_session.progress(f"report: {path}")


def write_summary(terminalreporter, run_session: SpecgateSession, *, interrupted: bool) -> None:
    terminalreporter.section("specgate summary")
    report = run_session.report_data(complete=not interrupted)
    terminalreporter.write_line(report_mod.render_text(report))
    broken = broken_job(report)
    if broken and not interrupted:
        terminalreporter.write_line(f"JOB BROKEN (exit code {int(ExitCode.JOB_BROKEN)}: the run is "
                                    "incomplete, whatever its gates said; run it again once the "
                                    "cause is fixed):", red=True)
        for line in broken:
            terminalreporter.write_line(f"  {without_control_chars(line)}")
    terminalreporter.write_line(f"run directory: {run_session.options.run_dir}")
