"""``baselines.json``: the stored reference every gate compares with.

Schema 2: rig -> mode -> prompt class -> concurrency -> histories, oldest first. A history
(:class:`BaselineEntry`) is one machine's and one build's stored starts; only a machine's newest
history not ``superseded`` gates its runs (:func:`gating_history`), and storing never appends
across machines or builds (:func:`place_start`). Schema 1 is read as one history per window.
Validated strictly on load; written only by an explicit update, atomically.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    ValidationError,
    field_validator,
    model_validator,
)

from specgate.errors import ConfigError
from specgate.files import atomic_write_json
from specgate.redaction import redacted_argv, without_secrets

SCHEMA_VERSION = 2
SCHEMA_VERSIONS = (1, 2)  # 1 is read and migrated (one history per window)


class _Model(BaseModel):
    # strict: "46.4" is not a tok/s figure; finite: Python's json reads NaN and Infinity
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


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
    # Servers measuring at once on this host (xdist workers): they slow each other.
    concurrent_servers: int = Field(default=1, ge=1)
    # What the window measured and how (None: not recorded); prompts: class -> digest.
    prompts: dict[str, PromptDigest] | None = None
    protocol: dict[str, Any] | None = None  # api, max_tokens, ignore_eos, temperature, warm-up, ...
    server_args: list[str] | None = None  # the rig's and the mode's extra `vllm serve` arguments
    env: dict[str, str] | None = None  # the rig's and mode's env, inherited speed knobs; no secret
    torch_version: str | None = None
    cuda_version: str | None = None
    cpu_model: str | None = None
    machine: str | None = None  # which host, not only its kind (fingerprint.machine_id)
    date: str | None = None
    commit: str | None = None
    sitting: str | None = None  # the series of starts it was measured in (fingerprint.sitting_id)
    note: str | None = None

    @field_validator("env")
    @classmethod
    def _no_secret_env(cls, env: dict[str, str] | None) -> dict[str, str] | None:
        """A secret an older specgate recorded is dropped as it is read, never written again."""
        return None if env is None else without_secrets(env)

    @field_validator("server_args")
    @classmethod
    def _no_secret_args(cls, args: list[str] | None) -> list[str] | None:
        return None if args is None else redacted_argv(args)

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
OTHER_SETUP = "other_setup"  # software or configuration: vLLM, torch, CUDA, driver, args, env
OTHER_MACHINE = "other_machine"  # another CPU model, GPU model or GPU count, or another host
OTHER_MEASUREMENT = "other_measurement"  # other prompt texts or another protocol
_RANK = {SAME: 0, OTHER_SETUP: 1, OTHER_MACHINE: 2, OTHER_MEASUREMENT: 3}
# Fields that existed before the others: compared even where one side is None (as before).
_LEGACY_KEYS = ("accelerator", "accelerator_count", "driver", "vllm_version", "model",
                "speculative_config", "concurrent_servers")
_KIND_OF = {"accelerator": OTHER_MACHINE, "accelerator_count": OTHER_MACHINE,
            "cpu_model": OTHER_MACHINE, "machine": OTHER_MACHINE,
            "prompts": OTHER_MEASUREMENT, "protocol": OTHER_MEASUREMENT}
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
    for key in (*_LEGACY_KEYS, *_NEW_KEYS):
        a, b = getattr(stored, key), getattr(now, key)
        if a != b and (key in _LEGACY_KEYS or (a is not None and b is not None)):
            out.append((_KIND_OF.get(key, OTHER_SETUP), f"{key}: stored {a!r}, now {b!r}"))
    if stored.protocol is not None and now.protocol is not None:
        for key in sorted(stored.protocol.keys() & now.protocol.keys()):
            if stored.protocol[key] != now.protocol[key]:
                out.append((OTHER_MEASUREMENT, f"protocol {key}: stored {stored.protocol[key]!r}, "
                                               f"now {now.protocol[key]!r}"))
    if stored.prompts is not None and now.prompts is not None:
        out += [(OTHER_MEASUREMENT, text)
                for text in _prompt_differences(stored.prompts, now.prompts)]
    return out


@dataclass(frozen=True)
class Comparability:
    """Whether a stored figure may be compared with this run's: the worst ``kind`` of difference
    and every difference, each naming the field and both values."""

    kind: str
    differences: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "differences": list(self.differences)}

    def describe(self) -> str:
        """"was measured ...: <differences>" ("" when SAME)."""
        what = {OTHER_MEASUREMENT: "was measured on other prompts or with another protocol, so it "
                                   "is not the same quantity and is not compared",
                OTHER_MACHINE: "was measured on another machine",
                OTHER_SETUP: "was measured with another software or server setup"}.get(self.kind)
        return f"{what}: {'; '.join(self.differences)}" if what else ""


def comparability(stored: Fingerprint, now: Fingerprint | None) -> Comparability:
    """The one place that decides how a stored fingerprint relates to this run's (same window);
    an unknown field, a stored fingerprint without accelerator or none now is no difference."""
    if now is None or stored.accelerator == "unknown":
        return Comparability(SAME)
    found = _field_differences(stored, now)
    kind = max((k for k, _ in found), key=_RANK.__getitem__, default=SAME)
    return Comparability(kind, tuple(text for _, text in found))


class AcceptanceEntry(_Model):
    mean_acceptance_length: float = Field(ge=1)
    acceptance_rate: float = Field(ge=0, le=1)
    per_position_rates: list[float] = []
    # The counts the rates came from (None in older entries): the evidence behind the figure.
    drafts: float | None = Field(default=None, ge=0)
    draft_tokens: float | None = Field(default=None, ge=0)
    accepted_per_position: list[float] | None = None


LEVEL_HISTORY = 30  # starts kept per history (the oldest dropped)
HISTORIES_KEPT = 12  # histories kept per window (the oldest superseded ones dropped)


class RatioEntry(_Model):
    reference_mode: str
    ratio: float = Field(gt=0)
    ci_low: float | None = Field(default=None, gt=0)
    ci_high: float | None = Field(default=None, gt=0)
    n: int = Field(ge=1)


# the fingerprint's fields that make up the server's configuration (the build's digest)
_CONFIG_KEYS = ("model", "speculative_config", "server_args", "env", "torch_version",
                "cuda_version", "driver", "concurrent_servers")


class Build(_Model):
    """What was served: vLLM's version and commit, and a digest of the server's configuration
    (model, speculative config, extra arguments, environment, torch/CUDA/driver, servers side by
    side)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)  # hashable: an identity
    vllm_version: str | None = None
    vllm_commit: str | None = None
    config_digest: str | None = None

    @classmethod
    def of(cls, fingerprint: Fingerprint) -> Build:
        config = {k: getattr(fingerprint, k) for k in _CONFIG_KEYS}
        text = json.dumps(config, sort_keys=True, default=str)
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        version = fingerprint.vllm_version
        commit = re.search(r"\+g([0-9a-f]{7,40})", version or "")
        return cls(vllm_version=version, vllm_commit=commit.group(1) if commit else None,
                   config_digest=digest)

    def describe(self) -> str:
        commit = f" ({self.vllm_commit})" if self.vllm_commit else ""
        return f"vLLM {self.vllm_version or '?'}{commit}, config {self.config_digest or '?'}"


