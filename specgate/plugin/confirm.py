"""``--specgate-advise-confirm=SCHEDULE.json``: serve an advised schedule against static k and no
speculation (specgate.advise.confirm); runs no test."""

from __future__ import annotations

from pathlib import Path

import pytest

from specgate.config.locations import resolve_fixtures_dir, rig_name_of
from specgate.plugin.resolve import default_run_dir


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("specgate").addoption(
        "--specgate-advise-confirm", type=Path, default=None, metavar="SCHEDULE_JSON",
        help="serve the schedule `python -m specgate advise` wrote (schedule-<mode>.json) against "
             "static k and no speculation, in paired windows at each of the rig's concurrencies; "
             "a schedule that loses to either anywhere FAILS (exit 1); runs no test")


def pytest_cmdline_main(config: pytest.Config) -> int | None:
    path = config.getoption("specgate_advise_confirm")
    if path is None:
        return None
    from specgate.advise.confirm import confirm_command

    rig = config.getoption("specgate_rig")
    run_dir = config.getoption("specgate_run_dir") or default_run_dir(
        Path(config.rootpath), f"{rig_name_of(rig)}-confirm")
    fixtures = resolve_fixtures_dir(config.getoption("specgate_fixtures"), config.rootpath)
    return confirm_command(path, rig_name=rig, run_dir=Path(run_dir), fixtures_dir=fixtures,
                           policy=config.getoption("specgate_undecided"))
