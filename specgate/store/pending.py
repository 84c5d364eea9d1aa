"""The stored figures a run queues (``--specgate-update-baselines``,
``--specgate-regen-baselines``), written into baselines.json at once at the run's end (an
interrupted run leaves it as it was); under xdist each worker sends its queue to the controller."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specgate.lazy import baselines

if TYPE_CHECKING:
    from specgate.store.baselines import BaselineEntry


class PendingUpdates(dict):
    """The queued entries: (rig, mode, prompt class, concurrency) -> the entry to store."""

    def queue(self, rig: str, window: Any, entry: BaselineEntry) -> None:
        self[(rig, window.mode, window.prompt_class, window.concurrency)] = entry

    def to_json(self) -> list[list[Any]]:
        """What a worker sends the controller."""
        return [[list(key), entry.model_dump(mode="json")] for key, entry in self.items()]

    def absorb(self, sent: list[list[Any]]) -> None:
        """The controller's side of :meth:`to_json`."""
        for key, entry in sent:
            self[tuple(key)] = baselines.BaselineEntry.model_validate(entry)

    def flush(self, path: Path, *, new_history: bool,
              progress: Callable[[str], None]) -> Path | None:
        """Write every queued entry into ``path`` at once (baselines.merge_updates), say where each
        went, and empty the queue; None when nothing was queued."""
        if not self:
            return None
        _, said = baselines.merge_updates(path, dict(self), new_history=new_history)
        for (_, mode, prompt_class, concurrency), what in sorted(said.items()):
            progress(f"stored {mode} / {prompt_class} / c{concurrency} as {what}")
        self.clear()
        return path
