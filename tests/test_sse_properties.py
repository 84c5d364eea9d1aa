"""Hypothesis properties of stream decoding: read boundaries must never change what is read.

A network read can end anywhere: inside "\\r\\n", inside a UTF-8 character,
inside "data:", inside an HTTP chunk-size line. The decoders and the client
must give the same events, text and token count however the bytes are cut.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specgate.client import ChunkedDecoder, GenerationRequest, SSEDecoder, StreamingClient

pytestmark = pytest.mark.fast

# Any text except CR: a lone CR ends an SSE line, so no SSE stream can carry one
# inside a payload (LF is fine: it becomes several data lines, joined again).
# The characters that break naive decoders are drawn often on purpose: LF
# (multi-line data), space (the one optional space after "data:"), colon, and
# multibyte UTF-8 (cuts inside a character).
tricky_characters = st.sampled_from(["\n", " ", ":", "é", "€", "😀"])
payload_text = st.text(
    st.one_of(tricky_characters, st.characters(codec="utf-8", exclude_characters="\r")), max_size=40
)
# Lines the decoder must skip: comments and fields other than data.
noise_line = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=20).map(lambda s: ":" + s),
    st.sampled_from(["event: message", "id: 7", "retry: 1000", "event:", ":"]),
)
line_ending = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def sse_streams(draw: st.DrawFn) -> tuple[bytes, list[str], bool]:
    """An encoded stream, its payloads, and whether its last blank line is missing."""
    payloads = draw(st.lists(payload_text, max_size=8))
    if draw(st.booleans()):
        payloads.append("[DONE]")
    eol = draw(line_ending)
    unterminated = bool(payloads) and draw(st.booleans())
    lines: list[str] = []
    for index, payload in enumerate(payloads):
        event_lines = [f"data: {part}" for part in payload.split("\n")]
        for _ in range(draw(st.integers(0, 2))):  # noise anywhere inside the event
            event_lines.insert(draw(st.integers(0, len(event_lines))), draw(noise_line))
        lines += event_lines
        lines.append("")  # the blank line that ends the event
        is_last = index == len(payloads) - 1
        if not (is_last and unterminated) and draw(st.booleans()):
            lines += [draw(noise_line), ""]  # a ping between events
    if unterminated:
        lines.pop()  # drop the final blank line: only close() can deliver that event
    text = "".join(line + eol for line in lines)
    if unterminated and draw(st.booleans()):
        text = text[: -len(eol)]  # nor even the final line end
    return text.encode("utf-8"), payloads, unterminated


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(cut, len(data)) for cut in cuts})
    return [data[start:end] for start, end in zip([0, *points], [*points, len(data)], strict=True)]


@settings(max_examples=200, deadline=None)
@given(stream=sse_streams(), cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=12))
def test_any_chunking_yields_exactly_the_payloads_in_order(
    stream: tuple[bytes, list[str], bool], cuts: list[int]
) -> None:
    data, payloads, unterminated = stream
    decoder = SSEDecoder()
    events: list[str] = []
    for chunk in split_at(data, cuts):
        events += decoder.feed(chunk)
    complete_before_close = list(events)
    events += decoder.close()
    assert events == payloads
    if unterminated:
        assert complete_before_close == payloads[:-1]


@settings(max_examples=100, deadline=None)
@given(stream=sse_streams())
def test_byte_at_a_time_equals_all_at_once(stream: tuple[bytes, list[str], bool]) -> None:
    data, payloads, _ = stream
    whole = SSEDecoder()
    trickle = SSEDecoder()
    by_byte: list[str] = []
    for index in range(len(data)):
        by_byte += trickle.feed(data[index : index + 1])
    assert by_byte + trickle.close() == whole.feed(data) + whole.close() == payloads


def test_done_passes_through_like_any_payload() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: [DONE]\n\n") == ["[DONE]"]
    assert decoder.feed(b"data:[DONE]\r\n\r\n") == ["[DONE]"]


# ------------------------------------------------------------------ HTTP chunked framing


@st.composite
def chunked_bodies(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A chunked HTTP body (sizes in either case, optional extensions and trailers) and its payload."""
    pieces = draw(st.lists(st.binary(min_size=1, max_size=300), max_size=8))
    wire = []
    for piece in pieces:
        size = f"{len(piece):x}"
        size = size.upper() if draw(st.booleans()) else size
        extension = draw(st.sampled_from(["", ";name=value", ";x"]))
        wire.append(f"{size}{extension}\r\n".encode() + piece + b"\r\n")
    wire.append(b"0\r\n")
    wire += [b"X-Trailer: 1\r\n"] * draw(st.integers(0, 2))
    wire.append(b"\r\n")
    return b"".join(wire), b"".join(pieces)


@settings(max_examples=200, deadline=None)
@given(body=chunked_bodies(), cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=12))
def test_chunked_decoder_gives_the_payload_whatever_the_cuts(
    body: tuple[bytes, bytes], cuts: list[int]
) -> None:
    wire, payload = body
    decoder = ChunkedDecoder()
    parts = split_at(wire, cuts)
    out = b"".join(decoder.feed(part) for part in parts)
    assert out == payload
    assert decoder.finished
    # Not finished a byte too early: without its last byte the body is incomplete.
    early = ChunkedDecoder()
    early.feed(wire[:-1])
    assert not early.finished


@settings(max_examples=50, deadline=None)
@given(body=chunked_bodies())
def test_chunked_decoder_byte_at_a_time(body: tuple[bytes, bytes]) -> None:
    wire, payload = body
    decoder = ChunkedDecoder()
    assert b"".join(decoder.feed(wire[index : index + 1]) for index in range(len(wire))) == payload
    assert decoder.finished


# ------------------------------------------------------------------ full client


@st.composite
def generated_streams(draw: st.DrawFn) -> tuple[bytes, list[str], int]:
    """A vLLM-like chat stream: text chunks, a usage chunk claiming N tokens, [DONE]."""
    pieces = draw(st.lists(st.text(st.characters(codec="utf-8"), max_size=12), max_size=10))
    completion_tokens = draw(st.integers(min_value=0, max_value=10_000))
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    events = [
        {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]} for piece in pieces
    ]
    events.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": completion_tokens}})
    # ensure_ascii=False puts raw multibyte UTF-8 on the wire, so cuts can land inside it.
    lines = [f"data: {json.dumps(event, ensure_ascii=False)}{eol}{eol}" for event in events]
    lines.append(f"data: [DONE]{eol}{eol}")
    return "".join(lines).encode("utf-8"), pieces, completion_tokens


async def replay(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


@settings(max_examples=100, deadline=None)
@given(stream=generated_streams(), cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=12))
def test_client_reads_text_and_usage_whatever_the_chunking(
    stream: tuple[bytes, list[str], int], cuts: list[int]
) -> None:
    data, pieces, completion_tokens = stream
    chunks = split_at(data, cuts)

    async def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=replay(chunks))

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
