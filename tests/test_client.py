"""Tests of specgate.measure.client: streams, records, failures.

Most run against httpx.MockTransport; the last section runs the client's own
transport (httpx over aiohttp) against an in-process loopback server. Either
way each test scripts the server's bytes (and pauses) so that a failure mode
can be produced on purpose and quickly.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import httpx
import pytest

from specgate.errors import RequestError
from specgate.measure.client import GenerationRequest, RequestRecord, StreamingClient, run_requests
from specgate.serve.http import auth_headers

pytestmark = pytest.mark.fast

BASE_URL = "http://vllm.test"
API_KEY = "sk-secret-0123456789abcdef"

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


# ------------------------------------------------------------------ helpers


def chat_request(request_id: str = "ngram/coding/bst#2", **overrides: Any) -> GenerationRequest:
    fields: dict[str, Any] = dict(
        request_id=request_id,
        mode="ngram",
        prompt_class="coding",
        prompt_id="bst",
        model="m",
        max_tokens=16,
        messages=[{"role": "user", "content": "write a BST"}],
    )
    fields.update(overrides)
    return GenerationRequest(**fields)


def completion_request(request_id: str = "eagle/prose/story#0") -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id,
        mode="eagle",
        prompt_class="prose",
        prompt_id="story",
        model="m",
        max_tokens=16,
        prompt="Once upon a time",
    )


def sse(*payloads: str | dict[str, Any]) -> bytes:
    """Encode payloads as vLLM does: one "data: ..." line and a blank line each."""
    out = []
    for payload in payloads:
        # Raw UTF-8 like vLLM (pydantic) sends, so multibyte characters reach the wire.
        text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
        out.append(f"data: {text}\n\n")
    return "".join(out).encode()


def chat_chunk(content: str | None = None, finish_reason: str | None = None, **delta: Any) -> dict[str, Any]:
    if content is not None:
        delta["content"] = content
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def text_chunk(text: str, finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "object": "text_completion",
        "choices": [{"index": 0, "text": text, "finish_reason": finish_reason}],
    }


def usage_chunk(completion_tokens: int, prompt_tokens: int = 7) -> dict[str, Any]:
    return {
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


async def paced(parts: Sequence[bytes | float]) -> AsyncIterator[bytes]:
    """Yield byte parts in order; a float part is a pause of that many seconds."""
    for part in parts:
        if isinstance(part, float):
            await asyncio.sleep(part)
        else:
            yield part


def event_stream(content: bytes | AsyncIterator[bytes], **headers: str) -> httpx.Response:
    """A 200 answer as vLLM gives it: ``content-type: text/event-stream``."""
    return httpx.Response(200, headers={"content-type": "text/event-stream", **headers}, content=content)


def streaming(*parts: bytes | float, status: int = 200) -> Handler:
    """A handler answering every request with the given (optionally paced) body."""

    async def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers={"content-type": "text/event-stream"}, content=paced(parts))

    return handle


def make_client(handler: Handler, **kwargs: Any) -> StreamingClient:
    return StreamingClient(BASE_URL, transport=httpx.MockTransport(handler), **kwargs)


def generate(handler: Handler, req: GenerationRequest | None = None, **kwargs: Any) -> RequestRecord:
    async def main() -> RequestRecord:
        async with make_client(handler, **kwargs) as client:
            return await client.generate(req or chat_request(), concurrency=3)

    return asyncio.run(main())


def generate_error(handler: Handler, req: GenerationRequest | None = None, **kwargs: Any) -> RequestError:
    with pytest.raises(RequestError) as info:
        generate(handler, req, **kwargs)
    message = str(info.value)
    req = req or chat_request()
    assert req.request_id in message and f"mode {req.mode}" in message, message
    return info.value


# ------------------------------------------------------------ requests


def test_request_body_for_chat_streams_with_usage_and_merges_extra_body() -> None:
    req = chat_request(seed=5, ignore_eos=True, extra_body={"top_p": 0.5, "temperature": 0.7})
    body = req.to_body()
    assert req.endpoint == "/v1/chat/completions"
    assert body["messages"] == [{"role": "user", "content": "write a BST"}]
    assert "prompt" not in body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["seed"] == 5 and body["ignore_eos"] is True and body["max_tokens"] == 16
    assert body["top_p"] == 0.5 and body["temperature"] == 0.7  # extra_body wins


def test_request_body_for_completions_omits_unset_seed_and_eos() -> None:
    req = chat_request("r", messages=None, prompt="hi", seed=None)
    body = req.to_body()
    assert req.endpoint == "/v1/completions"
    assert body["prompt"] == "hi" and "messages" not in body
    assert "seed" not in body and "ignore_eos" not in body


@pytest.mark.parametrize(
    "kwargs",
    [
        {"messages": None, "prompt": None},
        {"messages": [{"role": "user", "content": "a"}], "prompt": "b"},
        {"messages": [], "prompt": None, "max_tokens": 0},
        {"messages": [], "prompt": None, "extra_body": {"stream": False}},
    ],
)
def test_invalid_request_is_rejected_naming_it(kwargs: dict[str, Any]) -> None:
    base: dict[str, Any] = dict(
        request_id="bad#1", mode="m", prompt_class="c", prompt_id="p", model="x", max_tokens=4
    )
    base.update(kwargs)
    with pytest.raises(ValueError, match="bad#1"):
        GenerationRequest(**base)


# ------------------------------------------------------------ streams


def test_chat_stream_gives_text_tokens_times_and_finish_reason() -> None:
    seen: list[httpx.Request] = []
    body = sse(
        chat_chunk("", role="assistant"),  # vLLM's first chunk: role only, no text
        chat_chunk("Hello"),
        chat_chunk(" world", finish_reason="length"),
        usage_chunk(completion_tokens=2, prompt_tokens=11),
        "[DONE]",
    )

    async def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return event_stream(paced([body]))

    record = generate(handle)
    assert record.text == "Hello world"
    assert record.completion_tokens == 2 and record.prompt_tokens == 11
    assert record.finish_reason == "length"
    assert len(record.chunk_times) == 2  # the role-only chunk carried no text
    assert record.concurrency == 3
    assert (record.request_id, record.mode, record.prompt_class, record.prompt_id) == (
        "ngram/coding/bst#2",
        "ngram",
        "coding",
        "bst",
    )
    assert record.started_at <= record.first_token_at <= record.last_token_at <= record.finished_at  # type: ignore[operator]
    assert seen[0].url.path == "/v1/chat/completions"
    sent = json.loads(seen[0].content)
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


def test_completions_stream_reads_choice_text() -> None:
    body = sse(text_chunk("Once"), text_chunk(" more", finish_reason="stop"), usage_chunk(3), "[DONE]")
    seen: list[str] = []

    async def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return event_stream(paced([body]))

    record = generate(handle, completion_request())
    assert seen == ["/v1/completions"]
    assert record.text == "Once more" and record.completion_tokens == 3 and record.finish_reason == "stop"


def test_reasoning_content_counts_as_generated_text() -> None:
    body = sse(chat_chunk(reasoning_content="think"), chat_chunk("answer"), usage_chunk(2), "[DONE]")
    record = generate(streaming(body))
    assert record.text == "thinkanswer" and len(record.chunk_times) == 2


def test_multi_token_chunks_take_token_count_from_usage_not_chunk_count() -> None:
    # Speculative decoding: 4 chunks carrying 10 tokens between them.
    body = sse(
        chat_chunk("a"), chat_chunk("bcd"), chat_chunk("efg"), chat_chunk("hij"), usage_chunk(10), "[DONE]"
    )
    record = generate(streaming(body))
    assert record.completion_tokens == 10
    assert len(record.chunk_times) == 4
    assert record.text == "abcdefghij"


def test_with_continuous_usage_stats_the_final_usage_wins() -> None:
    # stream_options.continuous_usage_stats puts running usage on every chunk.
    first = {**chat_chunk("ab"), "usage": usage_chunk(2)["usage"]}
    second = {**chat_chunk("cde"), "usage": usage_chunk(5)["usage"]}
    record = generate(streaming(sse(first, second, usage_chunk(5, prompt_tokens=9), "[DONE]")))
    assert record.completion_tokens == 5 and record.prompt_tokens == 9 and record.text == "abcde"


def test_chunk_times_follow_the_server_pacing() -> None:
    pause = 0.05
    parts: list[bytes | float] = [
        sse(chat_chunk("a")),
        pause,
        sse(chat_chunk("bc")),
        pause,
        sse(chat_chunk("d")),
    ]
    parts.append(sse(usage_chunk(4), "[DONE]"))
    record = generate(streaming(*parts))
    gaps = record.inter_chunk_latencies_s
    assert len(gaps) == 2 and all(gap >= pause * 0.8 for gap in gaps)
    span = record.last_token_at - record.first_token_at  # type: ignore[operator]
    assert record.decode_tokens_per_s == pytest.approx(3 / span)
    assert record.tpot_s == pytest.approx(span / 3)


def test_stream_without_text_chunks_is_recorded_not_failed() -> None:
    record = generate(streaming(sse(chat_chunk("", role="assistant"), usage_chunk(5), "[DONE]")))
    assert record.completion_tokens == 5 and record.chunk_times == []
    assert record.first_token_at is None and record.ttft_s is None and record.decode_tokens_per_s is None


def test_compressed_stream_is_decompressed_although_identity_was_asked() -> None:
    seen_accept: list[str] = []
    body = gzip.compress(sse(chat_chunk("zipped"), usage_chunk(2), "[DONE]"))

    async def handle(request: httpx.Request) -> httpx.Response:
        seen_accept.append(request.headers["accept-encoding"])
        return event_stream(paced([body[:9], body[9:]]), **{"content-encoding": "gzip"})

    record = generate(handle)
    assert seen_accept == ["identity"]
    assert record.text == "zipped" and record.completion_tokens == 2


def test_event_split_over_several_data_lines_is_joined() -> None:
    """The SSE spec joins an event's data lines with LF; a pretty-printed JSON event stays valid."""
    lines = json.dumps(chat_chunk("joined"), indent=1).split("\n")
    body = "".join(f"data: {line}\n" for line in lines).encode() + b"\n" + sse(usage_chunk(1), "[DONE]")
    assert generate(streaming(body)).text == "joined"


