"""How fast specgate's StreamingClient reads SSE streams, against plain aiohttp readers.

A measuring client must not be the bottleneck, nor delay the timestamps it
takes. The rule: at the highest rate a real lab server produces (SmolLM2-135M
on an H200 with CUDA graphs, no speculation: up to ~590 tok/s single stream,
one token per event, ~1.7 ms apart; docs/journal/lab and ../shared/gpu-lab/README.md),
the timing error stays under 1 % of the inter-token interval. Results and
their reading: docs/client-benchmark.md.

The server (benchmarks/sse_server.py) runs in a separate process so that the
client does not share its event loop or core. Its send stamps and the clients'
receive stamps are both ``time.perf_counter()``; comparing them across
processes assumes Linux, where perf_counter reads CLOCK_MONOTONIC, one clock
for the whole machine. Skews are only meaningful on such a system.

Readers: ``specgate`` (StreamingClient via run_requests, on its default
transport: httpx over aiohttp), ``specgate-httpcore`` (the same client on
httpx's default transport, httpcore/h11: the client before issue 16's switch),
``aiohttp`` (a plain reader: ``response.content.iter_any()``, split on
b"\\n\\n", strip "data: ", json.loads; one timestamp per read, like specgate),
and ``vllm-bench`` (vLLM's own ``async_request_openai_chat_completions``;
skipped where vllm is not installed).

Needs only pytest, pytest-benchmark, httpx, httpx-sse, httpx-aiohttp and
aiohttp besides this checkout (no numpy, no specgate install): the command
for a bare host is in docs/client-benchmark.md ("Reproduce").
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from specgate.measure.client import GenerationRequest, StreamingClient, run_requests

pytestmark = pytest.mark.bench

SERVER_SCRIPT = Path(__file__).with_name("sse_server.py")
# The fastest lab server: ~590 tok/s single stream, one token per event (see the module docstring).
FASTEST_LAB_INTERVAL_S = 0.0017


@dataclass(frozen=True)
class Scenario:
    name: str
    streams: int  # concurrent requests
    events: int  # content chunks per request
    interval_s: float  # pause before each chunk; 0 = the whole stream in one server write

    @property
    def total_events(self) -> int:
        return self.streams * self.events


SCENARIOS = [
    # Parse capacity: the server writes each whole stream at once, so the client
    # alone sets the pace. Skew here is backlog (how far parsing lags), not latency.
    Scenario("burst-1x2000", streams=1, events=2000, interval_s=0.0),
    Scenario("burst-64x250", streams=64, events=250, interval_s=0.0),
    # Timing skew floor: one stream at 10 ms per token; nothing queues in the client.
    Scenario("paced-1x100@10ms", streams=1, events=100, interval_s=0.010),
    # The capacity rule: one stream at the fastest lab server's rate.
    Scenario("paced-1x300@1.7ms", streams=1, events=300, interval_s=FASTEST_LAB_INTERVAL_S),
    # Timing skew under a realistic load: 32 streams at 10 ms per token, 3200
    # events/s, one small read per event. The streams start together and tick
    # together, as a batch does in vLLM (one engine step yields a token for every
    # running request), so each tick the client has 32 reads to take in at once.
    Scenario("paced-32x100@10ms", streams=32, events=100, interval_s=0.010),
    # The upper bound of a lab server: 32 streams, each at the fastest single-stream
    # rate (18 800 events/s asked; a real engine's step grows with the batch, so a
    # real server sends less). The Python test server itself delivers ~10 000 events/s
    # on a 2-vCPU VM; "offered" events/s in the results says what was sent.
    Scenario("paced-32x300@1.7ms", streams=32, events=300, interval_s=FASTEST_LAB_INTERVAL_S),
]


@dataclass
class RoundResult:
    wall_s: float
    streams: list[tuple[list[float], list[float]]]  # per stream: server send times, client receive times
    cpu_s: float = 0.0  # CPU time the client process used in the round


def process_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# A reader runs one round of a scenario against the server and returns what it saw.
Reader = Callable[[str, Scenario], Awaitable[RoundResult]]


# ------------------------------------------------------------------ server


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, str(SERVER_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        if not line.startswith("listening on "):
            raise RuntimeError(f"benchmark SSE server did not start: {line!r}")
        yield line.removeprefix("listening on ").strip()
    finally:
        process.stdin.close()  # type: ignore[union-attr]  # the server exits on EOF
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# ------------------------------------------------------------------ readers


def stamps_from_text(text: str) -> list[float]:
    """The server writes each chunk's send time as its text, "<t>;"."""
    return [float(stamp) for stamp in text.split(";")[:-1]]