class StoredStart(_Model):
    """One fresh start's figures for a window, and where and on what they were measured."""

    level: PositiveFloat  # the window's median decode tok/s
    ratio: PositiveFloat | None = None  # its paired ratio to the no-speculation partner (duets)
    canary_us: PositiveFloat | None = None  # the host's pace (specgate's CPU canary)
    machine: str | None = None  # specgate.store.fingerprint.machine_id; None: unknown, never gates
    build: Build = Build()
    suite_commit: str | None = None  # specgate's own commit
    date: str | None = None
    # its sitting (specgate.store.fingerprint.sitting_id); None: not recorded
    sitting: str | None = None


class BaselineEntry(_Model):
    """One history of a window: one machine's and one build's stored starts, the last start's
    samples."""

    decode_tokens_per_s: list[float] = Field(min_length=1)  # one sample per request
    sample_keys: list[str] | None = None  # "prompt-id#repeat", aligned with the samples
    median: float = Field(gt=0)
    mad: float = Field(ge=0)
    n: int = Field(ge=1)
    acceptance: AcceptanceEntry | None = None
    fingerprint: Fingerprint = Fingerprint()
    source: str | None = None  # where the figures came from when not measured by specgate
    # A duet window's paired ratio against the live reference and its interval.
    ratio_to_reference: RatioEntry | None = None
    # The stored starts, oldest first (the last LEVEL_HISTORY).
    starts: list[StoredStart] = Field(default=[], max_length=LEVEL_HISTORY)
    # Why this history no longer gates (a later update started a new one on its machine), or None.
    superseded: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_schema_1(cls, data: Any) -> Any:
        """A schema-1 entry (level_history, ratio_history, host_canary_us as bare lists) as one
        history: its starts take the entry's build, the last one its date and commit. Schema 1
        appended levels across machines, so one of more than one start is of an unknown machine
        and never gates."""
        keys = ("level_history", "ratio_history", "host_canary_us")
        if not isinstance(data, dict) or not (set(keys) & data.keys()):
            return data
        data = dict(data)
        lists = [k for k in keys if data.get(k) is not None and not isinstance(data[k], list)]
        if lists:
            raise ValueError(f"{lists[0]} is not a list (a schema-1 history: one number per start)")
        levels, ratios, canaries = (list(data.pop(key, None) or []) for key in keys)
        if "starts" in data:
            raise ValueError("both starts and the schema-1 keys "
                             "level_history/ratio_history/host_canary_us")
        if not levels:
            levels = [data.get("median")] if isinstance(data.get("median"), int | float) else []
        fingerprint = data.get("fingerprint") or {}
        fp = (fingerprint if isinstance(fingerprint, Fingerprint)
              else Fingerprint.model_validate(fingerprint))
        build = Build.of(fp).model_dump()
        count = len(levels)
        starts = []
        for i, level in enumerate(levels):
            back = count - i  # aligned from the newest
            last = back == 1
            starts.append({"level": level, "ratio": ratios[-back] if back <= len(ratios) else None,
                           "canary_us": canaries[-back] if back <= len(canaries) else None,
                           "machine": fp.machine if count == 1 else None, "build": build,
                           "suite_commit": fp.commit if last else None,
                           "date": fp.date if last else None})
        data["starts"] = starts
        return data

    @model_validator(mode="after")
    def _consistent(self) -> BaselineEntry:
        if self.n != len(self.decode_tokens_per_s):
            raise ValueError(f"n={self.n} but {len(self.decode_tokens_per_s)} samples")
        if self.sample_keys is not None and len(self.sample_keys) != self.n:
            raise ValueError("sample_keys must have one key per sample")
        mixed = {(s.machine, s.build) for s in self.starts}
        if len(mixed) > 1:  # a history is one machine's and one build's
            raise ValueError("starts of several machines or builds in one history: "
                             + "; ".join(sorted(f"{m or 'unknown machine'} / {b.describe()}"
                                                for m, b in mixed)))
        return self

    @property
    def machine(self) -> str | None:
        return self.starts[-1].machine if self.starts else self.fingerprint.machine

    @property
    def build(self) -> Build:
        return self.starts[-1].build if self.starts else Build.of(self.fingerprint)

    @property
    def level_history(self) -> list[float]:
        """The stored starts' levels (window medians), oldest first."""
        return [s.level for s in self.starts]

    @property
    def ratio_history(self) -> list[float]:
        """The stored starts' ratios to the no-speculation partner (duet windows), oldest first."""
        return [s.ratio for s in self.starts if s.ratio is not None]

    @property
    def host_canary_us(self) -> list[float]:
        return [s.canary_us for s in self.starts if s.canary_us is not None]

    def describe(self) -> str:
        """"machine M, vLLM V, config D: N starts (first - last)"."""
        dates = [s.date for s in self.starts if s.date]
        when = (f" ({dates[0]} to {dates[-1]})" if len(dates) > 1
                else f" ({dates[0]})" if dates else "")
        return (f"{self.machine or 'unknown machine'}, {self.build.describe()}: "
                f"{len(self.starts)} stored start(s){when}"
                + (f"; superseded: {self.superseded}" if self.superseded else ""))


