"""What a saved report must hold for ``--specgate-report-only`` and ``advise`` to read it, typed
as report.json's schema (specgate.report.schemas.ReportFile) with what older reports lack
optional. :func:`check_readable` names the file and the damaged key instead of a traceback.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specgate.errors import ConfigError

# The outcomes a report may hold (specgate.decide.outcome.Outcome's values; a test checks them).
OUTCOMES = ("pass", "fail", "declared backfire", "undecided", "not stored", "other machine",
            "not run")


class _Read(BaseModel):
    # strict: "1" is not a concurrency nor true a count; finite where a figure is rendered
    model_config = ConfigDict(extra="allow", strict=True)


class _Finite(_Read):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


class Record(_Finite):
    request_id: str | None = None
    prompt_id: str | None = None
    started_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    chunk_times: list[float] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    text: str | None = None
    finish_reason: str | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    decode_tokens_per_s: float | None = Field(default=None, ge=0)
    e2e_tokens_per_s: float | None = None


class Acceptance(_Finite):
    mean_acceptance_length: float = Field(ge=1)  # 1 + accepted tokens per draft
    acceptance_rate: float
    per_position_rates: list[float] = []
    accepted_per_position: list[float] | None = None
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None


# the telemetry window's series the environment table reads: [fastest or lowest, median, highest]
_SERIES = ("cpu_canary_us", "cpu_busy_pct", "cpu_steal_pct")


class Telemetry(_Finite):
    window: dict[str, Any] | None = None
    requests: dict[str, dict[str, Any]] | None = None

    @field_validator("window")
    @classmethod
    def _readable_window(cls, window: dict[str, Any] | None) -> dict[str, Any] | None:
        for key, value in (window or {}).items():
            if key in _SERIES or key.endswith((".sm_clock_mhz", ".power_w")):
                if not (isinstance(value, list) and len(value) == 3
                        and all(_is_number(v) for v in value)):
                    raise ValueError(f"{key}: a telemetry series is 3 numbers (lowest, median, "
                                     "highest)")
            elif key.endswith(".cpu_s") and not _is_number(value):
                raise ValueError(f"{key}: CPU seconds are a number")
            elif key == "throttle_reasons" and not (
                    isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise ValueError(f"{key}: a list of strings")
        return window

    @field_validator("requests")
    @classmethod
    def _readable_requests(cls, requests: dict[str, dict[str, Any]] | None
                           ) -> dict[str, dict[str, Any]] | None:
        for request, values in (requests or {}).items():
            for key, value in values.items():
                if key.endswith(".cpu_s") and not _is_number(value):
                    raise ValueError(f"{request}: {key}: CPU seconds are a number")
        return requests


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


class _Keyed(_Read):
    mode: str
    prompt_class: str
    concurrency: int


class Window(_Keyed):
    """One measured window, or its duet partner."""

    records: list[Record]
    wall_s: float | None = None
    aggregate_tokens_per_s: float | None = None
    server_decode_tokens_per_s: float | None = None
    server_metric_source: str | None = None
    acceptance: Acceptance | None = None
    telemetry: Telemetry | None = None
    partner: Window | None = None
    arrangement: str | None = None
    design: str | None = None
    role: str | None = None
    ab_side: str | None = None
    side: str | None = None


class Fit(_Read):
    kind: str | None = None
    differences: list[str] = []


class Pair(_Read):
    text: str | None = None


class Details(_Finite):
    """A gate's comparison: the figures a table or plot formats are numbers where present."""

    ratio: float | None = Field(default=None, gt=0)
    ci_low: float | None = None
    ci_high: float | None = None
    threshold: float | None = None
    limit: float | None = None
    n: int | float | None = None
    n_measured: int | float | None = None
    measured: float | None = None
    reference: float | None = None
    median_ttft_ms: float | None = None
    reference_median_ttft_ms: float | None = None
    identical_share: float | None = None
    verdict: str | None = None
    reference_label: str | None = None
    compared: str | dict[str, Any] | None = None  # facts (a stored history), words in older reports
    design: str | None = None
    stale_baseline: str | None = None
    baseline_fingerprint: Fit | None = None
    strongest_pair: Pair | None = None
    checks: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _interval_has_two_ends(self) -> Details:
        if (self.ci_low is None) != (self.ci_high is None):
            raise ValueError("ci_low and ci_high: an interval has both ends or neither")
        return self


class Entry(_Read):
    """A gate's verdict (``gates``) or a gate that decided nothing (``undecided``, with a
    ``kind``)."""

    gate: str
    mode: str
    prompt_class: str
    concurrency: int
    message: str = Field(min_length=1)  # its first line is the summary's
    outcome: str | None = None
    details: Details = Details()  # absent in older undecided entries; never null
    gating: str | None = None
    gating_reason: str = ""
    kind: str | None = None

    @model_validator(mode="after")
    def _ttft_figures(self) -> Entry:
        # the TTFT table shows both sides' medians and the limit of a TTFT gate with a ratio
        lacks = [key for key in ("median_ttft_ms", "reference_median_ttft_ms", "limit")
                 if getattr(self.details, key) is None]
        if self.gate == "ttft" and self.details.ratio is not None and lacks:
            raise ValueError(f"details.{lacks[0]}: a TTFT gate's ratio comes with both medians and "
                             "its limit")
        return self

    @field_validator("outcome")
    @classmethod
    def _known_outcome(cls, outcome: str | None) -> str | None:
        if outcome is not None and outcome not in OUTCOMES:
            raise ValueError(f"{outcome!r} is not an outcome ({', '.join(OUTCOMES)})")
        return outcome


class Verdict(Entry):
    passed: bool | None


class Undecided(Entry):
    kind: str
    outcome: str = "undecided"  # absent in older reports (read from the kind); never null


class Failure(_Keyed):
    error: str = Field(min_length=1)


class RigPart(_Read):
    name: str
    reference_mode: str | None
    modes: dict[str, dict[str, Any] | None]
    tier: str | None = None
    model: str | None = None


class Family(_Read):
    gating_decisions: int
    confidence: float
    family_false_alarm: float | None = None
    undecided_red: bool = False


class StartOrder(_Read):
    seed: int | list[int] | None  # one seed, or each xdist worker's
    first: dict[str, str] | None = None


class WindowSettings(_Keyed):
    confidence: float
    level_tolerance: float
    ab_tolerance: float
    acceptance_tolerance: float
    ttft_tolerance: float
    min_speedup: float
    arrangement: str
    comparing: str | None = None


class ReadableReport(_Read):
    specgate_report: int
    rig: RigPart
    measurements: list[Window]
    gates: list[Verdict]
    undecided: list[Undecided] = []
    failures: list[Failure] = []
    complete: bool = True
    outcome_policy: dict[str, str] | None = None
    family: Family | None = None
    start_order: StartOrder | None = None
    settings: list[WindowSettings] | None = None
    fingerprints: dict[str, Any] | None = None


def check_readable(data: dict[str, Any], path: Path | str) -> None:
    """Raise a ConfigError naming ``path`` and the first damaged key when ``data`` is not a report
    the renderers can read."""
    try:
        ReadableReport.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else ""
        said = first["msg"].removeprefix("Value error, ")
        raise ConfigError(path, _key(first["loc"]),
                          f"{said}: a damaged report, nothing to render it from{more}") from None


def _key(loc: tuple[Any, ...]) -> str:
    """``("measurements", 0, "records")`` as ``measurements[0].records``."""
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key