class SpecgateReader:
    def __init__(self, transport: Callable[[], httpx.AsyncBaseTransport] | None = None) -> None:
        self.client: StreamingClient | None = None
        self.transport = transport

    async def __call__(self, base_url: str, scenario: Scenario) -> RoundResult:
        if self.client is None:
            self.client = StreamingClient(base_url, transport=self.transport and self.transport())
        requests = [
            GenerationRequest(
                request_id=f"bench#{index}",
                mode="bench",
                prompt_class="bench",
                prompt_id="bench",
                model="bench",
                max_tokens=scenario.events,
                messages=[{"role": "user", "content": "bench"}],
                extra_body={"sse_interval_s": scenario.interval_s},
            )
            for index in range(scenario.streams)
        ]
        started = time.perf_counter()
        records = await run_requests(self.client, requests, concurrency=scenario.streams)
        wall_s = time.perf_counter() - started
        assert all(record.completion_tokens == scenario.events for record in records)
        return RoundResult(
            wall_s, [(stamps_from_text(record.text), record.chunk_times) for record in records]
        )

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()


class AiohttpReader:
    """A lean aiohttp reader: what a hand-written benchmark client would do."""

    def __init__(self) -> None:
        self.session: Any = None

    async def read_stream(self, url: str, body: dict[str, Any]) -> tuple[list[float], list[float]]:
        sent: list[float] = []
        received: list[float] = []
        async with self.session.post(url, json=body) as response:
            assert response.status == 200
            pending = b""
            async for raw in response.content.iter_any():
                received_at = time.perf_counter()
                *messages, pending = (pending + raw).split(b"\n\n")
                for message in messages:
                    if not message.startswith(b"data: ") or message == b"data: [DONE]":
                        continue
                    event = json.loads(message[6:])
                    if event["choices"]:
                        sent.append(event["t"])
                        received.append(received_at)
        return sent, received

    async def __call__(self, base_url: str, scenario: Scenario) -> RoundResult:
        if self.session is None:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        body = {
            "model": "bench",
            "messages": [{"role": "user", "content": "bench"}],
            "max_tokens": scenario.events,
            "stream": True,
            "stream_options": {"include_usage": True},
            "sse_interval_s": scenario.interval_s,
        }
        url = f"{base_url}/v1/chat/completions"
        started = time.perf_counter()
        streams = await asyncio.gather(*(self.read_stream(url, body) for _ in range(scenario.streams)))
        wall_s = time.perf_counter() - started
        return RoundResult(wall_s, list(streams))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


class VllmBenchReader(AiohttpReader):
    """vLLM's own request function, as ``vllm bench serve`` calls it."""

    def __init__(self) -> None:
        super().__init__()
        self.request_func = pytest.importorskip("vllm.benchmarks.lib.endpoint_request_func")

    async def read_stream(self, url: str, body: dict[str, Any]) -> tuple[list[float], list[float]]:
        func_input = self.request_func.RequestFuncInput(
            prompt="bench",
            api_url=url,
            prompt_len=1,
            output_len=body["max_tokens"],
            model="bench",
            extra_body={"sse_interval_s": body["sse_interval_s"]},
        )
        output = await self.request_func.async_request_openai_chat_completions(func_input, self.session)
        assert output.success, output.error
        # It keeps TTFT and inter-token latencies; rebuild the absolute times.
        received = list(itertools.accumulate([output.start_time + output.ttft, *output.itl]))
        return stamps_from_text(output.generated_text), received


def httpcore_transport() -> httpx.AsyncBaseTransport:
    """httpx's default transport, set up as specgate's client set it up before issue 16's switch."""
    return httpx.AsyncHTTPTransport(
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None), retries=0
    )


READERS: dict[str, Callable[[], Any]] = {
    "specgate": SpecgateReader,
    "specgate-httpcore": lambda: SpecgateReader(httpcore_transport),
    "aiohttp": AiohttpReader,
    "vllm-bench": VllmBenchReader,
}


# ------------------------------------------------------------------ benchmark


def percentile(values: list[float], pct: float) -> float:
    """Linear-interpolated percentile, as numpy.percentile's default computes it."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def pct_of_interval(ms: float, scenario: Scenario) -> float | None:
    """``ms`` as a share of the scenario's inter-token interval (None for bursts, which have none)."""
    return round(ms / (scenario.interval_s * 1e3) * 100, 2) if scenario.interval_s else None


