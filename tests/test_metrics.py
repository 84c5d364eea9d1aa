"""Tests for specgate.measure.metrics against /metrics text shaped like vLLM v1's."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specgate.errors import MetricsError
from specgate.measure import metrics
from specgate.measure.metrics import (
    INTER_TOKEN_LATENCY,
    REQUEST_TIME_PER_OUTPUT_TOKEN,
    TIME_PER_OUTPUT_TOKEN,
    AcceptanceStats,
    HistogramTotals,
    MetricsDelta,
    SpecDecodeCounters,
    metrics_delta,
    parse_metrics,
    server_decode_tokens_per_s,
)

pytestmark = pytest.mark.fast
RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "recorded"

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CREATED = "1.7325e+09"


@dataclass(frozen=True)
class EngineCounters:
    """Counter values of one engine, written out by render_metrics."""

    engine: str
    model: str = MODEL
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: tuple[float, ...] = ()
    generation_tokens: float = 0.0
    prompt_tokens: float = 0.0
    tpot_sum: float = 0.0
    tpot_count: float = 0.0
    itl_sum: float = 0.0
    itl_count: float = 0.0


def _labels(engine: EngineCounters, **extra: str) -> str:
    pairs = {"engine": engine.engine, "model_name": engine.model, **extra}
    return ",".join(f'{key}="{value}"' for key, value in pairs.items())


def _counter(name: str, help_text: str, engines: list[EngineCounters], value_of, **extra: str) -> list[str]:
    # prometheus_client writes `_created` right after each `_total` sample, which
    # the text parser turns into separate untyped families: the realistic case.
    lines = [f"# HELP {name}_total {help_text}", f"# TYPE {name}_total counter"]
    for engine in engines:
        lines.append(f"{name}_total{{{_labels(engine, **extra)}}} {value_of(engine)!r}")
        lines.append(f"{name}_created{{{_labels(engine, **extra)}}} {CREATED}")
    return lines


def _histogram(name: str, help_text: str, engines: list[EngineCounters], sum_of, count_of) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    for engine in engines:
        count = count_of(engine)
        for bound, share in (("0.01", 0.25), ("0.025", 0.75), ("+Inf", 1.0)):
            lines.append(f"{name}_bucket{{{_labels(engine, le=bound)}}} {count * share!r}")
        lines.append(f"{name}_count{{{_labels(engine)}}} {count!r}")
        lines.append(f"{name}_sum{{{_labels(engine)}}} {sum_of(engine)!r}")
    for engine in engines:
        lines.append(f"{name}_created{{{_labels(engine)}}} {CREATED}")
    return lines


def render_metrics(engines: list[EngineCounters], *, speculation: bool = True) -> str:
    """/metrics text as a vLLM v1 server with these engines would expose it."""
    lines = [
        "# HELP python_gc_objects_collected_total Objects collected during gc",
        "# TYPE python_gc_objects_collected_total counter",
        'python_gc_objects_collected_total{generation="0"} 8123.0',
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        *(f"vllm:num_requests_running{{{_labels(e)}}} 0.0" for e in engines),
        "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:gpu_cache_usage_perc gauge",
        *(f"vllm:gpu_cache_usage_perc{{{_labels(e)}}} 0.0125" for e in engines),
    ]
    lines += _counter(
        "vllm:prompt_tokens", "Number of prefill tokens processed.", engines, lambda e: e.prompt_tokens
    )
    lines += _counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        engines,
        lambda e: e.generation_tokens,
    )
    lines += _histogram(
        TIME_PER_OUTPUT_TOKEN,
        "Histogram of time per output token in seconds.",
        engines,
        lambda e: e.tpot_sum,
        lambda e: e.tpot_count,
    )
    lines += _histogram(
        INTER_TOKEN_LATENCY,
        "Histogram of inter-token latency in seconds.",
        engines,
        lambda e: e.itl_sum,
        lambda e: e.itl_count,
    )
    if speculation:
        lines += _counter(
            "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", engines, lambda e: e.drafts
        )
        lines += _counter(
            "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", engines, lambda e: e.draft_tokens
        )
        lines += _counter(
            "vllm:spec_decode_num_accepted_tokens",
            "Number of accepted tokens.",
            engines,
            lambda e: e.accepted,
        )
        lines += [
            "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.",
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
        ]
        for engine in engines:
            for position, value in enumerate(engine.per_position):
                labels = _labels(engine, position=str(position))
                lines.append(f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels}}} {value!r}")
                lines.append(f"vllm:spec_decode_num_accepted_tokens_per_pos_created{{{labels}}} {CREATED}")
    return "\n".join(lines) + "\n"


BEFORE = EngineCounters(
    engine="0",
    drafts=100.0,
    draft_tokens=300.0,
    accepted=150.0,
    per_position=(80.0, 50.0, 20.0),
    generation_tokens=1000.0,
    prompt_tokens=500.0,
    tpot_sum=2.0,
    tpot_count=100.0,
    itl_sum=1.5,
    itl_count=90.0,
)
# Window: 200 drafts of k=3 (600 draft tokens), 300 accepted: 160 / 100 / 40 per position.
AFTER = EngineCounters(
    engine="0",
    drafts=300.0,
    draft_tokens=900.0,
    accepted=450.0,
    per_position=(240.0, 150.0, 60.0),
    generation_tokens=1900.0,
    prompt_tokens=800.0,
    tpot_sum=6.0,
    tpot_count=300.0,
    itl_sum=4.5,
    itl_count=240.0,
)


def test_snapshot_reads_vllm_v1_text() -> None:
    snapshot = parse_metrics(render_metrics([BEFORE]))
    assert snapshot.spec == SpecDecodeCounters(100.0, 300.0, 150.0, (80.0, 50.0, 20.0))
    assert snapshot.generation_tokens == 1000.0
    assert snapshot.prompt_tokens == 500.0
    assert snapshot.histograms == {
        TIME_PER_OUTPUT_TOKEN: HistogramTotals(sum=2.0, count=100.0),
        INTER_TOKEN_LATENCY: HistogramTotals(sum=1.5, count=90.0),
    }


def test_window_acceptance_from_two_snapshots() -> None:
    before = parse_metrics(render_metrics([BEFORE]))
    after = parse_metrics(render_metrics([AFTER]))
    delta = metrics_delta(before, after, label="mode ngram, class coding")
    assert delta.generation_tokens == 900.0
    assert delta.prompt_tokens == 300.0

    stats = AcceptanceStats.from_delta(delta)
    assert stats is not None
    assert stats.drafts == 200.0
    assert stats.mean_acceptance_length == pytest.approx(1 + 300 / 200)
    assert stats.acceptance_rate == pytest.approx(300 / 600)
    assert stats.per_position_rates == pytest.approx((0.8, 0.5, 0.2))
    assert stats.conditional_rates == pytest.approx((0.8, 0.5 / 0.8, 0.2 / 0.5))
    assert stats.num_speculative_tokens == 3


def test_counters_without_type_lines_or_suffix_are_read() -> None:
    # An untyped exposition keeps `_total` on the family name; a typed counter
    # written without the suffix gets it added by the parser. Both must count.
    text = (
        "\n".join(
            [
                'vllm:spec_decode_num_drafts_total{engine="0"} 10',
                'vllm:spec_decode_num_draft_tokens_total{engine="0"} 30',
                "# TYPE vllm:spec_decode_num_accepted_tokens counter",
                'vllm:spec_decode_num_accepted_tokens{engine="0"} 12',
                "vllm:generation_tokens 40",
            ]
        )
        + "\n"
    )
    snapshot = parse_metrics(text)
    assert snapshot.spec == SpecDecodeCounters(10.0, 30.0, 12.0, ())
    assert snapshot.generation_tokens == 40.0
    assert snapshot.histograms == {}


def test_engines_are_summed() -> None:
    other = EngineCounters(
        engine="1",
        drafts=50.0,
        draft_tokens=150.0,
        accepted=30.0,
        per_position=(20.0, 8.0, 2.0),
        generation_tokens=100.0,
        tpot_sum=1.0,
        tpot_count=10.0,
    )
    snapshot = parse_metrics(render_metrics([BEFORE, other]))
    assert snapshot.spec == SpecDecodeCounters(150.0, 450.0, 180.0, (100.0, 58.0, 22.0))
    assert snapshot.generation_tokens == 1100.0
    assert snapshot.histograms[TIME_PER_OUTPUT_TOKEN] == HistogramTotals(sum=3.0, count=110.0)


def test_model_name_filter_keeps_only_that_model() -> None:
    other_model = EngineCounters(
        engine="0",
        model="Qwen/Qwen2.5-7B",
        drafts=7.0,
        draft_tokens=21.0,
        accepted=5.0,
        per_position=(3.0, 2.0, 0.0),
        generation_tokens=99.0,
    )
    text = render_metrics([BEFORE, other_model])
    assert parse_metrics(text).spec == SpecDecodeCounters(107.0, 321.0, 155.0, (83.0, 52.0, 20.0))
    assert parse_metrics(text, model_name=MODEL).spec == SpecDecodeCounters(
        100.0, 300.0, 150.0, (80.0, 50.0, 20.0)
    )
    assert parse_metrics(text, model_name="Qwen/Qwen2.5-7B").generation_tokens == 99.0


def test_unknown_model_name_lists_the_models_seen() -> None:
    with pytest.raises(MetricsError) as error:
        parse_metrics(render_metrics([BEFORE]), source="http://gpu1:8000/metrics", model_name="mistral")
    message = str(error.value)
    assert "http://gpu1:8000/metrics" in message
    assert "'mistral'" in message
    assert repr(MODEL) in message


def test_without_speculation_spec_is_none() -> None:
    before = parse_metrics(render_metrics([BEFORE], speculation=False))
    after = parse_metrics(render_metrics([AFTER], speculation=False))
    assert before.spec is None
    delta = metrics_delta(before, after, label="mode none, class chat")
    assert delta.spec is None
    assert AcceptanceStats.from_delta(delta) is None
    assert delta.generation_tokens == 900.0


def test_counter_going_down_means_restart() -> None:
    before = parse_metrics(render_metrics([AFTER]))
    after = parse_metrics(render_metrics([BEFORE]))
    with pytest.raises(
        MetricsError,
        match=r"went down from .* the server restarted during the window \(mode ngram, class coding\)",
    ):
        metrics_delta(before, after, label="mode ngram, class coding")


def test_speculation_appearing_or_vanishing_is_an_error() -> None:
    with_spec = parse_metrics(render_metrics([BEFORE]))
    without = parse_metrics(render_metrics([AFTER], speculation=False))
    with pytest.raises(MetricsError, match=r"present before the window but are missing after it.*\(w1\)"):
        metrics_delta(with_spec, without, label="w1")
    with pytest.raises(MetricsError, match=r"missing before the window but are present after it.*\(w2\)"):
        metrics_delta(without, parse_metrics(render_metrics([AFTER])), label="w2")


def test_no_drafts_in_window_is_an_error() -> None:
    snapshot = parse_metrics(render_metrics([BEFORE]))
    delta = metrics_delta(snapshot, snapshot, label="mode eagle, class chat")
    with pytest.raises(
        MetricsError,
        match=r"speculation is on but no drafts were made in the window \(mode eagle, class chat\)",
    ):
        AcceptanceStats.from_delta(delta)


@pytest.mark.parametrize(
    "text",
    [
        'vllm:generation_tokens_total{engine="0" 12\n',
        "vllm:generation_tokens_total{engine=0} 12\n",
        "vllm:generation_tokens_total twelve\n",
    ],
)
def test_malformed_text_names_the_source(text: str) -> None:
    with pytest.raises(MetricsError, match=r"^http://gpu1:8000/metrics: cannot parse Prometheus text: \S"):
        parse_metrics(text, source="http://gpu1:8000/metrics")


@pytest.mark.parametrize("text", ["<html><body>502 Bad Gateway</body></html>\n", "twelve\n"])
def test_a_page_that_is_not_prometheus_text_is_still_refused(text: str) -> None:
    with pytest.raises(MetricsError, match=r"^http://gpu1:8000/metrics: cannot parse Prometheus text"):
        parse_metrics(text, source="http://gpu1:8000/metrics")


def test_a_malformed_line_of_a_series_specgate_ignores_is_ignored() -> None:
    text = 'vllm:num_requests_running{engine="0" 3\nvllm:generation_tokens_total{engine="0"} 12\n'
    assert parse_metrics(text).generation_tokens == 12


@pytest.mark.parametrize("path", sorted(RECORDED.glob("*/*-metrics-*.txt.gz")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_reading_only_the_wanted_lines_reads_what_the_whole_scrape_says(path, monkeypatch) -> None:
    text = gzip.decompress(path.read_bytes()).decode()
    assert len(metrics._wanted_lines(text)) < len(text) / 3  # a real scrape is mostly what specgate ignores
    snapshot = parse_metrics(text)
    monkeypatch.setattr(metrics, "_wanted_lines", lambda whole: whole)
    assert parse_metrics(text) == snapshot


def test_per_position_gap_is_an_error() -> None:
    text = (
        "\n".join(
            [
                'vllm:spec_decode_num_drafts_total{engine="0"} 10',
                'vllm:spec_decode_num_draft_tokens_total{engine="0"} 30',
                'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 12',
                'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 8',
                'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="2"} 4',
            ]
        )
        + "\n"
    )
    with pytest.raises(MetricsError, match=r"positions are \[0, 2\]"):
        parse_metrics(text)


def test_decode_rate_prefers_per_request_histogram() -> None:
    delta = metrics_delta(
        parse_metrics(render_metrics([BEFORE])), parse_metrics(render_metrics([AFTER])), label="w"
    )
    rate = server_decode_tokens_per_s(delta)
    assert rate is not None
    assert rate.source == TIME_PER_OUTPUT_TOKEN
    assert rate.value == pytest.approx(200 / 4.0)  # 1 / (4.0 s / 200 tokens)

    per_request = MetricsDelta(
        label="w",
        spec=None,
        generation_tokens=None,
        histograms={**delta.histograms, REQUEST_TIME_PER_OUTPUT_TOKEN: HistogramTotals(sum=0.5, count=20.0)},
    )
    rate = server_decode_tokens_per_s(per_request)
    assert rate is not None and rate.source == REQUEST_TIME_PER_OUTPUT_TOKEN
    assert rate.value == pytest.approx(40.0)

    assert (
        server_decode_tokens_per_s(MetricsDelta(label="w", spec=None, generation_tokens=None, histograms={}))
        is None
    )


def test_acceptance_stats_round_trip_through_json() -> None:
    stats = AcceptanceStats(
        drafts=200.0, draft_tokens=600.0, accepted_tokens=300.0, accepted_per_position=(160.0, 0.0, 0.0)
    )
    assert stats.conditional_rates == (0.8, 0.0, None)
    data = json.loads(json.dumps(stats.to_dict(), allow_nan=False))
    assert data["mean_acceptance_length"] == pytest.approx(2.5)
    assert AcceptanceStats.from_dict(data) == stats
    with pytest.raises(ValueError, match="'drafts' must be a number"):
        AcceptanceStats.from_dict({"draft_tokens": 1, "accepted_tokens": 1})


counts = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)


@given(
    before=st.tuples(counts, counts, counts, st.lists(counts, min_size=1, max_size=5)),
    increments=st.tuples(
        st.floats(min_value=1, max_value=1e9),
        st.floats(min_value=1, max_value=1e9),
        st.floats(min_value=0, max_value=1),
        st.lists(counts, min_size=5, max_size=5),
    ),
)
def test_delta_is_the_difference_and_ratios_stay_in_range(
    before: tuple[float, float, float, list[float]],
    increments: tuple[float, float, float, list[float]],
) -> None:
    drafts, draft_tokens, accepted, per_position = before
    add_drafts, add_draft_tokens, accepted_share, add_per_position = increments
    # accepted_share <= 1 keeps accepted tokens <= draft tokens, as vLLM's do.
    add_accepted = add_draft_tokens * accepted_share
    start = EngineCounters(
        engine="0",
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted=accepted,
        per_position=tuple(per_position),
    )
    end = EngineCounters(
        engine="0",
        drafts=drafts + add_drafts,
        draft_tokens=draft_tokens + add_draft_tokens,
        accepted=accepted + add_accepted,
        per_position=tuple(
            p + a for p, a in zip(per_position, add_per_position[: len(per_position)], strict=True)
        ),
    )
    # Through the text and back: repr() of a float round-trips exactly.
    delta = metrics_delta(
        parse_metrics(render_metrics([start])), parse_metrics(render_metrics([end])), label="property"
    )
    assert delta.spec is not None
    assert delta.spec.num_drafts == end.drafts - start.drafts
    assert delta.spec.num_draft_tokens == end.draft_tokens - start.draft_tokens
    assert delta.spec.num_accepted_tokens == end.accepted - start.accepted
    assert delta.spec.accepted_per_position == tuple(
        a - b for a, b in zip(end.per_position, start.per_position, strict=True)
    )
    stats = AcceptanceStats.from_delta(delta)
    assert stats is not None
    # The ratios come from the window's own counters, not from the cumulative ones.
    spec = delta.spec
    assert stats.mean_acceptance_length == 1.0 + spec.num_accepted_tokens / spec.num_drafts
    assert stats.acceptance_rate == spec.num_accepted_tokens / spec.num_draft_tokens
