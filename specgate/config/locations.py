"""Where a session's user-edited files are: the fixtures folder and a rig file. Import-light (the
plugin's options parse with it)."""

from __future__ import annotations

import os
from pathlib import Path

from specgate.errors import ConfigError, OutputError

FIXTURES_FILES = ("modes.toml", "prompts.toml")


def is_rig_path(value: str) -> bool:
    """A ``--specgate-rig`` value naming a file rather than a rig of the fixtures folder."""
    return "/" in value or os.sep in value or value.endswith(".toml")


def rig_name_of(value: str) -> str:
    """The rig's name: the file's stem for a path, else the value itself."""
    return Path(value).stem if is_rig_path(value) else value


def resolve_fixtures_dir(option: Path | None, rootdir: Path) -> Path:
    """``--specgate-fixtures``, else ``$SPECGATE_FIXTURES``, else ``<rootdir>/fixtures``; checked
    only by a perf session (:func:`check_fixtures_dir`)."""
    if option is not None:
        return Path(option)
    env = os.environ.get("SPECGATE_FIXTURES")
    return Path(env) if env else Path(rootdir) / "fixtures"


def check_fixtures_dir(fixtures_dir: Path) -> None:
    """Raise a ConfigError naming the folder when it lacks the mode library or prompt classes."""
    missing = [name for name in FIXTURES_FILES if not (fixtures_dir / name).is_file()]
    if missing:
        raise ConfigError(fixtures_dir / missing[0], None, f"file not found: {fixtures_dir} is not "
                          f"a specgate fixtures folder (no {' and no '.join(missing)}). Pass "
                          "--specgate-fixtures DIR (pytest), set $SPECGATE_FIXTURES, or run "
                          "from a folder whose fixtures/ holds modes.toml, prompts.toml and rigs/")


def rig_file(value: str, fixtures_dir: Path) -> Path:
    """The rig file a ``--specgate-rig`` value names: a path, else ``<fixtures>/rigs/NAME.toml``."""
    if is_rig_path(value):
        return Path(value).expanduser()
    return fixtures_dir / "rigs" / f"{value}.toml"


def writable_folder(folder: Path, option: str = "--out") -> Path:
    """``folder``, made if missing; an OutputError naming it when it cannot be."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(folder, exc, option) from None
    return folder