def test_unicode_line_separators_inside_text_do_not_split_the_event() -> None:
    """vLLM's JSON carries U+2028, U+2029 and U+0085 raw; only CR, LF and CRLF end an SSE line
    (a decoder built on str.splitlines, as httpx's aiter_lines is, would cut the JSON there)."""
    text = "a\u2028b\u2029c\x85d\x1ce"
    record = generate(streaming(sse(chat_chunk(text), usage_chunk(5), "[DONE]")))
    assert record.text == text and len(record.chunk_times) == 1


def test_ok_answer_that_is_not_an_event_stream_is_reported() -> None:
    async def html(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/html"}, text="<html>proxy login</html>")

    error = generate_error(html)
    assert "did not answer with an event stream" in str(error) and "text/html" in str(error)


def test_sse_comments_and_other_fields_are_ignored_over_crlf() -> None:
    body = (
        b": ping\r\n\r\nevent: message\r\nid: 1\r\ndata: "
        + json.dumps(chat_chunk("x")).encode()
        + b"\r\n\r\n"
        + sse(usage_chunk(1), "[DONE]").replace(b"\n", b"\r\n")
    )
    record = generate(streaming(body))
    assert record.text == "x" and record.completion_tokens == 1


# ------------------------------------------------------------ derived values


def make_record(**overrides: Any) -> RequestRecord:
    values: dict[str, Any] = dict(
        request_id="r#0",
        mode="ngram",
        prompt_class="c",
        prompt_id="p",
        concurrency=4,
        started_at=10.0,
        first_token_at=10.5,
        last_token_at=12.5,
        finished_at=12.75,
        chunk_times=[10.5, 11.0, 12.5],
        prompt_tokens=20,
        completion_tokens=11,
        text="out",
        finish_reason="length",
    )
    values.update(overrides)
    return RequestRecord(**values)


def test_derived_values_follow_their_formulas() -> None:
    record = make_record()
    assert record.ttft_s == pytest.approx(0.5)
    assert record.decode_tokens_per_s == pytest.approx((11 - 1) / 2.0)
    assert record.tpot_s == pytest.approx(2.0 / 10)
    assert record.e2e_tokens_per_s == pytest.approx(11 / 2.75)
    assert record.inter_chunk_latencies_s == pytest.approx([0.5, 1.5])


@pytest.mark.parametrize(
    "overrides",
    [{"completion_tokens": 1}, {"completion_tokens": 0}, {"last_token_at": 10.5}, {"first_token_at": None}],
)
def test_decode_rate_is_none_without_two_tokens_or_a_time_span(overrides: dict[str, Any]) -> None:
    record = make_record(**overrides)
    assert record.decode_tokens_per_s is None and record.tpot_s is None


def test_record_round_trips_through_json_with_derived_values() -> None:
    record = make_record()
    data = json.loads(json.dumps(record.to_dict()))
    assert data["decode_tokens_per_s"] == pytest.approx(5.0)
    assert data["ttft_s"] == pytest.approx(0.5)
    assert data["inter_chunk_latencies_s"] == pytest.approx([0.5, 1.5])
    assert RequestRecord.from_dict(data) == record


def test_record_from_dict_names_missing_fields() -> None:
    data = make_record().to_dict()
    del data["completion_tokens"]
    with pytest.raises(ValueError, match="completion_tokens"):
        RequestRecord.from_dict(data)


# ------------------------------------------------------------ failures


@pytest.mark.parametrize("status", [500, 503])
def test_http_error_status_quotes_first_500_chars_of_body(status: int) -> None:
    body = "E" * 500 + "TAIL-NOT-QUOTED"
    error = generate_error(streaming(body.encode(), status=status))
    assert f"HTTP {status}" in str(error)
    assert "E" * 500 in str(error) and "TAIL" not in str(error)


def test_connect_error_is_reported_as_such() -> None:
    async def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    error = generate_error(refuse)
    assert "could not connect" in str(error) and "Connection refused" in str(error)


def test_connection_reset_mid_stream_is_reported_as_lost() -> None:
    async def reset_midway() -> AsyncIterator[bytes]:
        yield sse(chat_chunk("a"))
        raise httpx.ReadError("[Errno 104] Connection reset by peer")

    async def handle(request: httpx.Request) -> httpx.Response:
        return event_stream(reset_midway())

    error = generate_error(handle)
    assert "connection" in str(error) and "lost" in str(error) and "reset by peer" in str(error)


@pytest.mark.parametrize(
    ("as_httpx", "cause", "said"),
    [
        (httpx.ConnectTimeout, aiohttp.ServerDisconnectedError(), "connection to http://vllm.test lost"),
        (httpx.ConnectTimeout, aiohttp.ClientOSError(104, "Connection reset by peer"), "lost"),
        (httpx.ReadError, aiohttp.ClientPayloadError("Response payload is not completed"), "lost"),
        (httpx.TimeoutException, aiohttp.ConnectionTimeoutError("Connection timeout"), "connect timeout to"),
        (httpx.ConnectError, aiohttp.ClientConnectorError(None, OSError(111, "refused")), "could not connect"),
    ],
    ids=["server closed", "reset", "payload cut", "connect timeout", "refused"],
)
def test_aiohttp_errors_are_named_by_their_cause_not_httpx_aiohttps_mapping(
    as_httpx: type[httpx.HTTPError], cause: Exception, said: str
) -> None:
    """httpx-aiohttp maps aiohttp's errors onto httpx's coarsely (a server closing a connection
    becomes ConnectTimeout) and chains aiohttp's: the message follows the chained one."""

    async def handle(request: httpx.Request) -> httpx.Response:
        raise as_httpx("mapped") from cause

    error = generate_error(handle)
    assert said in str(error) and "'ngram/coding/bst#2' (mode ngram)" in str(error)


def test_silent_server_fails_after_read_timeout_not_later() -> None:
    started = time.perf_counter()
    error = generate_error(streaming(sse(chat_chunk("a")), 30.0), read_timeout=0.05)
    assert time.perf_counter() - started < 2.0
    assert "no data for 0.05 s" in str(error) and "1 events" in str(error)


def test_silence_before_first_byte_also_counts_as_read_timeout() -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        raise AssertionError("unreachable")

    started = time.perf_counter()
    error = generate_error(hang, read_timeout=0.05)
    assert time.perf_counter() - started < 2.0 and "no data for 0.05 s" in str(error)


def test_steady_stream_past_the_whole_request_deadline_fails() -> None:
    trickle: list[bytes | float] = []
    for _ in range(200):
        trickle += [sse(chat_chunk("a")), 0.01]
    started = time.perf_counter()
    error = generate_error(streaming(*trickle), read_timeout=1.0, request_deadline=0.15)
    assert time.perf_counter() - started < 1.5
    assert "deadline of 0.15 s" in str(error)


def test_outside_cancellation_is_not_turned_into_a_request_error() -> None:
    async def main() -> None:
        async with make_client(streaming(sse(chat_chunk("a")), 30.0), read_timeout=5.0) as client:
            task = asyncio.create_task(client.generate(chat_request()))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())


