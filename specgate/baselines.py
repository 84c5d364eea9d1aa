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
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, ValidationError, model_validator

from specgate.errors import ConfigError

SCHEMA_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PromptDigest(_Model):
    """One prompt class's texts: a hash of all of them and one per prompt id, so a difference
    names the prompt that changed."""

    sha256: str
    prompts: dict[str, str] = {}  # prompt id -> first 12 hex digits of its text's sha256


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
    # What the window measured and how (None: not recorded, as in entries older than these keys).
    # prompts: prompt class -> digest of its texts; a per-mode fingerprint holds every class of the
    # rig, a stored entry only its own (see for_window).
    prompts: dict[str, PromptDigest] | None = None
    protocol: dict[str, Any] | None = None  # api, max_tokens, ignore_eos, temperature, warm-up, ...
    server_args: list[str] | None = None  # the rig's and the mode's extra `vllm serve` arguments
    env: dict[str, str] | None = None  # the rig's env plus inherited VLLM_*/OMP_* knobs
    torch_version: str | None = None
    cuda_version: str | None = None
    cpu_model: str | None = None
    # which machine, not only its kind (specgate.fingerprint.machine_id): a level stored on one host
    # of a GPU model is not another host's (two leases of one machine kind read 3.7 % apart)
    machine: str | None = None
    date: str | None = None
    commit: str | None = None
    note: str | None = None

    def differences(self, other: Fingerprint) -> list[str]:
        """Fields that matter for speed and differ; date, commit and note never count. A field
        either side did not record (None) is unknown, not different."""
        return [text for _, text in _field_differences(self, other)]

    def for_window(self, prompt_class: str, concurrency: int) -> Fingerprint:
        """This fingerprint narrowed to one measurement window: its class's prompts, its level."""
        update: dict[str, Any] = {}
        if self.prompts is not None:
            update["prompts"] = {k: v for k, v in self.prompts.items() if k == prompt_class}
        if self.protocol is not None:
            update["protocol"] = {**self.protocol, "concurrency": concurrency}
        return self.model_copy(update=update)


# What a difference means for a comparison with a stored figure (see comparability):
SAME = "same"
OTHER_SETUP = "other_setup"  # software or configuration: vLLM, torch, CUDA, driver, args, env, model
OTHER_MACHINE = "other_machine"  # another CPU model, GPU model or GPU count, or another host
OTHER_MEASUREMENT = "other_measurement"  # other prompt texts or another protocol: not the same quantity
_RANK = {SAME: 0, OTHER_SETUP: 1, OTHER_MACHINE: 2, OTHER_MEASUREMENT: 3}
# Fields that existed before the others: compared even where one side is None (as before).
_LEGACY_KEYS = ("accelerator", "accelerator_count", "driver", "vllm_version", "model", "speculative_config",
                "concurrent_servers")
_KIND_OF = {"accelerator": OTHER_MACHINE, "accelerator_count": OTHER_MACHINE, "cpu_model": OTHER_MACHINE,
            "machine": OTHER_MACHINE, "prompts": OTHER_MEASUREMENT, "protocol": OTHER_MEASUREMENT}
_NEW_KEYS = ("cpu_model", "machine", "torch_version", "cuda_version", "server_args", "env")


def _prompt_differences(stored: dict[str, PromptDigest], now: dict[str, PromptDigest]) -> list[str]:
    out = []
    for name in sorted(stored.keys() & now.keys()):
        a, b = stored[name], now[name]
        if a.sha256 == b.sha256:
            continue
        changed = [i for i in a.prompts if i in b.prompts and a.prompts[i] != b.prompts[i]]
        parts = ([f"text of {', '.join(changed)} changed"] if changed else []) + (
            [f"added {', '.join(i for i in b.prompts if i not in a.prompts)}"]
            if b.prompts.keys() - a.prompts.keys() else []) + (
            [f"removed {', '.join(i for i in a.prompts if i not in b.prompts)}"]
            if a.prompts.keys() - b.prompts.keys() else [])
        out.append(f"prompts of class {name}: {'; '.join(parts) or 'order changed'} "
                   f"(stored {a.sha256[:12]}, now {b.sha256[:12]})")
    return out


def _field_differences(stored: Fingerprint, now: Fingerprint) -> list[tuple[str, str]]:
    """(kind, text) for every field that differs, in a stable order."""
    out: list[tuple[str, str]] = []
    for key in _LEGACY_KEYS:
        a, b = getattr(stored, key), getattr(now, key)
        if a != b:
            out.append((_KIND_OF.get(key, OTHER_SETUP), f"{key}: stored {a!r}, now {b!r}"))
    for key in _NEW_KEYS:
        a, b = getattr(stored, key), getattr(now, key)
        if a is not None and b is not None and a != b:
            out.append((_KIND_OF.get(key, OTHER_SETUP), f"{key}: stored {a!r}, now {b!r}"))
    if stored.protocol is not None and now.protocol is not None:
        for key in sorted(stored.protocol.keys() & now.protocol.keys()):
            if stored.protocol[key] != now.protocol[key]:
                out.append((OTHER_MEASUREMENT, f"protocol {key}: stored {stored.protocol[key]!r}, "
                                               f"now {now.protocol[key]!r}"))
    if stored.prompts is not None and now.prompts is not None:
        out += [(OTHER_MEASUREMENT, text) for text in _prompt_differences(stored.prompts, now.prompts)]
    return out


