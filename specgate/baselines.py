"""``baselines.json``: the stored reference every gate compares with.

Layout (schema version 1): rig -> mode -> prompt class -> concurrency level -> entry. An entry
keeps the per-request decode tok/s samples (keyed, so a new run can be paired request by
request), their robust summary, the acceptance figures and the fingerprint of the setup it was
measured on. The file is validated with pydantic on load (errors name the file and the key) and
is only ever written by an explicit update, merged and replaced atomically (temp file + rename).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from specgate.errors import ConfigError

SCHEMA_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Fingerprint(_Model):
    """What the numbers were measured on; a different one makes a comparison suspect."""

    accelerator: str = "unknown"  # GPU model, or the CPU's model name on the cpu tier
    accelerator_count: int = 0
    driver: str | None = None
    vllm_version: str | None = None
    model: str | None = None
    speculative_config: dict[str, Any] | None = None
    # Servers measuring at once on this host (xdist workers): a tiny model is CPU-bound, so on the
    # GPU lab two servers side by side cut each other's single-stream tok/s by up to 40 %.
    concurrent_servers: int = Field(default=1, ge=1)
    date: str | None = None
    commit: str | None = None
    note: str | None = None

    def differences(self, other: Fingerprint) -> list[str]:
        """Fields that matter for speed and differ; date, commit and note never count."""
        keys = ("accelerator", "accelerator_count", "driver", "vllm_version", "model", "speculative_config",
                "concurrent_servers")
        return [f"{k}: stored {getattr(self, k)!r}, now {getattr(other, k)!r}"
                for k in keys if getattr(self, k) != getattr(other, k)]


class AcceptanceEntry(_Model):
    mean_acceptance_length: float = Field(ge=1)
    acceptance_rate: float = Field(ge=0, le=1)
    per_position_rates: list[float] = []


class BaselineEntry(_Model):
    decode_tokens_per_s: list[float] = Field(min_length=1)  # one sample per request
    sample_keys: list[str] | None = None  # "prompt-id#repeat", aligned with the samples
    median: float = Field(gt=0)
    mad: float = Field(ge=0)
    n: int = Field(ge=1)
    acceptance: AcceptanceEntry | None = None
    fingerprint: Fingerprint = Fingerprint()
    source: str | None = None  # where the figures came from when not measured by specgate

    @model_validator(mode="after")
    def _consistent(self) -> BaselineEntry:
        if self.n != len(self.decode_tokens_per_s):
            raise ValueError(f"n={self.n} but {len(self.decode_tokens_per_s)} samples")
        if self.sample_keys is not None and len(self.sample_keys) != self.n:
            raise ValueError("sample_keys must have one key per sample")
        return self


class BaselineFile(_Model):
    schema_version: int
    # rig -> mode -> prompt class -> concurrency (as a string) -> entry
    rigs: dict[str, dict[str, dict[str, dict[str, BaselineEntry]]]] = {}

    @model_validator(mode="after")
    def _known_version(self) -> BaselineFile:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(f"schema_version {self.schema_version} is not supported (expected {SCHEMA_VERSION})")
        return self


def _key_of(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


def load_baselines(path: Path) -> BaselineFile:
    """Read and validate; a missing file is an empty store (the first update creates it)."""
    if not path.exists():
        return BaselineFile(schema_version=SCHEMA_VERSION)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(path, None, f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
                          "fix it or restore it from version control") from None
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read: {exc}") from None
    try:
        return BaselineFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else ""
        raise ConfigError(path, _key_of(first["loc"]) or None, f"{first['msg']}{more}") from None


def lookup(store: BaselineFile, rig: str, mode: str, prompt_class: str, concurrency: int) -> BaselineEntry | None:
    return store.rigs.get(rig, {}).get(mode, {}).get(prompt_class, {}).get(str(concurrency))


def atomic_write_json(path: Path, data: Any) -> None:
    """Write to a temp file in the same folder, fsync, then rename over the target: a reader (or a
    crash at any moment) sees the old file or the new one, never a partial one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=False)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, _mode_for(path))  # mkstemp makes 0600; keep the file's (or umask's) mode
        os.replace(tmp, path)
    except BaseException:
        with_suppressed_unlink(tmp)
        raise


def _mode_for(path: Path) -> int:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def with_suppressed_unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def merge_updates(path: Path, updates: dict[tuple[str, str, str, int], BaselineEntry]) -> BaselineFile:
    """Merge ``updates`` into the file as it is on disk now (re-read, so concurrent edits to other
    keys survive) and replace it atomically. Returns the new content."""
    store = load_baselines(path)
    for (rig, mode, prompt_class, concurrency), entry in updates.items():
        store.rigs.setdefault(rig, {}).setdefault(mode, {}).setdefault(prompt_class, {})[str(concurrency)] = entry
    atomic_write_json(path, store.model_dump(mode="json", exclude_none=True))
    return store
