"""What other distributions plug into specgate: entry-point groups, as pytest's and vLLM's plugins do.
specgate reads the groups and imports no plugin by name.

- ``specgate.server_env``: each entry point loads to a sequence of environment-variable name
  prefixes that the plugin's code reads inside a vLLM server (e.g. a vLLM general plugin's
  settings). An inherited variable of such a name changes what a server runs, so it goes into a
  kept server's fingerprint (``specgate.serve.registry``).
- ``specgate.model_prepared``: each entry point loads to a callable ``(model_dir: Path) -> None``,
  called after ``specgate prepare-model`` (and ``specgate run`` on a cpu rig) prepared the cpu
  tier's model: what a plugin writes beside it, such as a draft head a rig names.

A plugin registers them in its own ``pyproject.toml``::

    [project.entry-points."specgate.server_env"]
    my_plugin = "my_plugin.settings:ENV_PREFIXES"
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable
from pathlib import Path

from specgate.errors import SpecgateError

SERVER_ENV = "specgate.server_env"
MODEL_PREPARED = "specgate.model_prepared"


def _loaded(group: str) -> list[tuple[str, object]]:
    found = []
    for entry in sorted(importlib.metadata.entry_points(group=group), key=lambda e: e.name):
        try:
            found.append((f"{entry.name} ({entry.value})", entry.load()))
        except Exception as exc:  # a broken plugin is named, not a traceback from deep inside specgate
            raise SpecgateError(f"entry point {entry.name} = {entry.value} of group {group}: cannot load it "
                                f"({type(exc).__name__}: {exc})") from exc
    return found


@functools.cache
def server_env_prefixes() -> tuple[str, ...]:
    """The variable-name prefixes every installed ``specgate.server_env`` plugin declares."""
    prefixes: list[str] = []
    for name, value in _loaded(SERVER_ENV):
        if isinstance(value, str) or not all(isinstance(p, str) and p for p in value):
            raise SpecgateError(f"entry point {name} of group {SERVER_ENV}: expected a sequence of variable-name "
                                f"prefixes, got {value!r}")
        prefixes += value
    return tuple(sorted(set(prefixes)))


def model_prepared_hooks() -> list[tuple[str, Callable[[Path], None]]]:
    """Every installed ``specgate.model_prepared`` hook, by entry-point name."""
    hooks = _loaded(MODEL_PREPARED)
    for name, value in hooks:
        if not callable(value):
            raise SpecgateError(f"entry point {name} of group {MODEL_PREPARED}: expected a callable, got {value!r}")
    return hooks  # type: ignore[return-value]


def run_model_prepared(model_dir: Path) -> None:
    """Call every ``specgate.model_prepared`` hook on the prepared model's folder."""
    for _, hook in model_prepared_hooks():
        hook(model_dir)
