"""The inputs checked before any server starts beyond the rig and baselines.json: a missing
--specgate-baselines file, and each A/B side's python (exists, is executable, imports vLLM)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from specgate.errors import ConfigError

if TYPE_CHECKING:
    from specgate.config.rig import Rig
    from specgate.plugin.resolve import SessionOptions

VLLM_IMPORT_TIMEOUT_S = 180.0  # `import vllm` takes seconds, up to a minute


def check_baselines_path(options: SessionOptions) -> None:
    """Refuse a --specgate-baselines file that does not exist (a typo would read as "not stored"); a
    run that stores needs its folder to exist."""
    path = options.baselines_path
    if path.exists() or not options.baselines_given:
        return
    if options.update == "off":
        raise ConfigError(path, None,
                          "no such baselines file (--specgate-baselines): name an existing one, "
                          "or store this run's figures there with --specgate-update-baselines or "
                          "--specgate-regen-baselines")
    if not path.parent.is_dir():
        raise ConfigError(path, None,
                          f"the folder {path.parent} does not exist, so this run's figures "
                          f"(--specgate-{options.update}-baselines) could not be stored there")


def check_side_pythons(options: SessionOptions, rig: Rig, progress: Callable[[str], None], *,
                       imports: bool) -> bool:
    """Each A/B side's python runs (and, with ``imports``, imports vLLM)."""
    if rig.ab is None or options.attach_url:
        return False
    sides = {name: side for name in ("reference",
                                     "candidate") if (side := getattr(rig.ab, name)).python}
    for name, side in sides.items():
        # specgate.serve.server.spec_for_mode swaps ${python} only
        if rig.argv_prefix[0] != sys.executable:
            raise ConfigError(rig.path, "server_command", f"the A/B {name} side's python "
                              f"({_option_of(options, name)}) replaces ${{python}} there, but it "
                              f"starts with "
                              f'{rig.argv_prefix[0]!r}: begin it with "${{python}}"')
        _check_executable(side.python, _refusal(options, rig, name, side.python))
    if not imports:
        return False
    for name, side in sides.items():
        progress(f"checking that the A/B {name} side's python imports vllm: {side.python}")
        _check_imports_vllm(side.python, {**os.environ, **rig.env, **side.env},
                            _refusal(options, rig, name, side.python))
    return True


def _option_of(options: SessionOptions, name: str) -> str:
    return f"--specgate-ab-{name}-python" if options.ab is not None else f"ab.{name}.python"


def _refusal(options: SessionOptions, rig: Rig, name: str,
             python: str) -> Callable[[str], ConfigError]:
    """The error for A/B side ``name``'s python, naming where it was given."""
    if options.ab is not None:
        return lambda message: ConfigError(python, None, f"the A/B {name} side's python "
                                           f"({_option_of(options, name)}) {message}")
    return lambda message: ConfigError(rig.path, _option_of(options, name), f"{python!r} {message}")


def _check_executable(python: str, refused: Callable[[str], ConfigError]) -> None:
    """``python`` names an executable file: a path, or a name on PATH."""
    found = python if os.sep in python else shutil.which(python)
    if found is None:
        raise refused("is not on PATH: give the path of the environment's python, e.g. "
                      "/venvs/vllm-next/bin/python")
    path = Path(found)
    if not path.exists():
        raise refused("does not exist: give the path of the environment's python, e.g. "
                      "/venvs/vllm-next/bin/python")
    if path.is_dir():
        raise refused("is a folder: give the python inside it, e.g. its bin/python")
    if not os.access(path, os.X_OK):
        raise refused("is not executable")


def _check_imports_vllm(python: str, env: dict[str, str],
                        refused: Callable[[str], ConfigError]) -> None:
    """``python -c "import vllm"`` succeeds within VLLM_IMPORT_TIMEOUT_S."""
    try:
        done = subprocess.run([python, "-c", "import vllm"], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=VLLM_IMPORT_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        raise refused(f"did not finish `import vllm` within {VLLM_IMPORT_TIMEOUT_S:.0f} s"
                      ) from None
    except OSError as exc:
        raise refused(f"could not run: {exc}") from None
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise refused(f"cannot import vllm (exit code {done.returncode}: "
                      f"{lines[-1] if lines else 'no output'}): install the side's vLLM build in "
                      "that environment")