@pytest.mark.parametrize(
    "error_event",
    [
        {"error": {"message": "KV cache exhausted", "type": "InternalServerError", "code": 500}},
        {"object": "error", "message": "KV cache exhausted", "type": "BadRequestError", "code": 500},
    ],
)
def test_error_event_mid_stream_is_reported_with_message_and_code(error_event: dict[str, Any]) -> None:
    error = generate_error(streaming(sse(chat_chunk("a"), error_event, "[DONE]")))
    assert "error event" in str(error) and "KV cache exhausted" in str(error) and "500" in str(error)


def test_stream_without_done_is_reported_truncated() -> None:
    error = generate_error(streaming(sse(chat_chunk("a"), chat_chunk("b"), usage_chunk(2))))
    assert "without [DONE]" in str(error) and "truncated" in str(error) and "3 events" in str(error)


def test_stream_without_usage_is_reported() -> None:
    error = generate_error(streaming(sse(chat_chunk("a"), "[DONE]")))
    assert "did not send usage" in str(error) and "include_usage" in str(error)


@pytest.mark.parametrize("payload", ['{"choices": []} trailing', "[1, 2", "not json"])
def test_json_with_trailing_garbage_or_cut_short_is_malformed(payload: str) -> None:
    error = generate_error(streaming(sse(payload, usage_chunk(1), "[DONE]")))
    assert "malformed JSON" in str(error) and payload in str(error)


