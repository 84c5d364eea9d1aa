"""Replay real vLLM responses recorded from real servers (``python -m specgate_lab record``) through
the client and the metrics parser: what vLLM really sends, with no server and no network."""

import asyncio
import gzip
import json
from pathlib import Path

import httpx
import pytest

from specgate.measure.client import GenerationRequest, StreamingClient
from specgate.measure.metrics import AcceptanceStats, metrics_delta, parse_metrics

pytestmark = pytest.mark.fast

RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "recorded"
STREAMS = sorted(RECORDED.glob("*/*-stream.sse"))
WINDOWS = sorted(RECORDED.glob("*/*-metrics-before.txt.gz"))


def _text(path: Path) -> str:
    """A recorded /metrics page (kept gzipped: specgate.measure.record)."""
    return gzip.decompress(path.read_bytes()).decode()


def _usage_in(raw: bytes) -> dict:
    """The oracle, independent of the client's decoder: the last data line that carries usage."""
    lines = [line[len(b"data: "):] for line in raw.splitlines() if line.startswith(b"data: {")]
    return [json.loads(line) for line in lines if b'"usage"' in line and b'"choices":[]' in line][-1]["usage"]


def _replay(raw: bytes, api: str):
    async def body():
        # As the server's socket delivers it: in pieces, here one SSE event at a time.
        for event in raw.split(b"\n\n"):
            if event:
                yield event + b"\n\n"

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    transport = httpx.MockTransport(handler)
    request = GenerationRequest(
        request_id=f"replay/{api}", mode="replay", prompt_class="recorded", prompt_id="p", model="m",
        max_tokens=64, **({"messages": [{"role": "user", "content": "x"}]} if api == "chat" else {"prompt": "x"}))

    async def go():
        async with StreamingClient("http://recorded.invalid", transport=transport) as client:
            return await client.generate(request)

    return asyncio.run(go())


def _window_acceptance(folder: Path, mode: str) -> AcceptanceStats | None:
    before = folder / f"{mode}-metrics-before.txt.gz"
    after = folder / f"{mode}-metrics-after.txt.gz"
    if not (before.exists() and after.exists()):
        return None
    delta = metrics_delta(parse_metrics(_text(before), source=str(before)),
                          parse_metrics(_text(after), source=str(after)), label=f"recorded {mode}")
    return AcceptanceStats.from_delta(delta)


def test_recordings_exist():
    assert STREAMS and WINDOWS, f"no recorded vLLM responses under {RECORDED}; run: python -m specgate_lab record"


@pytest.mark.parametrize("path", STREAMS, ids=[f"{p.parent.name}/{p.name}" for p in STREAMS])
def test_recorded_stream_replays_with_usage_token_counts(path):
    raw = path.read_bytes()
    api = "chat" if "-chat-" in path.name else "completions"

    record = _replay(raw, api)

    usage = _usage_in(raw)
    assert record.completion_tokens == usage["completion_tokens"]
    assert record.prompt_tokens == usage["prompt_tokens"]
    assert record.text.strip()
    assert 1 <= len(record.chunk_times) <= record.completion_tokens
    acceptance = _window_acceptance(path.parent, path.name.rsplit("-", 2)[0])
    if acceptance is not None and acceptance.mean_acceptance_length >= 2.0:
        # The server accepted 1+ drafted tokens per step on average in this window, so chunks carry
        # several tokens: counting chunks would undercount.
        assert len(record.chunk_times) < record.completion_tokens


@pytest.mark.parametrize("before_path", WINDOWS, ids=[f"{p.parent.name}/{p.name}" for p in WINDOWS])
def test_recorded_metrics_window(before_path):
    after_path = before_path.with_name(before_path.name.replace("-before", "-after"))
    mode = before_path.name.split("-metrics-")[0]
    before = parse_metrics(_text(before_path), source=str(before_path))
    after = parse_metrics(_text(after_path), source=str(after_path))

    delta = metrics_delta(before, after, label=f"recorded {mode}")
    acceptance = AcceptanceStats.from_delta(delta)

    streams = sorted(before_path.parent.glob(f"{mode}-*-stream.sse"))
    if streams:  # the window held exactly the recorded requests: the server counted their tokens
        assert delta.generation_tokens == sum(_usage_in(p.read_bytes())["completion_tokens"] for p in streams)
    if mode == "no_spec":
        assert acceptance is None
    else:
        assert acceptance is not None
        k = acceptance.num_speculative_tokens
        assert 1.0 <= acceptance.mean_acceptance_length <= 1 + k
        # vLLM accepts a drafted token only after every earlier one of its draft, and a draft proposes
        # at most k tokens: counters parsed into the wrong fields or positions break one of these.
        per_position = list(acceptance.accepted_per_position)
        assert per_position == sorted(per_position, reverse=True) and per_position[0] <= acceptance.drafts
        assert acceptance.draft_tokens <= acceptance.drafts * k
        assert sum(acceptance.accepted_per_position) == pytest.approx(acceptance.accepted_tokens)
