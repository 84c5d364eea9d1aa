"""vLLM's Prometheus /metrics text: snapshots, the difference of two taken around a measurement
window (counters grow from the server's start), and from it speculative-decoding acceptance and
the server-side decode rate."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from specgate.errors import MetricsError

# Counter names as vLLM registers them, without `_total` (matched with and without it).
SPEC_NUM_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_NUM_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
SPEC_ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATION_TOKENS = "vllm:generation_tokens"
PROMPT_TOKENS = "vllm:prompt_tokens"

SPEC_CORE_COUNTERS = (SPEC_NUM_DRAFTS, SPEC_NUM_DRAFT_TOKENS, SPEC_NUM_ACCEPTED_TOKENS)
COUNTERS = (*SPEC_CORE_COUNTERS, SPEC_ACCEPTED_PER_POSITION, GENERATION_TOKENS, PROMPT_TOKENS)

# Latency histograms whose totals are kept (their names changed between vLLM releases).
REQUEST_TIME_PER_OUTPUT_TOKEN = "vllm:request_time_per_output_token_seconds"
TIME_PER_OUTPUT_TOKEN = "vllm:time_per_output_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
HISTOGRAMS = (TIME_PER_OUTPUT_TOKEN, INTER_TOKEN_LATENCY, REQUEST_TIME_PER_OUTPUT_TOKEN,
              "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
              "vllm:request_decode_time_seconds", "vllm:request_generation_tokens")

# Preference for the decode rate: the per-request mean counts every token, a step histogram not.
DECODE_RATE_SOURCES = (REQUEST_TIME_PER_OUTPUT_TOKEN, TIME_PER_OUTPUT_TOKEN, INTER_TOKEN_LATENCY)

POSITION_LABEL = "position"
MODEL_NAME_LABEL = "model_name"


@dataclass(frozen=True)
class SpecDecodeCounters:
    """Speculative-decoding counters, summed over engines (and models unless filtered)."""

    num_drafts: float
    num_draft_tokens: float
    num_accepted_tokens: float
    # Accepted tokens at draft position 0..k-1; empty without the per-position counter.
    accepted_per_position: tuple[float, ...]


@dataclass(frozen=True)
class HistogramTotals:
    """The `_sum` and `_count` of one histogram, summed over label sets."""

    sum: float
    count: float


@dataclass(frozen=True)
class ServerCounts:
    """The /metrics series specgate uses, at one scrape or over a window. spec is None when the
    server runs without speculation; other absent series are None or left out of `histograms`."""

    spec: SpecDecodeCounters | None
    generation_tokens: float | None
    histograms: dict[str, HistogramTotals]
    prompt_tokens: float | None = None


@dataclass(frozen=True)
class MetricsSnapshot(ServerCounts):
    """One scrape of /metrics, reduced to what specgate uses."""


@dataclass(frozen=True)
class MetricsDelta(ServerCounts):
    """What happened on the server between two snapshots; label names the window in messages."""

    label: str = field(kw_only=True)


@dataclass(frozen=True)
class DecodeRate:
    """Server-side decode rate of a window and the histogram it was computed from."""

    value: float  # tokens per second per request (1 / mean time per output token)
    source: str  # histogram name, e.g. "vllm:request_time_per_output_token_seconds"


# Every sample name specgate reads -> (metric, part): "value", "sum" or "count".
_WANTED: dict[str, tuple[str, str]] = {
    **{name: (counter, "value") for counter in COUNTERS for name in (counter + "_total", counter)},
    **{f"{histogram}_{part}": (histogram, part)
       for histogram in HISTOGRAMS for part in ("sum", "count")}}
# A line's metric name: a sample's, or the family's in a "# HELP" or "# TYPE" line.
_LINE_NAME = re.compile(r"[ \t]*(?:#[ \t]*(?:HELP|TYPE)[ \t]+)?([A-Za-z_:][A-Za-z0-9_:]*)")
_KEPT_NAMES = frozenset({*_WANTED, *COUNTERS, *HISTOGRAMS})


def _wanted_lines(text: str) -> str:
    """The lines of a scrape naming a series specgate reads (the pure-Python parser is slow on
    the rest). A text in which no line names one is parsed whole, so non-Prometheus text fails."""
    kept = [line for line in text.splitlines()
            if (match := _LINE_NAME.match(line)) is not None and match.group(1) in _KEPT_NAMES]
    return "\n".join(kept) + "\n" if kept else text


@dataclass(frozen=True)
class _Series:
    metric: str
    part: str
    sample_name: str
    labels: Mapping[str, str]
    value: float


def _read_series(text: str, source: str) -> list[_Series]:
    try:
        # The parser is a generator: list() forces it so errors surface here.
        families = list(text_string_to_metric_families(_wanted_lines(text)))
    except ValueError as error:  # the only exception the parser raises on bad text
        raise MetricsError(f"{source}: cannot parse Prometheus text: "
                           f"{error or 'malformed line'}") from error
    series: list[_Series] = []
    for family in families:
        for sample in family.samples:
            target = _WANTED.get(sample.name)
            if target is None:
                continue
            value = float(sample.value)
            # A NaN or negative total would poison every delta; the scrape is not from vLLM.
            if math.isnan(value) or value < 0:
                raise MetricsError(f"{source}: series {sample.name}{dict(sample.labels)} has "
                                   f"invalid value {value!r}")
            series.append(_Series(target[0], target[1], sample.name, dict(sample.labels), value))
    return series


def _filter_model(series: list[_Series], model_name: str | None, source: str) -> list[_Series]:
    if model_name is None or not series:
        return series
    kept = [s for s in series if s.labels.get(MODEL_NAME_LABEL) == model_name]
    if not kept:
        seen = sorted({s.labels[MODEL_NAME_LABEL] for s in series if MODEL_NAME_LABEL in s.labels})
        seen_text = (", ".join(repr(name) for name in seen) if seen
                     else "none (no series carries a model_name label)")
        raise MetricsError(f"{source}: no vLLM series for model_name={model_name!r}; "
                           f"model names seen: {seen_text}")
    return kept


def _total(series: Iterable[_Series]) -> float:
    return math.fsum(s.value for s in series)


def _accepted_per_position(series: list[_Series], source: str) -> tuple[float, ...]:
    by_position: dict[int, list[_Series]] = {}
    for s in series:
        raw = s.labels.get(POSITION_LABEL)
        try:
            position = int(raw) if raw is not None else -1
        except ValueError:
            position = -1
        if position < 0:
            raise MetricsError(f"{source}: series {s.sample_name}{dict(s.labels)} lacks a "
                               f"non-negative integer '{POSITION_LABEL}' label")
        by_position.setdefault(position, []).append(s)
    positions = sorted(by_position)
    # vLLM registers positions 0..k-1 up front; a gap means a cut or mixed scrape.
    if positions != list(range(len(positions))):
        raise MetricsError(f"{source}: {SPEC_ACCEPTED_PER_POSITION} positions are {positions}, "
                           f"expected 0..{len(positions) - 1}")
    return tuple(_total(by_position[p]) for p in positions)


def parse_metrics(text: str, *, source: str = "/metrics",
                  model_name: str | None = None) -> MetricsSnapshot:
    """Parse vLLM's /metrics text into a snapshot: series of several label sets summed; with
    model_name only its series kept. source names the text in error messages."""
    series = _filter_model(_read_series(text, source), model_name, source)
    grouped: dict[tuple[str, str], list[_Series]] = {}
    for s in series:
        grouped.setdefault((s.metric, s.part), []).append(s)

    def counter(name: str) -> float | None:
        found = grouped.get((name, "value"))
        return _total(found) if found else None

    core = {name: counter(name) for name in SPEC_CORE_COUNTERS}
    per_position_series = grouped.get((SPEC_ACCEPTED_PER_POSITION, "value"), [])
    spec: SpecDecodeCounters | None
    if all(value is None for value in core.values()) and not per_position_series:
        spec = None
    else:
        missing = [name for name, value in core.items() if value is None]
        if missing:
            raise MetricsError(f"{source}: speculative-decoding counters are incomplete, "
                               f"missing {', '.join(missing)}")
        spec = SpecDecodeCounters(*(value or 0.0 for value in core.values()),
                                  accepted_per_position=_accepted_per_position(
                                      per_position_series, source))

    histograms: dict[str, HistogramTotals] = {}
    for name in HISTOGRAMS:
        sums, counts = grouped.get((name, "sum")), grouped.get((name, "count"))
        if sums and counts:  # one of the two parts gives no mean: skipped like an absent one
            histograms[name] = HistogramTotals(sum=_total(sums), count=_total(counts))
    return MetricsSnapshot(spec=spec, generation_tokens=counter(GENERATION_TOKENS),
                           histograms=histograms, prompt_tokens=counter(PROMPT_TOKENS))


def _counter_delta(name: str, before: float, after: float, label: str) -> float:
    if after < before:
        raise MetricsError(f"counter {name} went down from {before:g} to {after:g}: "
                           f"the server restarted during the window ({label})")
    return after - before


def _optional_delta(name: str, before: float | None, after: float | None,
                    label: str) -> float | None:
    # An optional counter seen on only one side is left out rather than guessed.
    if before is None or after is None:
        return None
    return _counter_delta(name, before, after, label)


def _spec_delta(before: SpecDecodeCounters | None, after: SpecDecodeCounters | None,
                label: str) -> SpecDecodeCounters | None:
    if before is None and after is None:
        return None
    if before is None or after is None:
        was, now = ("present", "missing") if after is None else ("missing", "present")
        server = ("without speculation answered" if after is None
                  else "with speculation answered only")
        raise MetricsError(f"speculative-decoding counters were {was} before the window but are "
                           f"{now} after it: a server {server} the second scrape (restart or wrong "
                           f"server?) ({label})")
    if len(before.accepted_per_position) != len(after.accepted_per_position):
        raise MetricsError(
            f"{SPEC_ACCEPTED_PER_POSITION} has {len(before.accepted_per_position)} positions "
            f"before the window and {len(after.accepted_per_position)} after it: the server was "
            f"reconfigured during the window ({label})")
    per_position = tuple(
        _counter_delta(f'{SPEC_ACCEPTED_PER_POSITION}{{position="{i}"}}', b, a, label)
        for i, (b, a) in enumerate(zip(before.accepted_per_position,
                                       after.accepted_per_position, strict=True)))
    core = (_counter_delta(name, getattr(before, f.name), getattr(after, f.name), label)
            for name, f in zip(SPEC_CORE_COUNTERS, fields(SpecDecodeCounters)))
    return SpecDecodeCounters(*core, accepted_per_position=per_position)


def metrics_delta(before: MetricsSnapshot, after: MetricsSnapshot, *, label: str) -> MetricsDelta:
    """after minus before for every counter and histogram total: a total that went down raises
    (a restart), as do speculation counters on one side only; other such series are left out."""
    histograms: dict[str, HistogramTotals] = {}
    for name in HISTOGRAMS:
        b, a = before.histograms.get(name), after.histograms.get(name)
        if b is None or a is None:
            continue
        histograms[name] = HistogramTotals(
            sum=_counter_delta(f"{name}_sum", b.sum, a.sum, label),
            count=_counter_delta(f"{name}_count", b.count, a.count, label))
    return MetricsDelta(
        label=label, spec=_spec_delta(before.spec, after.spec, label),
        generation_tokens=_optional_delta(GENERATION_TOKENS, before.generation_tokens,
                                          after.generation_tokens, label),
        histograms=histograms,
        prompt_tokens=_optional_delta(PROMPT_TOKENS, before.prompt_tokens, after.prompt_tokens,
                                      label))


def _require_number(data: Mapping[str, Any], key: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"acceptance stats: '{key}' must be a number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class AcceptanceStats:
    """Speculative-decoding acceptance over one window; ratios are per draft (one speculation
    step proposing up to k tokens), as vLLM reports mean acceptance length."""

    drafts: float
    draft_tokens: float
    accepted_tokens: float
    accepted_per_position: tuple[float, ...]

    def __post_init__(self) -> None:
        # Normalise lists (e.g. from JSON) so the frozen instance stays hashable.
        object.__setattr__(self, "accepted_per_position",
                           tuple(float(x) for x in self.accepted_per_position))
        for name in ("drafts", "draft_tokens", "accepted_tokens"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"acceptance stats: {name} must be a finite non-negative "
                                 f"number, got {value!r}")
        if any(not math.isfinite(x) or x < 0 for x in self.accepted_per_position):
            raise ValueError("acceptance stats: accepted_per_position has invalid values "
                             f"{self.accepted_per_position}")
        if self.drafts == 0 or self.draft_tokens == 0:  # every ratio divides by one of these
            raise ValueError("acceptance stats need drafts > 0 and draft_tokens > 0, "
                             f"got {self.drafts:g} and {self.draft_tokens:g}")

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per draft: the verified bonus token plus the accepted ones."""
        return 1.0 + self.accepted_tokens / self.drafts

    @property
    def acceptance_rate(self) -> float:
        """Share of proposed draft tokens that were accepted."""
        return self.accepted_tokens / self.draft_tokens

    @property
    def per_position_rates(self) -> tuple[float, ...]:
        """Share of drafts whose token at position i was accepted."""
        return tuple(accepted / self.drafts for accepted in self.accepted_per_position)

    @property
    def conditional_rates(self) -> tuple[float | None, ...]:
        """Acceptance at position i given position i-1 was accepted (r_0, r_1/r_0, ...); None
        where the previous position was never accepted."""
        rates = self.per_position_rates
        return tuple(rate if i == 0 else (rate / rates[i - 1] if rates[i - 1] > 0 else None)
                     for i, rate in enumerate(rates))

    @property
    def num_speculative_tokens(self) -> int:
        """k, the number of draft positions (0 when the server lacks per-position counters)."""
        return len(self.accepted_per_position)

    @classmethod
    def from_delta(cls, delta: MetricsDelta, *,
                   drafts_expected: bool = True) -> AcceptanceStats | None:
        """Acceptance for the window, or None without speculation, or with no draft where none
        need be (``drafts_expected`` False: a schedule with k = 0 at some batch sizes)."""
        spec = delta.spec
        if spec is None or (spec.num_drafts == 0 and not drafts_expected):
            return None
        if spec.num_drafts == 0:
            raise MetricsError("speculation is on but no drafts were made in the window "
                               f"({delta.label})")
        if spec.num_draft_tokens == 0:
            raise MetricsError(f"{spec.num_drafts:g} drafts but no draft tokens counted in the "
                               f"window: inconsistent counters ({delta.label})")
        return cls(drafts=spec.num_drafts, draft_tokens=spec.num_draft_tokens,
                   accepted_tokens=spec.num_accepted_tokens,
                   accepted_per_position=spec.accepted_per_position)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict: the raw counts plus the derived figures for readers of the file."""
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "accepted_per_position": list(self.accepted_per_position),
            "mean_acceptance_length": self.mean_acceptance_length,
            "acceptance_rate": self.acceptance_rate,
            "per_position_rates": list(self.per_position_rates),
            "conditional_rates": list(self.conditional_rates)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AcceptanceStats:
        """Inverse of to_dict (derived figures recomputed); ValueError names the bad key."""
        per_position = data.get("accepted_per_position", [])
        if not isinstance(per_position, (list, tuple)):
            raise ValueError("acceptance stats: 'accepted_per_position' must be a list, "
                             f"got {per_position!r}")
        for value in per_position:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError("acceptance stats: 'accepted_per_position' must hold numbers, "
                                 f"got {value!r}")
        return cls(drafts=_require_number(data, "drafts"),
                   draft_tokens=_require_number(data, "draft_tokens"),
                   accepted_tokens=_require_number(data, "accepted_tokens"),
                   accepted_per_position=tuple(float(v) for v in per_position))


def server_decode_steps(delta: MetricsDelta) -> float | None:
    """The decode steps vLLM took for the window's requests (its inter-token latency histogram's
    count: one per request per engine step after the first token), or None."""
    for name in (INTER_TOKEN_LATENCY, TIME_PER_OUTPUT_TOKEN):
        totals = delta.histograms.get(name)
        if totals is not None and totals.count > 0:
            return totals.count
    return None


def server_decode_tokens_per_s(delta: MetricsDelta) -> DecodeRate | None:
    """1 / mean time per output token from the first of DECODE_RATE_SOURCES with data, or None."""
    for name in DECODE_RATE_SOURCES:
        totals = delta.histograms.get(name)
        if totals is None or totals.count <= 0 or totals.sum <= 0:
            continue
        return DecodeRate(value=totals.count / totals.sum, source=name)
    return None