def test_json_with_surrounding_whitespace_is_valid() -> None:
    body = b"data:  " + json.dumps(chat_chunk("a")).encode() + b" \n\n" + sse(usage_chunk(1), "[DONE]")
    assert generate(streaming(body)).text == "a"


def test_malformed_json_is_quoted_up_to_200_chars() -> None:
    payload = '{"choices": [' + "x" * 300
    error = generate_error(streaming(sse(chat_chunk("a"), payload, "[DONE]")))
    assert "malformed JSON" in str(error)
    assert payload[:200] in str(error) and payload[:201] not in str(error)


# ------------------------------------------------------------ API key


def test_api_key_is_sent_but_never_shown() -> None:
    seen_auth: list[str] = []

    async def echo_auth(request: httpx.Request) -> httpx.Response:
        seen_auth.append(request.headers["authorization"])
        return httpx.Response(401, text=f"invalid key {request.headers['authorization']}")

    client = make_client(echo_auth, api_key=API_KEY)
    assert API_KEY not in repr(client)

    async def main() -> None:
        async with client:
            await client.generate(chat_request())

    with pytest.raises(RequestError) as info:
        asyncio.run(main())
    assert seen_auth == [f"Bearer {API_KEY}"]
    assert "HTTP 401" in str(info.value) and "invalid key" in str(info.value)
    assert API_KEY not in str(info.value) and API_KEY not in repr(info.value)