# Scenario-major order: the readers of one scenario run back to back, so that
# drifting load on a shared machine skews their comparison as little as possible.
@pytest.mark.parametrize(
    ("scenario", "reader_name"),
    [
        pytest.param(scenario, name, id=f"{scenario.name}-{name}")
        for scenario in SCENARIOS
        for name in READERS
    ],
)
def test_client_stream_capacity_and_skew(
    benchmark: Any, server_url: str, reader_name: str, scenario: Scenario
) -> None:
    reader = READERS[reader_name]()
    loop = asyncio.new_event_loop()  # one loop for all rounds: connection setup stays out of the timing
    rounds: list[RoundResult] = []
    # Bursts are short, and the first few in a process run slow (allocator
    # growth, interpreter specialisation): warm up more where it costs little.
    warmup_rounds = 1 if scenario.interval_s else 3

    def one_round() -> None:
        cpu_before = process_cpu_s()
        result = loop.run_until_complete(reader(server_url, scenario))
        result.cpu_s = process_cpu_s() - cpu_before
        rounds.append(result)

    try:
        benchmark.group = scenario.name
        benchmark.pedantic(one_round, rounds=5, iterations=1, warmup_rounds=warmup_rounds)
    finally:
        loop.run_until_complete(reader.close())
        loop.close()

    measured = rounds[warmup_rounds:]
    skew_ms: list[float] = []
    itl_error_ms: list[float] = []
    tpot_error_pct: list[float] = []
    for result in measured:
        assert len(result.streams) == scenario.streams
        for sent, received in result.streams:
            assert len(sent) == len(received) == scenario.events
            skew = [(got - put) * 1e3 for put, got in zip(sent, received, strict=True)]
            skew_ms += skew
            # How far each measured inter-token interval is off the true one: a
            # constant skew cancels out here, only its jitter remains.
            itl_error_ms += [abs(later - earlier) for earlier, later in itertools.pairwise(skew)]
            # The inter-token interval the gates use: a stream's time per output token,
            # (last - first arrival) / (events - 1), as decode tok/s is computed from it
            # (specgate.measure.client.RequestRecord). Its error, as a share of the true interval.
            if scenario.interval_s and len(sent) > 1:
                tpot_error_pct.append(abs((received[-1] - received[0]) / (sent[-1] - sent[0]) - 1) * 100)
    events_per_s = [scenario.total_events / result.wall_s for result in measured]
    # CPU time per event barely moves when other processes compete for the
    # cores, unlike wall-clock rates; 1e6 / it is the rate one core could parse.
    cpu_us_per_event = [result.cpu_s / scenario.total_events * 1e6 for result in measured]
    skew_median = statistics.median(skew_ms)
    skew_p99 = percentile(skew_ms, 99)
    itl_error_median = statistics.median(itl_error_ms)
    benchmark.extra_info.update(
        {
            "reader": reader_name,
            "scenario": scenario.name,
            "events_per_round": scenario.total_events,
            "events_per_s_median": round(statistics.median(events_per_s)),
            "events_per_s_best": round(max(events_per_s)),
            "cpu_us_per_event_median": round(statistics.median(cpu_us_per_event), 2),
            "skew_ms_median": round(skew_median, 4),
            "skew_ms_p99": round(skew_p99, 4),
            "skew_ms_min": round(min(skew_ms), 4),
            "skew_median_pct_of_interval": pct_of_interval(skew_median, scenario),
            "skew_p99_pct_of_interval": pct_of_interval(skew_p99, scenario),
            "itl_error_median_pct_of_interval": pct_of_interval(itl_error_median, scenario),
            "itl_error_ms_median": round(itl_error_median, 4),
            "itl_error_ms_p99": round(percentile(itl_error_ms, 99), 4),
            # the 1 % rule on the interval the gates measure (paced scenarios only)
            "tpot_error_pct_median": round(statistics.median(tpot_error_pct), 4) if tpot_error_pct else None,
            "tpot_error_pct_max": round(max(tpot_error_pct), 4) if tpot_error_pct else None,
            "streams_measured": len(tpot_error_pct),
            # The machine's state, so that a table can say how loaded it was.
            "load_average_1m": round(os.getloadavg()[0], 2),
            "cpu_count": os.cpu_count(),
            "versions": {
                "python": platform.python_version(),
                "httpx": httpx.__version__,
                "aiohttp": aiohttp.__version__,
            },
        }
    )
