"""What a specgate run's exit code says: pytest's own codes, and specgate's 6 for a job that broke
(a server that could not start, a window not measured): its verdicts are incomplete, so it outranks
a failed gate and CI can tell "retry or fix the runner" (6) from "the change is slower" (1).
docs/reports-and-ci.md has the table."""

from __future__ import annotations

import enum
from typing import Any


class ExitCode(enum.IntEnum):
    OK = 0  # every gate passed (or decided nothing under the skip policy)
    GATE_FAILED = 1  # pytest's TESTS_FAILED: a gate said no
    INTERRUPTED = 2  # pytest's: Ctrl-C, or errors while collecting the tests
    INTERNAL_ERROR = 3  # pytest's: a bug in specgate or another plugin
    USAGE_ERROR = 4  # pytest's: a bad option or input file, refused before any server starts
    NO_TESTS = 5  # pytest's NO_TESTS_COLLECTED: nothing selected
    JOB_BROKEN = 6  # specgate's: a server could not start or died, a window could not be measured


def broken_job(report: dict[str, Any]) -> list[str]:
    """What broke the job, one line each: the servers that could not start and the windows that
    could not be measured; empty for a job that measured everything it ran."""
    lines = [f"server {f['server']} could not start: {_first_line(f['error'])}"
             for f in report.get("server_failures", [])]
    lines += [f"window {f['mode']} / {f['prompt_class']} / c{f['concurrency']} not measured: "
              f"{_first_line(f['error'])}" for f in report.get("failures", [])]
    return lines


def _first_line(text: str) -> str:
    return str(text).strip().splitlines()[0] if str(text).strip() else "(no message)"


def session_exit_code(pytest_status: int, report: dict[str, Any] | None) -> int:
    """The run's exit code: pytest's, except that a broken job (:func:`broken_job`) turns a run
    that pytest would end with 0 or 1 into JOB_BROKEN. An interrupt, an internal or a usage error
    keeps pytest's code."""
    broke = pytest_status in (ExitCode.OK, ExitCode.GATE_FAILED)
    if report is not None and broke and broken_job(report):
        return ExitCode.JOB_BROKEN
    return pytest_status