def test_auth_headers_carry_a_bearer_token_only_when_a_key_is_set() -> None:
    assert auth_headers("k") == {"Authorization": "Bearer k"}
    assert auth_headers(None) == {} and auth_headers("") == {}


def test_api_key_in_a_transport_error_is_not_shown_or_chained() -> None:
    async def refuse_loudly(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"refused {request.headers['authorization']}", request=request)

    error = generate_error(refuse_loudly, api_key=API_KEY)
    assert "refused Bearer ***" in str(error)
    cause = error.__cause__
    assert cause is None or API_KEY not in repr(cause)


# ------------------------------------------------------------ GETs


def test_get_text() -> None:
    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text="vllm:num_requests_running 0\n")
        return httpx.Response(404, text="no such page")

    async def main() -> str:
        async with make_client(handle) as client:
            with pytest.raises(RequestError, match="HTTP 404: no such page"):
                await client.get_text("/nope")
            return await client.get_text("/metrics")

    assert asyncio.run(main()).startswith("vllm:num_requests_running")


# ------------------------------------------------------------ run_requests


def test_run_requests_keeps_input_order_and_bounds_concurrency() -> None:
    in_flight = 0
    peak = 0
    done_order: list[str] = []

    async def body(delay: float) -> AsyncIterator[bytes]:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            await asyncio.sleep(delay)
            yield sse(chat_chunk("x"), usage_chunk(1), "[DONE]")
        finally:
            in_flight -= 1

    async def handle(request: httpx.Request) -> httpx.Response:
        index = int(json.loads(request.content)["messages"][0]["content"])
        return event_stream(body(0.005 * (10 - index)))  # later ones finish sooner

    requests = [chat_request(f"r#{i}", messages=[{"role": "user", "content": str(i)}]) for i in range(10)]

    async def main() -> list[RequestRecord]:
        async with make_client(handle) as client:
            return await run_requests(
                client, requests, concurrency=3, on_done=lambda r: done_order.append(r.request_id)
            )

    records = asyncio.run(main())
    assert [r.request_id for r in records] == [f"r#{i}" for i in range(10)]
    assert all(r.concurrency == 3 for r in records)
    assert peak == 3
    assert sorted(done_order) == sorted(r.request_id for r in records)
    assert done_order != [r.request_id for r in records]  # completion order differed, output order did not


