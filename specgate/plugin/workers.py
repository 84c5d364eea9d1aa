"""xdist: the windows workers share through the run directory. A worker that needs the reference
window another worker measures waits for its file (bounded, with progress) or for its failure."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specgate.files import atomic_write_json

WindowKey = tuple[str, str, int]  # mode, prompt class, concurrency


def shared_path(run_dir: Path, key: WindowKey) -> Path:
    mode, prompt_class, concurrency = key
    return run_dir / "measurements" / f"{mode}__{prompt_class}__c{concurrency}.json"


def share(run_dir: Path, key: WindowKey, data: dict[str, Any]) -> None:
    """A window (its report.json entry) or ``{"error": ...}`` for the other workers."""
    path = shared_path(run_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, data)


def wait_for_window(run_dir: Path, key: WindowKey, budget_s: float,
                    progress: Callable[[str], None]) -> dict[str, Any] | None:
    """The shared window ``key`` once another worker has written it, or None after ``budget_s``."""
    path = shared_path(run_dir, key)
    started = last = time.monotonic()
    while not path.exists():
        now = time.monotonic()
        if now - started >= budget_s:
            return None
        if now - last >= 30:
            progress(f"waiting for another worker to measure {key[0]} on {key[1]} "
                     f"({now - started:.0f}s)")
            last = now
        time.sleep(min(1.0, max(0.01, budget_s - (now - started))))
    return json.loads(path.read_text())
