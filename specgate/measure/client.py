"""Streaming HTTP client for vLLM's OpenAI-compatible API: one request's Server-Sent-Events
stream into a ``RequestRecord`` (httpx over aiohttp's transport: docs/client-benchmark.md). Token
counts come from the final ``usage`` chunk only: with speculation a chunk can carry several."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport
from httpx_sse import SSEError, aconnect_sse

from specgate.errors import RequestError
from specgate.serve.http import auth_headers, tls_context

__all__ = ["GenerationRequest", "RequestRecord", "StreamingClient", "auth_headers", "run_requests"]

DONE_PAYLOAD = "[DONE]"
_JSON_DECODER = json.JSONDecoder()
CHAT_ENDPOINT = "/v1/chat/completions"
COMPLETIONS_ENDPOINT = "/v1/completions"

# How much of a server's answer an error message quotes: enough for vLLM's validation error.
_HTTP_BODY_QUOTE_CHARS = 500
_PAYLOAD_QUOTE_CHARS = 200


@dataclass(frozen=True)
class GenerationRequest:
    """One request to send: exactly one of ``messages`` (chat API) and ``prompt`` (completions
    API), which picks the endpoint, plus the labels of the record."""

    request_id: str  # unique within a run, e.g. "ngram/coding/bst#2"
    mode: str  # speculative-decoding mode under test, e.g. "ngram"
    prompt_class: str
    prompt_id: str
    model: str
    max_tokens: int
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    temperature: float = 0.0
    seed: int | None = 0
    ignore_eos: bool = False
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError(f"request {self.request_id!r}: set exactly one of messages (chat API) "
                             f"and prompt (completions API)")
        if self.max_tokens < 1:
            raise ValueError(f"request {self.request_id!r}: max_tokens must be >= 1, "
                             f"got {self.max_tokens}")
        # The client relies on streaming with a usage chunk.
        overridden = {"stream", "stream_options"} & self.extra_body.keys()
        if overridden:
            raise ValueError(f"request {self.request_id!r}: extra_body must not set "
                             f"{sorted(overridden)}; the client always streams with usage")

    @property
    def endpoint(self) -> str:
        return CHAT_ENDPOINT if self.messages is not None else COMPLETIONS_ENDPOINT

    def to_body(self) -> dict[str, Any]:
        """The JSON body for the OpenAI-compatible endpoint, ``extra_body`` merged last."""
        text = {"messages": self.messages} if self.messages is not None else {"prompt": self.prompt}
        body: dict[str, Any] = {"model": self.model, **text, "max_tokens": self.max_tokens,
                                "temperature": self.temperature}
        if self.seed is not None:
            body["seed"] = self.seed
        if self.ignore_eos:
            body["ignore_eos"] = True  # vLLM extension; omitted when off to stay plain OpenAI
        return {**body, "stream": True, "stream_options": {"include_usage": True},
                **self.extra_body}


@dataclass
class RequestRecord:
    """What one request measured, in ``time.perf_counter()`` seconds. ``first_token_at`` and
    ``last_token_at`` are None when no chunk carried text (recorded, not a failure)."""

    request_id: str
    mode: str
    prompt_class: str
    prompt_id: str
    concurrency: int
    started_at: float
    first_token_at: float | None
    last_token_at: float | None
    finished_at: float
    chunk_times: list[float]  # receive time of each chunk that carried generated text
    prompt_tokens: int
    completion_tokens: int  # from the final usage chunk, never from counting chunks
    text: str
    finish_reason: str | None
    # vLLM's own acceptance of this request (--per-request-spec-decode-metrics), or None.
    spec_decode: dict[str, Any] | None = None
    # Chunks that carried no text (not the chat API's role announcement): engine steps all the same.
    empty_chunks: int = 0

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: request sent until the first chunk with text arrived."""
        if self.first_token_at is None:
            return None
        return self.first_token_at - self.started_at

    @property
    def _decode_span_s(self) -> float | None:
        # The first token comes from prefill: decode speed counts the tokens and time after it.
        if self.completion_tokens < 2 or self.first_token_at is None or self.last_token_at is None:
            return None
        span = self.last_token_at - self.first_token_at
        return span if span > 0 else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        span = self._decode_span_s
        return None if span is None else (self.completion_tokens - 1) / span

    @property
    def no_decode_rate_reason(self) -> str | None:
        """Why :attr:`decode_tokens_per_s` is None (None when there is a rate)."""
        if self.completion_tokens < 2:
            return f"{self.completion_tokens} token(s) generated"
        if self.first_token_at is None or self.last_token_at is None:
            return f"{self.completion_tokens} tokens but no chunk carried text"
        if self.last_token_at <= self.first_token_at:
            return f"all {self.completion_tokens} tokens arrived in one chunk"
        return None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first."""
        span = self._decode_span_s
        return None if span is None else span / (self.completion_tokens - 1)

    @property
    def e2e_tokens_per_s(self) -> float | None:
        span = self.finished_at - self.started_at
        return self.completion_tokens / span if span > 0 else None

    @property
    def inter_chunk_latencies_s(self) -> list[float]:
        return [later - earlier for earlier, later in itertools.pairwise(self.chunk_times)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of the fields plus the derived values (for readers of the file)."""
        names = [*(f.name for f in fields(self)), *_DERIVED_KEYS]
        out = {name: getattr(self, name) for name in names}
        return out | {"chunk_times": list(self.chunk_times)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        """Inverse of ``to_dict``; derived values are recomputed, not trusted."""
        names = [f.name for f in fields(cls) if f.name in data or f.default is MISSING]
        missing = [name for name in names if name not in data]
        if missing:
            raise ValueError(f"request record {data.get('request_id')!r} lacks {missing}")
        kwargs = {name: data[name] for name in names}
        kwargs["chunk_times"] = list(kwargs["chunk_times"])
        return cls(**kwargs)


_DERIVED_KEYS = ("ttft_s", "tpot_s", "decode_tokens_per_s", "e2e_tokens_per_s",
                 "inter_chunk_latencies_s")


class _StallWatchdog:
    """Cancels a task once no bytes arrived for ``limit_s`` seconds; re-arms lazily (one clock
    read per chunk), and works under a test's ``MockTransport``, which enforces no timeout."""

    __slots__ = ("_handle", "_limit_s", "_loop", "_task", "clock", "fired", "last_data_at")

    def __init__(self, limit_s: float) -> None:
        self._limit_s = limit_s
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None, "the stall watchdog must run inside a task"
        self._task = task
        self.clock = self._loop.time  # what the caller stamps last_data_at with
        self.last_data_at = self.clock()
        self.fired = False
        self._handle = self._loop.call_at(self.last_data_at + limit_s, self._check)

    def _check(self) -> None:
        deadline = self.last_data_at + self._limit_s
        if self._loop.time() >= deadline:
            self.fired = True
            self._task.cancel()
        else:
            self._handle = self._loop.call_at(deadline, self._check)

    def stop(self) -> None:
        self._handle.cancel()


@dataclass
class _StreamState:
    """What generate() has gathered so far; kept apart so error messages can cite it."""

    chunk_times: list[float] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    events: int = 0
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    spec_decode: dict[str, Any] | None = None
    empty_chunks: int = 0
    saw_done: bool = False


# What a transport error means, by aiohttp's error (the cause kept) first, else by httpx's.
_Kinds = tuple[type[BaseException], ...]
_TRANSPORT_ERRORS: tuple[tuple[_Kinds, _Kinds, str], ...] = (
    ((aiohttp.ConnectionTimeoutError,), (httpx.ConnectTimeout,), "connect timeout to {url}"),
    ((aiohttp.ClientConnectorError,), (httpx.ConnectError,), "could not connect to {url}"),
    ((aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError),
     (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError),
     "connection to {url} lost (reset or closed mid-response)"),
    ((aiohttp.ClientResponseError,), (), "unreadable HTTP answer from {url}"),
    ((), (httpx.TimeoutException,), "{kind} talking to {url}"))


def _transport_meaning(exc: BaseException, cause: BaseException) -> str:
    texts = [text for kinds, _, text in _TRANSPORT_ERRORS if isinstance(cause, kinds)]
    texts += [text for _, kinds, text in _TRANSPORT_ERRORS if isinstance(exc, kinds)]
    return (texts or ["HTTP transport error talking to {url}"])[0]


class StreamingClient:
    """Async client for one vLLM server (``async with``): ``read_timeout`` bounds the silence
    between chunks, ``request_deadline`` a whole request; the API key is scrubbed from messages.
    A POST is never retried, so no request lands in a window twice."""

    def __init__(self, base_url: str, *, api_key: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None, connect_timeout: float = 10.0,
                 write_timeout: float = 10.0, read_timeout: float = 120.0,
                 request_deadline: float = 900.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.read_timeout = read_timeout
        self.request_deadline = request_deadline
        self._api_key = api_key
        if transport is None:
            # The session is made on first use, inside the running event loop.
            transport = AiohttpTransport(verify=tls_context(), client=_aiohttp_session)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Accept-Encoding": "identity", **auth_headers(api_key)},
            transport=transport, verify=tls_context(),
            timeout=httpx.Timeout(connect=connect_timeout, read=read_timeout,
                                  write=write_timeout, pool=connect_timeout))
        # No transport read timeout for streams: the _StallWatchdog enforces read_timeout.
        self._stream_timeout = httpx.Timeout(connect=connect_timeout, read=None,
                                             write=write_timeout, pool=connect_timeout)

    def __repr__(self) -> str:
        key = "set" if self._api_key else "none"
        return f"StreamingClient(base_url={self.base_url!r}, api_key={key})"

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def get_text(self, path: str) -> str:
        """GET ``path`` (e.g. "/metrics") and return the body; RequestError unless 200."""
        where = f"GET {self.base_url}{path}"
        try:
            async with asyncio.timeout(self.request_deadline):
                response = await self._http.get(path)
        except TimeoutError:
            raise self._error(f"{where}: no answer within {self.request_deadline:g} s") from None
        except (httpx.HTTPError, aiohttp.ClientError) as exc:
            raise self._transport_error(where, exc) from self._safe_cause(exc)
        if response.status_code != 200:
            raise self._error(f"{where}: HTTP {response.status_code}: "
                              f"{response.text[:_HTTP_BODY_QUOTE_CHARS]}")
        return response.text

    async def generate(self, req: GenerationRequest, *, concurrency: int = 1) -> RequestRecord:
        """Send ``req``, read its whole stream, and return what it measured."""
        where = f"request {req.request_id!r} (mode {req.mode})"
        state = _StreamState()
        started_at = time.perf_counter()
        watchdog: _StallWatchdog | None = None
        try:
            async with asyncio.timeout(self.request_deadline):
                watchdog = _StallWatchdog(self.read_timeout)
                try:
                    await self._stream(req, where, state, watchdog)
                except asyncio.CancelledError:
                    if not watchdog.fired:
                        raise  # cancelled from outside, or by the deadline: not ours
                    asyncio.current_task().uncancel()  # type: ignore[union-attr]
                    raise self._stalled(where, state) from None
                finally:
                    watchdog.stop()
        except TimeoutError:
            raise self._error(f"{where}: exceeded the whole-request deadline of "
                              f"{self.request_deadline:g} s after {state.events} events") from None
        except httpx.ReadTimeout:
            raise self._stalled(where, state) from None
        except (httpx.HTTPError, aiohttp.ClientError) as exc:
            raise self._transport_error(where, exc) from self._safe_cause(exc)
        finished_at = time.perf_counter()

        if not state.saw_done:
            raise self._error(f"{where}: stream ended without [DONE] after {state.events} events "
                              "(truncated)")
        if state.usage is None:
            raise self._error(f"{where}: server did not send usage; "
                              "stream_options.include_usage is required")
        chunk_times = state.chunk_times
        return RequestRecord(
            request_id=req.request_id, mode=req.mode, prompt_class=req.prompt_class,
            prompt_id=req.prompt_id, concurrency=concurrency, started_at=started_at,
            first_token_at=chunk_times[0] if chunk_times else None,
            last_token_at=chunk_times[-1] if chunk_times else None,
            finished_at=finished_at, chunk_times=chunk_times,
            prompt_tokens=int(state.usage.get("prompt_tokens") or 0),
            completion_tokens=int(state.usage.get("completion_tokens") or 0),
            text="".join(state.text_parts), finish_reason=state.finish_reason,
            spec_decode=state.spec_decode, empty_chunks=state.empty_chunks)

    async def _stream(self, req: GenerationRequest, where: str, state: _StreamState,
                      watchdog: _StallWatchdog) -> None:
        """The hot path: take each event as it arrives, parse its JSON, note text and time."""
        is_chat = req.messages is not None
        # raw_decode skips json.loads' wrapper calls and whitespace regex: a third less per event.
        raw_decode = _JSON_DECODER.raw_decode
        perf_counter = time.perf_counter
        clock = watchdog.clock
        chunk_times = state.chunk_times
        text_parts = state.text_parts
        async with aconnect_sse(self._http, "POST", req.endpoint, json=req.to_body(),
                                timeout=self._stream_timeout) as source:
            response = source.response
            if response.status_code != 200:
                answer = (await response.aread()).decode("utf-8", "replace")
                raise self._error(
                    f"{where}: HTTP {response.status_code} from {self.base_url}{req.endpoint}: "
                    f"{answer[:_HTTP_BODY_QUOTE_CHARS]}")
            async for message in source.aiter_sse():
                # Stamped as the event is handed over, before its JSON is parsed.
                received_at = perf_counter()
                watchdog.last_data_at = clock()
                payload = message.data
                if not payload:  # an event with no data (only event/id/retry fields)
                    continue
                state.events += 1
                if payload == DONE_PAYLOAD:
                    state.saw_done = True
                    continue
                try:
                    event, end = raw_decode(payload)
                    if end != len(payload):
                        raise ValueError("trailing characters")
                except ValueError:
                    # The fast path takes no surrounding whitespace; json.loads decides.
                    try:
                        event = json.loads(payload)
                    except ValueError:
                        raise self._error(f"{where}: malformed JSON in stream event "
                                          f"{state.events}: {payload[:_PAYLOAD_QUOTE_CHARS]!r}"
                                          ) from None
                if type(event) is not dict:
                    raise self._error(f"{where}: stream event {state.events} is not a JSON "
                                      f"object: {payload[:_PAYLOAD_QUOTE_CHARS]!r}")
                if "error" in event or event.get("object") == "error":
                    raise self._error(f"{where}: server sent an error event: "
                                      f"{_describe_error(event)}")
                choices = event.get("choices")
                if choices:
                    choice = choices[0]
                    if is_chat:
                        delta = choice.get("delta") or {}
                        text = (delta.get("content") or delta.get("reasoning_content")
                                or delta.get("reasoning"))
                    else:
                        text = choice.get("text")
                    if text:
                        text_parts.append(text)
                        chunk_times.append(received_at)
                    elif not (is_chat and "role" in delta):  # an engine step with no text (yet)
                        state.empty_chunks += 1
                    reason = choice.get("finish_reason")
                    if reason is not None:
                        state.finish_reason = reason
                usage = event.get("usage")
                if usage:  # the last usage seen is the final one, with vLLM's per-request metrics
                    state.usage = usage
                    state.spec_decode = (event.get("metrics") or {}).get("speculative_decoding")

    def _error(self, message: str) -> RequestError:
        if self._api_key:
            message = message.replace(self._api_key, "***")
        return RequestError(message)

    def _safe_cause(self, exc: BaseException) -> BaseException | None:
        """Chain ``exc`` only if its text cannot leak the API key."""
        if self._api_key and self._api_key in repr(exc):
            return None
        return exc

    def _stalled(self, where: str, state: _StreamState) -> RequestError:
        return self._error(f"{where}: read timeout: no data for {self.read_timeout:g} s after "
                           f"{state.events} events")

    def _transport_error(self, where: str, exc: Exception) -> RequestError:
        detail = str(exc) or type(exc).__name__
        # httpx-aiohttp maps aiohttp's errors coarsely, keeping the cause: ask that first.
        cause = exc.__cause__ if isinstance(exc.__cause__, aiohttp.ClientError) else exc
        if isinstance(exc, SSEError):  # a 200 answer that is not an event stream
            what = f"{self.base_url} did not answer with an event stream"
        else:
            what = _transport_meaning(exc, cause).format(url=self.base_url,
                                                         kind=type(exc).__name__)
        return self._error(f"{where}: {what}: {detail}")


def _aiohttp_session() -> aiohttp.ClientSession:
    # limit=0: run_requests bounds concurrency; a pool limit would charge queueing to TTFT.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))


def _describe_error(event: dict[str, Any]) -> str:
    """Message and code of a vLLM error event, in either of its two shapes."""
    error = event.get("error")
    source = error if isinstance(error, dict) else event
    message = source.get("message", error if isinstance(error, str) else None)
    code = source.get("code")
    text = str(message) if message is not None else json.dumps(event)[:_PAYLOAD_QUOTE_CHARS]
    return f"{text} (code {code})" if code is not None else text


async def run_requests(client: StreamingClient, requests: Iterable[GenerationRequest], *,
                       concurrency: int, on_done: Callable[[RequestRecord], None] | None = None,
                       ) -> list[RequestRecord]:
    """Run ``requests`` with at most ``concurrency`` in flight; records in input order. The first
    failure cancels the rest and is re-raised as itself (it invalidates the measurement)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    slots = asyncio.Semaphore(concurrency)

    async def run_one(req: GenerationRequest) -> RequestRecord:
        async with slots:
            record = await client.generate(req, concurrency=concurrency)
        if on_done is not None:
            on_done(record)
        return record

    # Tasks are made in input order and the semaphore wakes waiters FIFO: requests start in order.
    tasks = [asyncio.create_task(run_one(req)) for req in requests]
    try:
        pending: set[asyncio.Task[RequestRecord]] = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            failed = [task for task in tasks
                      if task in done and not task.cancelled() and task.exception() is not None]
            if failed:
                raise failed[0].exception()  # type: ignore[misc]
        return [task.result() for task in tasks]
    finally:
        unfinished = [task for task in tasks if not task.done()]
        for task in unfinished:
            task.cancel()
        if unfinished:
            await asyncio.gather(*unfinished, return_exceptions=True)