def test_run_requests_fails_fast_and_cancels_the_rest() -> None:
    cancelled = 0

    async def hang() -> AsyncIterator[bytes]:
        nonlocal cancelled
        try:
            yield sse(chat_chunk("x"))
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled += 1
            raise

    async def handle(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["messages"][0]["content"] == "2":
            await asyncio.sleep(0.02)
            return httpx.Response(500, text="boom")
        return event_stream(hang())

    requests = [chat_request(f"r#{i}", messages=[{"role": "user", "content": str(i)}]) for i in range(4)]

    async def main() -> None:
        async with make_client(handle, read_timeout=60.0) as client:
            await run_requests(client, requests, concurrency=4)

    started = time.perf_counter()
    with pytest.raises(RequestError, match=r"'r#2'.*HTTP 500 .*: boom"):
        asyncio.run(main())
    assert time.perf_counter() - started < 2.0
    assert cancelled == 3


def test_run_requests_rejects_zero_concurrency() -> None:
    async def main() -> None:
        async with make_client(streaming(b"")) as client:
            await run_requests(client, [chat_request()], concurrency=0)

    with pytest.raises(ValueError, match="concurrency"):
        asyncio.run(main())


# ------------------------------------------- the client's transport (httpx over aiohttp) over loopback
# An in-process asyncio server on 127.0.0.1: real sockets, still milliseconds.

SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
ServerHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def chunked(*payloads: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(payload), payload) for payload in payloads) + b"0\r\n\r\n"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return await reader.readexactly(length)


