"""The one place specgate defers imports of its own modules: the plugin loads into every pytest
run, so its light path (tests/test_package_imports.py) imports these modules, which load heavy
packages, as ``from specgate.lazy import rig``; each loads at its first attribute access. A name
resolves on the real module at every access, so a monkeypatch of the module holds through it.
Every other import of a specgate module is a plain module-level one.
"""

from __future__ import annotations

import importlib
from typing import Any


class Deferred:
    """A specgate module imported at its first attribute access (importlib.import_module: cached
    in sys.modules, thread-safe, and never half-loaded there, unlike LazyLoader)."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> Any:
        # An underscore name is a probe (pytest's fixture scan, copy, pickle), never a use: it
        # imports nothing.
        if attr.startswith("_"):
            raise AttributeError(f"{attr} (a deferred module resolves public names only)")
        return getattr(importlib.import_module(self._name), attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        raise AttributeError(
            f"{self!r} is read-only: patch or set {self._name}.{attr} on the module itself")

    def __repr__(self) -> str:
        return f"<deferred module {self._name}>"


baselines = Deferred("specgate.store.baselines")
fingerprint = Deferred("specgate.store.fingerprint")
follow_up = Deferred("specgate.decide.follow_up")
gatekeeper = Deferred("specgate.plugin.gatekeeper")
gates = Deferred("specgate.decide.gates")
histories = Deferred("specgate.plan.histories")
history = Deferred("specgate.decide.history")
protocol = Deferred("specgate.measure.protocol")
record = Deferred("specgate.measure.record")
registry = Deferred("specgate.serve.registry")
rig = Deferred("specgate.config.rig")
server = Deferred("specgate.serve.server")
settings = Deferred("specgate.decide.settings")
sleep = Deferred("specgate.serve.sleep")
terminal = Deferred("specgate.report.terminal")
verdicts = Deferred("specgate.report.verdicts")