@dataclass(frozen=True)
class Comparability:
    """Whether a stored figure may be compared with this run's, and what differs.

    ``kind``: SAME; OTHER_SETUP (software or configuration); OTHER_MACHINE; OTHER_MEASUREMENT
    (other prompts or protocol: the stored figure measured something else). The worst one wins;
    ``differences`` lists them all, each naming the field and both values."""

    kind: str
    differences: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "differences": list(self.differences)}

    def describe(self) -> str:
        """"was measured ...: <differences>" ("" when SAME)."""
        what = {OTHER_MEASUREMENT: "was measured on other prompts or with another protocol, so it is not the "
                                   "same quantity and is not compared",
                OTHER_MACHINE: "was measured on another machine",
                OTHER_SETUP: "was measured with another software or server setup"}.get(self.kind)
        return f"{what}: {'; '.join(self.differences)}" if what else ""


def comparability(stored: Fingerprint, now: Fingerprint | None) -> Comparability:
    """The one place that decides how a stored fingerprint relates to this run's (narrowed to
    the same window). A stored entry written before a field existed leaves that field unknown,
    and an unknown field is never a difference; so is a stored fingerprint with no accelerator
    (hand-written entries) or no fingerprint for this run (nothing to compare)."""
    if now is None or stored.accelerator == "unknown":
        return Comparability(SAME)
    found = _field_differences(stored, now)
    kind = max((k for k, _ in found), key=_RANK.__getitem__, default=SAME)
    return Comparability(kind, tuple(text for _, text in found))


class AcceptanceEntry(_Model):
    mean_acceptance_length: float = Field(ge=1)
    acceptance_rate: float = Field(ge=0, le=1)
    per_position_rates: list[float] = []
    # The counts the rates came from (None in entries written before they were kept): how much
    # evidence the stored figure rests on.
    drafts: float | None = Field(default=None, ge=0)
    draft_tokens: float | None = Field(default=None, ge=0)
    accepted_per_position: list[float] | None = None


LEVEL_HISTORY = 30


class RatioEntry(_Model):
    reference_mode: str
    ratio: float = Field(gt=0)
    ci_low: float | None = Field(default=None, gt=0)
    ci_high: float | None = Field(default=None, gt=0)
    n: int = Field(ge=1)


class BaselineEntry(_Model):
    decode_tokens_per_s: list[float] = Field(min_length=1)  # one sample per request
    sample_keys: list[str] | None = None  # "prompt-id#repeat", aligned with the samples
    median: float = Field(gt=0)
    mad: float = Field(ge=0)
    n: int = Field(ge=1)
    acceptance: AcceptanceEntry | None = None
    fingerprint: Fingerprint = Fingerprint()
    source: str | None = None  # where the figures came from when not measured by specgate
    # A duet window's paired ratio against the live reference (Hodges-Lehmann, specgate.paired)
    # and its interval: what the throughput gate of a speculative mode compares with.
    ratio_to_reference: RatioEntry | None = None
    # The window medians of the last LEVEL_HISTORY runs that stored this entry (oldest first),
    # this one's included: the level trend check takes its tolerance from their spread.
    level_history: list[float] = []
    # Likewise the paired ratios to the reference of the last LEVEL_HISTORY duet windows stored:
    # from 3 on, their spread is the session-to-session noise the stored-ratio gate allows for.
    ratio_history: list[float] = []
    # The host's pace behind the last LEVEL_HISTORY windows stored, this one's included: specgate's
    # CPU canary, the window's fastest reading in microseconds (specgate.telemetry.canary_reader).
    # Empty in entries written before it was kept, and where no canary ran.
    host_canary_us: list[PositiveFloat] = Field(default=[], max_length=LEVEL_HISTORY)

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
        store = BaselineFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else ""
        raise ConfigError(path, _key_of(first["loc"]) or None, f"{first['msg']}{more}") from None
    return store


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


# A run this much faster than its stored figure means the figure no longer describes the rig
# (another machine, a faster vLLM): a 30 % regression would still pass against it.
STALE_RATIO = 1.5


def baseline_notes(fit: Comparability, measured: list[float], stored_median: float,
                   refresh: str) -> dict[str, Any]:
    """What a throughput result carries about its stored figure, for the summary: how the
    fingerprints compare and, when this run is more than STALE_RATIO x the stored median, that the
    figure is stale, with the command that refreshes it."""
    notes: dict[str, Any] = {"baseline_fingerprint": fit.to_dict()}
    measured_median = statistics.median(measured) if measured else None
    if measured_median and stored_median > 0 and measured_median / stored_median > STALE_RATIO:
        notes["stale_baseline"] = (
            f"this run's median {measured_median:.1f} tok/s is {measured_median / stored_median:.2f}x the stored "
            f"{stored_median:.1f} (over {STALE_RATIO:g}x: the stored figure no longer describes this rig, and a "
            f"regression smaller than the gap would pass); refresh it with: {refresh}")
    return notes