def with_server(handler: ServerHandler, client_main: Callable[[str], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        # a backlog above the 120 connections of the test that opens the most at once: beyond the default
        # 100, a connection waits out a SYN retransmit (1 s) before this loop accepts it
        server = await asyncio.start_server(handler, "127.0.0.1", 0, backlog=256)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await client_main(f"http://127.0.0.1:{port}")

    return asyncio.run(main())


def vllm_like_body(*texts: str, completion_tokens: int) -> bytes:
    return chunked(
        *(sse(chat_chunk(text)) for text in texts), sse(usage_chunk(completion_tokens)), sse("[DONE]")
    )


def serve_in_parts(response: bytes, cuts: list[int]) -> ServerHandler:
    """A server that answers one request with ``response`` in several writes, cut at ``cuts``."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for start, stop in zip([0, *cuts], [*cuts, len(response)], strict=True):
            writer.write(response[start:stop])
            await writer.drain()
            await asyncio.sleep(0.005)
        writer.close()

    return serve


async def one_chat_request(url: str) -> RequestRecord:
    async with StreamingClient(url) as client:
        return await client.generate(chat_request())


def test_real_socket_stream_split_inside_chunk_framing() -> None:
    response = SSE_HEAD + vllm_like_body("héllo", " wörld", completion_tokens=9)
    # Cut inside a size line, between CR and LF, and inside "é".
    cuts = [len(SSE_HEAD) + 1, response.index(b"\r\n", len(SSE_HEAD)) + 1, response.index("é".encode()) + 1]
    record = with_server(serve_in_parts(response, cuts), one_chat_request)
    assert record.text == "héllo wörld" and record.completion_tokens == 9 and len(record.chunk_times) == 2


@pytest.mark.parametrize(("keep_alive", "expected_connections"), [(True, 1), (False, 3)],
                         ids=["keep-alive reuses one connection", "closed while idle is not used again"])
def test_real_socket_connection_reuse(keep_alive: bool, expected_connections: int) -> None:
    connections = 0
    body = SSE_HEAD + vllm_like_body("x", completion_tokens=1)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while True:
                await read_request(reader)
                writer.write(body)
                await writer.drain()
                if not keep_alive:
                    break  # one request per connection, like a server's idle timeout
        except asyncio.IncompleteReadError:
            pass
        writer.close()

    async def run(url: str) -> list[RequestRecord]:
        records = []
        async with StreamingClient(url) as client:
            for i in range(3):
                records.append(await client.generate(chat_request(f"r#{i}")))
                await asyncio.sleep(0.05)  # a server's close reaches the client while idle
        return records

    records = with_server(serve, run)
    assert [r.text for r in records] == ["x", "x", "x"]
    assert connections == expected_connections


def test_real_socket_request_dropped_after_it_was_sent_is_not_sent_again() -> None:
    """A POST the server received may already be generating: sending it again would put a
    request twice into the measured window, so the client reports the loss instead."""
    received: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await read_request(reader))
        writer.close()  # no answer at all

    async def run(url: str) -> None:
        async with StreamingClient(url) as client:
            await client.generate(chat_request())

    with pytest.raises(RequestError, match=r"connection .* lost"):
        with_server(serve, run)
    assert len(received) == 1


def test_real_socket_post_dropped_on_a_reused_connection_is_not_sent_again() -> None:
    """The case a client retries if it retries anything: the server takes the second request on a
    kept-alive connection and closes without answering. aiohttp retries that for idempotent methods
    only; a POST must reach the server once and fail as a lost connection, naming the request."""
    requests_seen = 0
    body = SSE_HEAD + vllm_like_body("x", completion_tokens=1)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests_seen
        try:
            while True:
                await read_request(reader)
                requests_seen += 1
                if requests_seen > 1:
                    break  # read, maybe generating, then gone
                writer.write(body)
                await writer.drain()
        except asyncio.IncompleteReadError:
            pass
        writer.close()

    async def run(url: str) -> None:
        async with StreamingClient(url) as client:
            assert (await client.generate(chat_request("first"))).text == "x"
            await client.generate(chat_request("second"))

    with pytest.raises(RequestError, match=r"'second' \(mode ngram\): connection to http://127\.0\.0\.1:\d+ lost"):
        with_server(serve, run)
    assert requests_seen == 2


def test_real_socket_unicode_line_separators_do_not_split_the_event() -> None:
    """vLLM's JSON carries U+2028, U+2029 and U+0085 raw; only CR and LF end an SSE line."""
    text = "a\u2028b\u2029c\u0085d"
    response = SSE_HEAD + vllm_like_body(text, "e", completion_tokens=2)

    middle = response.index("\u2029".encode()) + 1  # a read boundary inside the separator
    record = with_server(serve_in_parts(response, [middle]), one_chat_request)
    assert record.text == text + "e" and len(record.chunk_times) == 2


def test_real_socket_answer_that_is_not_http_is_reported() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        writer.close()

    async def run(url: str) -> None:
        async with StreamingClient(url) as client:
            await client.generate(chat_request())

    with pytest.raises(RequestError, match=r"'ngram/coding/bst#2' \(mode ngram\): unreadable HTTP answer from http://"):
        with_server(serve, run)


def test_real_socket_many_streams_are_not_queued_by_a_connection_pool() -> None:
    """run_requests bounds concurrency; the transport must not queue below it (aiohttp's default
    pool holds 100 connections): 120 streams that each wait for all the others must all start."""
    started = 0
    all_started = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal started
        await read_request(reader)
        started += 1
        if started == 120:
            all_started.set()
        await asyncio.wait_for(all_started.wait(), timeout=5)
        writer.write(SSE_HEAD + vllm_like_body("x", completion_tokens=1))
        await writer.drain()
        writer.close()

    async def run(url: str) -> list[RequestRecord]:
        async with StreamingClient(url) as client:
            return await run_requests(client, [chat_request(f"r#{i}") for i in range(120)], concurrency=120)

    assert len(with_server(serve, run)) == 120


def test_real_socket_content_length_and_close_delimited_bodies() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if b"GET /metrics " in head:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nvllm:x 1.0\n\n")
        else:
            writer.write(b'HTTP/1.0 200 OK\r\n\r\n{"data": [{"id": "smol"}]}')
        await writer.drain()
        writer.close()

    async def run(url: str) -> tuple[str, str]:
        async with StreamingClient(url) as client:
            return await client.get_text("/metrics"), await client.get_text("/v1/models")

    assert with_server(serve, run) == ("vllm:x 1.0\n\n", '{"data": [{"id": "smol"}]}')


def test_real_socket_close_mid_body_is_reported_lost() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(SSE_HEAD + vllm_like_body("x", completion_tokens=1)[:30])
        await writer.drain()
        writer.close()

    async def run(url: str) -> None:
        async with StreamingClient(url) as client:
            await client.generate(chat_request())

    with pytest.raises(
        RequestError, match=r"'ngram/coding/bst#2' \(mode ngram\): connection .* lost.*complete"
    ):
        with_server(serve, run)


def test_real_socket_stall_hits_read_timeout() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(SSE_HEAD + chunked(sse(chat_chunk("x")))[:-5])  # one event, then silence
        await writer.drain()
        await asyncio.sleep(30)

    async def run(url: str) -> None:
        async with StreamingClient(url, read_timeout=0.05) as client:
            await client.generate(chat_request())

    started = time.perf_counter()
    with pytest.raises(RequestError, match=r"no data for 0\.05 s"):
        with_server(serve, run)
    assert time.perf_counter() - started < 2.0


def test_real_socket_connection_refused() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async def run(url: str) -> str:
        return url

    closed_url = with_server(serve, run)  # the port is free again once the server is gone

    async def main() -> None:
        async with StreamingClient(closed_url, connect_timeout=2.0) as client:
            await client.generate(chat_request())

    with pytest.raises(RequestError, match=r"could not connect to http://127\.0\.0\.1"):
        asyncio.run(main())