def _as_histories(node: Any, depth: int) -> Any:
    """Schema 1's rig -> mode -> class -> concurrency -> entry with each entry as a one-history
    list; a part that is not a table is left for the validation to refuse naming its key."""
    if depth == 0:
        return [node]
    if not isinstance(node, dict):
        return node
    return {key: _as_histories(value, depth - 1) for key, value in node.items()}


class BaselineFile(_Model):
    schema_version: int
    # rig -> mode -> prompt class -> concurrency (as a string) -> histories, oldest first
    rigs: dict[str, dict[str, dict[str, dict[str, list[BaselineEntry]]]]] = {}

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: Any) -> Any:
        """Schema 1 (one entry per window) as schema 2 (one history per window)."""
        if (isinstance(data, dict) and data.get("schema_version") == 1
                and type(data.get("schema_version")) is int):
            rigs = {"rigs": _as_histories(data["rigs"], 4)} if "rigs" in data else {}
            return {**data, "schema_version": SCHEMA_VERSION, **rigs}
        return data

    @model_validator(mode="after")
    def _known_version(self) -> BaselineFile:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(f"schema_version {self.schema_version} is not supported (expected one "
                             f"of {', '.join(map(str, SCHEMA_VERSIONS))})")
        return self


def load_baselines(path: Path) -> BaselineFile:
    """Read and validate; a missing file is an empty store (the first update creates it)."""
    if not path.exists():
        return BaselineFile(schema_version=SCHEMA_VERSION)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(path, None, f"not valid JSON (line {exc.lineno}, column {exc.colno}: "
                          f"{exc.msg}); fix it or restore it from version control") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(path, None, f"not UTF-8 text, as JSON must be ({exc.reason} at byte "
                          f"{exc.start})") from None
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read: {exc}") from None
    try:
        store = BaselineFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else ""
        key = ".".join(str(part) for part in first["loc"]) or None
        raise ConfigError(path, key, f"{first['msg']}{more}") from None
    return store


