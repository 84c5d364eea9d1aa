"""What other distributions plug into specgate: entry-point groups (no plugin imported by name).
``specgate.server_env``: variable-name prefixes a plugin reads inside a vLLM server (they go into a
kept server's fingerprint); ``specgate.model_prepared``: a callable ``(model_dir: Path) -> None``
called after the cpu tier's model is prepared. Registered in the plugin's ``pyproject.toml``::

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
        except Exception as exc:  # a broken plugin is named
            raise SpecgateError(f"entry point {entry.name} = {entry.value} of group {group}: "
                                f"cannot load it ({type(exc).__name__}: {exc})") from exc
    return found


@functools.cache
def server_env_prefixes() -> tuple[str, ...]:
    """The variable-name prefixes every installed ``specgate.server_env`` plugin declares."""
    prefixes: list[str] = []
    for name, value in _loaded(SERVER_ENV):
        if isinstance(value, str) or not all(isinstance(p, str) and p for p in value):
            raise SpecgateError(f"entry point {name} of group {SERVER_ENV}: expected a sequence of "
                                f"variable-name prefixes, got {value!r}")
        prefixes += value
    return tuple(sorted(set(prefixes)))


def model_prepared_hooks() -> list[tuple[str, Callable[[Path], None]]]:
    """Every installed ``specgate.model_prepared`` hook, by entry-point name."""
    hooks = _loaded(MODEL_PREPARED)
    for name, value in hooks:
        if not callable(value):
            raise SpecgateError(f"entry point {name} of group {MODEL_PREPARED}: expected a "
                                f"callable, got {value!r}")
    return hooks  # type: ignore[return-value]


def run_model_prepared(model_dir: Path) -> None:
    """Call every ``specgate.model_prepared`` hook on the prepared model's folder."""
    for _, hook in model_prepared_hooks():
        hook(model_dir)
