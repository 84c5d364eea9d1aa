"""Hypothesis properties of stream reading: read boundaries must never change what is read.

A network read can end anywhere: inside "\\r\\n", inside a UTF-8 character,
inside "data:". The client must give the same text and token count however
the bytes are cut, whatever line ends the server uses, with comments and
other SSE fields between the events, and with events split over several
data lines.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specgate.measure.client import GenerationRequest, StreamingClient

pytestmark = pytest.mark.fast

# Drawn often on purpose: multibyte UTF-8 (cuts inside a character) and the characters
# str.splitlines takes for line ends but SSE does not (vLLM's JSON carries them raw).
tricky_characters = st.sampled_from(["é", "€", "😀", "\u2028", "\u2029", "\x85", "\n", ":"])
piece_text = st.text(st.one_of(tricky_characters, st.characters(codec="utf-8")), max_size=12)
# Lines the client must skip: comments and fields other than data.
noise_line = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=20).map(lambda s: ":" + s),
    st.sampled_from(["event: message", "id: 7", "retry: 1000", ":"]),
)


@st.composite
def generated_streams(draw: st.DrawFn) -> tuple[bytes, list[str], int]:
    """A vLLM-like chat stream: text chunks, a usage chunk claiming N tokens, [DONE]."""
    pieces = draw(st.lists(piece_text, max_size=10))
    completion_tokens = draw(st.integers(min_value=0, max_value=10_000))
    eol = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    events = [
        {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]} for piece in pieces
    ]
    events.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": completion_tokens}})
    lines: list[str] = []
    for event in events:
        # ensure_ascii=False puts raw multibyte UTF-8 on the wire, so cuts can land inside it;
        # indent spreads one event over several data lines, which SSE joins with LF.
        text = json.dumps(event, ensure_ascii=False, indent=1 if draw(st.booleans()) else None)
        event_lines = [f"data: {part}" for part in text.split("\n")]
        for _ in range(draw(st.integers(0, 2))):  # noise anywhere inside the event
            event_lines.insert(draw(st.integers(0, len(event_lines))), draw(noise_line))
        lines += [*event_lines, ""]
    lines += ["data: [DONE]", ""]
    return "".join(line + eol for line in lines).encode("utf-8"), pieces, completion_tokens


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(cut, len(data)) for cut in cuts})
    return [data[start:end] for start, end in zip([0, *points], [*points, len(data)], strict=True)]


async def replay(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


@given(
    stream=generated_streams(),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=12),
    byte_at_a_time=st.booleans(),
)
def test_client_reads_text_and_usage_whatever_the_chunking(
    stream: tuple[bytes, list[str], int], cuts: list[int], byte_at_a_time: bool
) -> None:
    data, pieces, completion_tokens = stream
    chunks = [data[i : i + 1] for i in range(len(data))] if byte_at_a_time else split_at(data, cuts)

    async def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=replay(chunks))

    request = GenerationRequest(
        request_id="prop#0",
        mode="ngram",
        prompt_class="c",
        prompt_id="p",
        model="m",
        max_tokens=8,
        messages=[{"role": "user", "content": "hi"}],
    )

    async def main() -> None:
        async with StreamingClient("http://vllm.test", transport=httpx.MockTransport(handle)) as client:
            record = await client.generate(request)
        assert record.completion_tokens == completion_tokens
        assert record.text == "".join(pieces)
        assert len(record.chunk_times) == sum(1 for piece in pieces if piece)

    asyncio.run(main())