def histories(store: BaselineFile, rig: str, mode: str, prompt_class: str,
              concurrency: int) -> list[BaselineEntry]:
    """Every stored history of the window, oldest first (superseded and other machines' too)."""
    return store.rigs.get(rig, {}).get(mode, {}).get(prompt_class, {}).get(str(concurrency), [])


def gating_history(found: list[BaselineEntry], machine: str | None) -> BaselineEntry | None:
    """The history that gates a run on ``machine``: its newest one not superseded. None when the
    machine is unknown or has none."""
    if machine is None:
        return None
    return next((h for h in reversed(found) if h.machine == machine and h.superseded is None), None)


ANY_MACHINE = object()


def lookup(store: BaselineFile, rig: str, mode: str, prompt_class: str, concurrency: int,
           machine: Any = ANY_MACHINE) -> BaselineEntry | None:
    """The window's history that gates ``machine``; with no machine given, the newest history not
    superseded, whichever machine's (for figures that do not depend on the host)."""
    found = histories(store, rig, mode, prompt_class, concurrency)
    if machine is not ANY_MACHINE:
        return gating_history(found, machine)
    return next((h for h in reversed(found) if h.superseded is None), None)


def place_start(found: list[BaselineEntry], new: BaselineEntry, *, new_history: bool, when: str
                ) -> tuple[list[BaselineEntry], str]:
    """Store ``new`` (one start's entry) among a window's histories, and say what was done: extend
    the machine's gating history of the same build, unless ``new_history``; else start a history,
    superseding the machine's previous one. A start of an unknown machine is never appended."""
    machine = new.machine
    current = gating_history(found, machine)
    if current is not None and not new_history and current.build == new.build:
        merged = new.model_copy(update={"starts": [*current.starts, *new.starts][-LEVEL_HISTORY:]})
        kept = [merged if h is current else h for h in found]
        return kept, f"start {len(merged.starts)} of {machine}'s history ({new.build.describe()})"
    out = list(found)
    if machine is None:
        said = "a history of its own (this machine is unknown: it never gates)"
    elif current is None:
        said = (f"a new history for {machine} (no history of this machine was stored"
                + (f"; {len(found)} of other machines are kept apart)" if found else ")"))
    else:
        why = ("--specgate-update-baselines: a deliberate change accepted" if new_history else
               f"the build changed: {current.build.describe()} -> {new.build.describe()}")
        label = f"by the history started {when} ({why})"
        out = [h.model_copy(update={"superseded": label}) if h is current else h for h in found]
        said = (f"a new history for {machine} ({why}); its previous one "
                f"({len(current.starts)} start(s)) is kept, superseded, and no longer gates")
    out.append(new)
    while len(out) > HISTORIES_KEPT:  # the oldest that cannot gate go first
        out.remove(next((h for h in out if h.superseded or h.machine is None), out[0]))
    return out, said


def merge_updates(path: Path, updates: dict[tuple[str, str, str, int], BaselineEntry], *,
                  new_history: bool = False
                  ) -> tuple[BaselineFile, dict[tuple[str, str, str, int], str]]:
    """Store each update into the file as it is on disk now (re-read) and replace it atomically;
    the new content and, per window, what was done."""
    store = load_baselines(path)
    when = dt.date.today().isoformat()
    said = {}
    for (rig, mode, prompt_class, concurrency), entry in updates.items():
        windows = store.rigs.setdefault(rig, {}).setdefault(mode, {}).setdefault(prompt_class, {})
        windows[str(concurrency)], said[(rig, mode, prompt_class, concurrency)] = place_start(
            windows.get(str(concurrency), []), entry, new_history=new_history, when=when)
    # one space a level: a history's starts nest nine levels deep, and the file is committed
    atomic_write_json(path, store.model_dump(mode="json", exclude_none=True), indent=1)
    return store, said


# A run this much faster than its stored figure means the figure no longer describes the rig.
STALE_RATIO = 1.5


def baseline_notes(fit: Comparability, measured: list[float], stored_median: float,
                   refresh: str) -> dict[str, Any]:
    """What a throughput result carries about its stored figure: how the fingerprints compare
    and, above STALE_RATIO x the stored median, that the figure is stale and how to refresh it."""
    notes: dict[str, Any] = {"baseline_fingerprint": fit.to_dict()}
    measured_median = statistics.median(measured) if measured else None
    if measured_median and stored_median > 0 and measured_median / stored_median > STALE_RATIO:
        notes["stale_baseline"] = (
            f"this run's median {measured_median:.1f} tok/s is "
            f"{measured_median / stored_median:.2f}x the stored {stored_median:.1f} (over "
            f"{STALE_RATIO:g}x: the stored figure no longer describes this rig, and a regression "
            f"smaller than the gap would pass); refresh it with: {refresh}")
    return notes
