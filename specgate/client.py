"""Streaming HTTP client for vLLM's OpenAI-compatible API.

One job: send one generation request, read its Server-Sent-Events stream and
turn it into a ``RequestRecord`` with the timings and token counts that the
performance gates compare. Everything about *which* requests to send and what
to do with the records lives elsewhere.

Reading order: ``SSEDecoder`` (events from bytes), ``FastHTTPTransport`` (the
bytes from the socket, because httpx's own HTTP/1.1 parsing was the client's
bottleneck), ``GenerationRequest``/``RequestRecord`` (what goes in and out),
``StreamingClient`` (one request), ``run_requests`` (many, bounded).

Token counts come from the final ``usage`` chunk only. With speculative
decoding one stream chunk can carry several accepted tokens, so counting
chunks would undercount tokens and overstate per-token latency.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import httpx

from specgate.errors import RequestError

__all__ = [
    "ChunkedDecoder",
    "FastHTTPTransport",
    "GenerationRequest",
    "RequestRecord",
    "SSEDecoder",
    "StreamingClient",
    "run_requests",
]

DONE_PAYLOAD = "[DONE]"
_JSON_DECODER = json.JSONDecoder()
CHAT_ENDPOINT = "/v1/chat/completions"
COMPLETIONS_ENDPOINT = "/v1/completions"

# How much of a server's answer goes into an error message: enough to read
# vLLM's validation error, not so much that a HTML error page floods the log.
_HTTP_BODY_QUOTE_CHARS = 500
_PAYLOAD_QUOTE_CHARS = 200


# --------------------------------------------------------------------------- SSE


class SSEDecoder:
    """Incremental Server-Sent-Events decoder that yields ``data`` payloads.

    Follows the parsing rules of the HTML SSE spec for the parts that matter
    here: lines end in CRLF, LF or CR; a blank line ends an event; several
    ``data:`` lines of one event are joined with "\\n"; one space after the
    colon is dropped; comment lines (leading ":") and the other fields
    (``event``, ``id``, ``retry``) are ignored. Bytes may arrive split
    anywhere, including inside a UTF-8 character or between "\\r" and "\\n".

    Splitting on the line-end bytes before decoding is safe for UTF-8 because
    0x0A and 0x0D never occur inside a multibyte sequence, so each complete
    line is always a complete UTF-8 string.
    """

    __slots__ = ("_at_stream_start", "_data_lines", "_pending", "_skip_leading_lf")

    def __init__(self) -> None:
        self._pending = b""  # bytes of the line not yet terminated
        self._data_lines: list[str] = []  # data lines of the event being built
        # A chunk that ended in "\r" already ended its line; if the next chunk
        # starts with "\n" that "\n" is the rest of the same CRLF, not a blank line.
        self._skip_leading_lf = False
        self._at_stream_start = True  # a UTF-8 BOM may precede the first line

    def feed(self, data: bytes) -> list[str]:
        """Consume the next bytes of the stream; return the events they complete."""
        if self._skip_leading_lf:
            self._skip_leading_lf = False
            if data[:1] == b"\n":
                data = data[1:]
        buffer = self._pending + data if self._pending else data
        if b"\r" in buffer:
            if buffer[-1:] == b"\r":
                self._skip_leading_lf = True
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buffer.split(b"\n")
        self._pending = lines.pop()  # the unterminated tail (b"" when none)
        if not lines:
            return []
        if self._at_stream_start:
            self._at_stream_start = False
            if lines[0].startswith(b"\xef\xbb\xbf"):
                lines[0] = lines[0][3:]
        return self._consume_lines(lines)

    def close(self) -> list[str]:
        """End of stream: return the last event even if its blank line never came.

        The spec drops an unterminated final event; a benchmark client would
        rather see it (and let the caller decide whether the stream was
        complete, e.g. by the absence of ``[DONE]``).
        """
        lines = [self._pending] if self._pending else []
        self._pending = b""
        self._skip_leading_lf = False
        events = self._consume_lines(lines) if lines else []
        if self._data_lines:
            events.append("\n".join(self._data_lines))
            self._data_lines = []
        return events

    def _consume_lines(self, lines: list[bytes]) -> list[str]:
        events: list[str] = []
        data_lines = self._data_lines
        for line in lines:
            if not line:  # blank line: dispatch, but only if the event had data
                if data_lines:
                    events.append("\n".join(data_lines))
                    data_lines = self._data_lines = []
            elif line.startswith(b"data"):
                value = line[4:]
                if not value:  # "data" without a colon is a data field with empty value
                    data_lines.append("")
                elif value[:1] == b":":
                    if value[1:2] == b" ":
                        data_lines.append(value[2:].decode("utf-8", "replace"))
                    else:
                        data_lines.append(value[1:].decode("utf-8", "replace"))
                # else: a field merely starting with "data" (e.g. "database:"): ignored
            # comments (":...") and other fields (event, id, retry): ignored
        return events


# ------------------------------------------------------------------ transport

# Bytes asked of the socket per read: a burst of SSE events arrives in few reads.
_READ_SIZE = 256 * 1024
# An HTTP chunk-size line or trailer line longer than this is not from a sane server.
_MAX_CHUNK_LINE = 4096


class ChunkedDecoder:
    """Incremental decoder of HTTP/1.1 ``Transfer-Encoding: chunked`` bodies.

    vLLM (uvicorn) sends every SSE event as its own HTTP chunk. httpx's default
    transport parses those with h11, one pure-Python parser event per chunk,
    which made it the bottleneck of the whole client; this decoder handles all
    complete chunks of a network read in one tight loop and returns their data
    joined. Data of a chunk that is split across reads is returned as it
    arrives, so a large chunk is not held back.
    """

    __slots__ = ("_in_trailers", "_need_crlf", "_pending", "_remaining", "finished")

    def __init__(self) -> None:
        self._pending = b""  # an incomplete size line, CRLF or trailer line
        self._remaining = 0  # data bytes still due in the current chunk
        self._need_crlf = False  # the CRLF that closes a chunk's data is due
        self._in_trailers = False  # the last chunk came; trailer lines until a blank one
        self.finished = False

    def feed(self, data: bytes) -> bytes:
        """Consume the next bytes of the body; return the payload bytes they carry."""
        if self.finished:
            if data:
                raise httpx.RemoteProtocolError("data after the end of a chunked body")
            return b""
        buf = self._pending + data if self._pending else data
        end = len(buf)
        pos = 0
        out: list[bytes] = []
        remaining = self._remaining
        need_crlf = self._need_crlf
        in_trailers = self._in_trailers
        while pos < end:
            if remaining:
                stop = pos + remaining
                if stop > end:
                    out.append(buf[pos:])
                    remaining = stop - end
                    pos = end
                    break
                out.append(buf[pos:stop])
                remaining = 0
                pos = stop
                need_crlf = True
            if need_crlf:
                if end - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise httpx.RemoteProtocolError("chunked body: chunk data not followed by CRLF")
                pos += 2
                need_crlf = False
                continue
            line_end = buf.find(b"\r\n", pos)
            if line_end < 0:
                if end - pos > _MAX_CHUNK_LINE:
                    raise httpx.RemoteProtocolError("chunked body: chunk-size line too long")
                break
            line = buf[pos:line_end]
            pos = line_end + 2
            if in_trailers:
                if not line:
                    self.finished = True
                    if pos != end:
                        raise httpx.RemoteProtocolError("data after the end of a chunked body")
                    break
                continue  # a trailer field: not needed
            try:
                size = int(line, 16)
            except ValueError:
                size = _parse_chunk_size_with_extensions(line)
            if size < 0:
                raise httpx.RemoteProtocolError(f"chunked body: bad chunk-size line {line[:40]!r}")
            if size == 0:
                in_trailers = True
            remaining = size
        self._pending = buf[pos:] if pos < end else b""
        self._remaining = remaining
        self._need_crlf = need_crlf
        self._in_trailers = in_trailers
        if len(out) == 1:
            return out[0]
        return b"".join(out)


def _parse_chunk_size_with_extensions(line: bytes) -> int:
    """The rare chunk-size line with ";name=value" extensions (ignored); off the hot path."""
    try:
        return int(line.split(b";", 1)[0], 16)
    except ValueError:
        raise httpx.RemoteProtocolError(f"chunked body: bad chunk-size line {line[:40]!r}") from None


class _Connection:
    """One keep-alive TCP connection to the server."""

    __slots__ = ("reader", "reused", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.reused = False

    def usable(self) -> bool:
        # A server that closed an idle connection has fed EOF to the reader.
        return not (self.writer.is_closing() or self.reader.at_eof())

    def close(self) -> None:
        self.writer.close()


class _ResponseBody(httpx.AsyncByteStream):
    """The body of one response, read straight off the connection."""

    def __init__(
        self,
        transport: FastHTTPTransport,
        key: tuple[str, int],
        conn: _Connection,
        framing: str,
        length: int,
        keep_alive: bool,
        read_timeout: float | None,
    ) -> None:
        self._transport = transport
        self._key = key
        self._conn: _Connection | None = conn
        self._framing = framing  # "chunked", "length" or "close"
        self._length = length
        self._keep_alive = keep_alive
        self._read_timeout = read_timeout
        self._complete = framing == "length" and length == 0

    async def _read(self) -> bytes:
        assert self._conn is not None
        try:
            if self._read_timeout is None:
                return await self._conn.reader.read(_READ_SIZE)
            async with asyncio.timeout(self._read_timeout):
                return await self._conn.reader.read(_READ_SIZE)
        except TimeoutError:
            raise httpx.ReadTimeout(f"no data for {self._read_timeout:g} s") from None
        except OSError as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__) from exc

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._complete:
            return
        if self._framing == "chunked":
            decoder = ChunkedDecoder()
            while not decoder.finished:
                data = await self._read()
                if not data:
                    raise httpx.RemoteProtocolError(
                        "peer closed connection without sending complete message body"
                    )
                payload = decoder.feed(data)
                if payload:
                    yield payload
        elif self._framing == "length":
            left = self._length
            while left > 0:
                data = await self._read()
                if not data:
                    raise httpx.RemoteProtocolError(
                        "peer closed connection without sending complete message body"
                    )
                if len(data) > left:
                    raise httpx.RemoteProtocolError("response body longer than its Content-Length")
                left -= len(data)
                yield data
        else:  # delimited by the server closing the connection
            while data := await self._read():
                yield data
            self._keep_alive = False
        self._complete = True

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._complete and self._keep_alive:
            self._transport._release(self._key, conn)
        else:
            conn.close()  # unread bytes would corrupt the next response on this connection


class FastHTTPTransport(httpx.AsyncBaseTransport):
    """Minimal HTTP/1.1 transport for plain ``http://`` servers, with keep-alive.

    Exists for speed only (see ``ChunkedDecoder``); it does no TLS, proxies,
    HTTP/2 or Expect: 100-continue, which a vLLM server on the rig never needs.
    StreamingClient uses httpx's own transport for every other URL.
    Errors are raised as the httpx exceptions httpx's transport would raise.
    """

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    def _release(self, key: tuple[str, int], conn: _Connection) -> None:
        if conn.usable():
            conn.reused = True
            self._idle.setdefault(key, []).append(conn)
        else:
            conn.close()

    async def _connect(self, host: str, port: int, timeout: float | None) -> _Connection:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port, limit=_READ_SIZE)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"no connection to {host}:{port} within {timeout:g} s") from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        return _Connection(reader, writer)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            raise httpx.UnsupportedProtocol(
                f"FastHTTPTransport serves http:// only, not {request.url.scheme}://"
            )
        timeouts = request.extensions.get("timeout", {})
        key = (request.url.host, request.url.port or 80)
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.usable():
                break
            conn.close()
        else:
            conn = await self._connect(*key, timeouts.get("connect"))
        try:
            return await self._exchange(request, key, conn, timeouts.get("read"))
        except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError):
            conn.close()
            if not conn.reused:
                raise
        except BaseException:
            conn.close()
            raise
        # A reused keep-alive connection can be closed by the server just as we
        # send; it then saw nothing of the request, so sending it once more on a
        # fresh connection is safe (the same rule httpcore and urllib3 follow).
        conn = await self._connect(*key, timeouts.get("connect"))
        try:
            return await self._exchange(request, key, conn, timeouts.get("read"))
        except BaseException:
            conn.close()
            raise

    async def _exchange(
        self, request: httpx.Request, key: tuple[str, int], conn: _Connection, read_timeout: float | None
    ) -> httpx.Response:
        body = await request.aread()
        if b"chunked" in request.headers.get("transfer-encoding", "").encode():
            # httpx chose chunked framing for a body of unknown length; we have it whole now.
            body = (b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)) if body else b"0\r\n\r\n"
        head = [b"%s %s HTTP/1.1\r\n" % (request.method.encode(), request.url.raw_path)]
        for name, value in request.headers.raw:
            head.append(b"%s: %s\r\n" % (name, value))
        if body and "content-length" not in request.headers:
            head.append(b"Content-Length: %d\r\n" % len(body))
        head.append(b"\r\n")
        try:
            conn.writer.write(b"".join(head) + body)
            await conn.writer.drain()
        except OSError as exc:
            raise httpx.WriteError(str(exc) or type(exc).__name__) from exc

        while True:  # skip 1xx interim responses
            try:
                async with asyncio.timeout(read_timeout):
                    raw_head = await conn.reader.readuntil(b"\r\n\r\n")
            except TimeoutError:
                raise httpx.ReadTimeout(f"no response head within {read_timeout:g} s") from None
            except asyncio.IncompleteReadError:
                raise httpx.RemoteProtocolError("server disconnected without sending a response") from None
            except asyncio.LimitOverrunError:
                raise httpx.RemoteProtocolError("response head too large") from None
            except OSError as exc:
                raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
            status_line, *header_lines = raw_head[:-4].split(b"\r\n")
            parts = status_line.split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
                raise httpx.RemoteProtocolError(f"bad status line {status_line[:80]!r}")
            status = int(parts[1])
            if status >= 200:
                break
        headers: list[tuple[bytes, bytes]] = []
        for line in header_lines:
            name, colon, value = line.partition(b":")
            if not colon:
                raise httpx.RemoteProtocolError(f"bad header line {line[:80]!r}")
            headers.append((name.strip(), value.strip()))
        lowered = {name.lower(): value.lower() for name, value in headers}
        keep_alive = parts[0] == b"HTTP/1.1" and b"close" not in lowered.get(b"connection", b"")
        if request.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            framing, length = "length", 0
        elif b"chunked" in lowered.get(b"transfer-encoding", b""):
            framing, length = "chunked", 0
        elif b"content-length" in lowered:
            try:
                framing, length = "length", int(lowered[b"content-length"])
            except ValueError:
                raise httpx.RemoteProtocolError(
                    f"bad Content-Length {lowered[b'content-length'][:40]!r}"
                ) from None
        else:
            framing, length = "close", 0
        stream = _ResponseBody(self, key, conn, framing, length, keep_alive, read_timeout)
        return httpx.Response(status, headers=headers, stream=stream, extensions={"http_version": parts[0]})

    async def aclose(self) -> None:
        for connections in self._idle.values():
            for conn in connections:
                conn.close()
        self._idle.clear()


# ----------------------------------------------------------------------- request


@dataclass(frozen=True)
class GenerationRequest:
    """One request to send: what the server gets plus the labels of the record.

    Exactly one of ``messages`` (chat API) and ``prompt`` (completions API)
    must be set; that choice picks the endpoint.
    """

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
            raise ValueError(
                f"request {self.request_id!r}: set exactly one of messages (chat API) "
                f"and prompt (completions API)"
            )
        if self.max_tokens < 1:
            raise ValueError(f"request {self.request_id!r}: max_tokens must be >= 1, got {self.max_tokens}")
        # The client relies on streaming with a usage chunk; letting extra_body
        # switch either off would turn every request into a confusing failure.
        overridden = {"stream", "stream_options"} & self.extra_body.keys()
        if overridden:
            raise ValueError(
                f"request {self.request_id!r}: extra_body must not set {sorted(overridden)}; "
                f"the client always streams with usage"
            )

    @property
    def endpoint(self) -> str:
        return CHAT_ENDPOINT if self.messages is not None else COMPLETIONS_ENDPOINT

    def to_body(self) -> dict[str, Any]:
        """The JSON body for the OpenAI-compatible endpoint, ``extra_body`` merged last."""
        body: dict[str, Any] = {"model": self.model}
        if self.messages is not None:
            body["messages"] = self.messages
        else:
            body["prompt"] = self.prompt
        body["max_tokens"] = self.max_tokens
        body["temperature"] = self.temperature
        if self.seed is not None:
            body["seed"] = self.seed
        if self.ignore_eos:
            body["ignore_eos"] = True  # vLLM extension; omitted when off to stay plain OpenAI
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        body.update(self.extra_body)
        return body


# ------------------------------------------------------------------------ record


@dataclass
class RequestRecord:
    """What one request measured. Times are ``time.perf_counter()`` seconds.

    ``first_token_at``/``last_token_at`` are None when no chunk carried text
    (possible with e.g. a server that only reports usage); that is recorded,
    not treated as a failure.
    """

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

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: request sent until the first chunk with text arrived."""
        if self.first_token_at is None:
            return None
        return self.first_token_at - self.started_at

    @property
    def _decode_span_s(self) -> float | None:
        # The first token comes from prefill, so decode speed counts the tokens
        # after it over the time after it (the same definition as vllm bench serve's TPOT).
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
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["chunk_times"] = list(self.chunk_times)
        for name in _DERIVED_KEYS:
            out[name] = getattr(self, name)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        """Inverse of ``to_dict``; derived values are recomputed, not trusted."""
        names = [f.name for f in fields(cls)]
        missing = [name for name in names if name not in data]
        if missing:
            raise ValueError(f"request record {data.get('request_id')!r} lacks {missing}")
        kwargs = {name: data[name] for name in names}
        kwargs["chunk_times"] = list(kwargs["chunk_times"])
        return cls(**kwargs)


_DERIVED_KEYS = ("ttft_s", "tpot_s", "decode_tokens_per_s", "e2e_tokens_per_s", "inter_chunk_latencies_s")


# ------------------------------------------------------------------------ client


class _StallWatchdog:
    """Cancels a task once no bytes arrived for ``limit_s`` seconds.

    Re-arms lazily: a chunk only stores its arrival time, and the timer, when
    it fires, either cancels or re-arms for the remaining time. That keeps the
    per-chunk cost to one clock read, where rescheduling an ``asyncio.timeout``
    per chunk would push a timer handle for every chunk. It is also needed
    because timeouts set on httpx are enforced by its transport, which a test's
    ``MockTransport`` does not do.
    """

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
    saw_done: bool = False


class StreamingClient:
    """Async client for one vLLM server; use as ``async with StreamingClient(...)``.

    ``read_timeout`` bounds the silence between two chunks of a stream;
    ``request_deadline`` bounds a whole request, however steadily it streams.
    The API key is sent as a bearer token and scrubbed from every message.
    Without a ``transport``, plain ``http://`` servers are read through
    ``FastHTTPTransport`` (several times faster on vLLM's one-chunk-per-event
    streams) and anything else through httpx's own transport.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 120.0,
        request_deadline: float = 900.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.read_timeout = read_timeout
        self.request_deadline = request_deadline
        self._api_key = api_key
        # identity: an uncompressed stream can be read with aiter_raw, one layer less per read.
        headers = {"Accept-Encoding": "identity"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        if transport is None and self.base_url.startswith("http://"):
            transport = FastHTTPTransport()
        # Streams get no transport read timeout: generate()'s _StallWatchdog
        # enforces read_timeout more cheaply, and for any transport.
        self._stream_timeout = httpx.Timeout(
            connect=connect_timeout, read=None, write=read_timeout, pool=connect_timeout
        )
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            transport=transport,
            timeout=httpx.Timeout(
                connect=connect_timeout, read=read_timeout, write=read_timeout, pool=connect_timeout
            ),
            # run_requests bounds concurrency itself; a pool limit below it would
            # queue requests inside httpx and charge the wait to TTFT.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )

    def __repr__(self) -> str:
        key = "set" if self._api_key else "none"
        return f"StreamingClient(base_url={self.base_url!r}, api_key={key})"

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- small GETs -------------------------------------------------------------

    async def get_text(self, path: str) -> str:
        """GET ``path`` (e.g. "/metrics") and return the body; RequestError unless 200."""
        where = f"GET {self.base_url}{path}"
        try:
            async with asyncio.timeout(self.request_deadline):
                response = await self._http.get(path)
        except TimeoutError:
            raise self._error(f"{where}: no answer within {self.request_deadline:g} s") from None
        except httpx.HTTPError as exc:
            raise self._transport_error(where, exc) from self._safe_cause(exc)
        if response.status_code != 200:
            raise self._error(
                f"{where}: HTTP {response.status_code}: {response.text[:_HTTP_BODY_QUOTE_CHARS]}"
            )
        return response.text

    async def list_models(self) -> list[str]:
        """Ids of the models the server serves (GET /v1/models)."""
        text = await self.get_text("/v1/models")
        try:
            return [entry["id"] for entry in json.loads(text)["data"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise self._error(
                f"GET {self.base_url}/v1/models: unexpected answer ({exc!r}): {text[:_PAYLOAD_QUOTE_CHARS]}"
            ) from None

    # -- generation ---------------------------------------------------------------

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
            raise self._error(
                f"{where}: exceeded the whole-request deadline of {self.request_deadline:g} s "
                f"after {state.events} events"
            ) from None
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ReadTimeout):
                raise self._stalled(where, state) from None
            raise self._transport_error(where, exc) from self._safe_cause(exc)
        except httpx.HTTPError as exc:
            raise self._transport_error(where, exc) from self._safe_cause(exc)
        finished_at = time.perf_counter()

        if not state.saw_done:
            raise self._error(f"{where}: stream ended without [DONE] after {state.events} events (truncated)")
        if state.usage is None:
            raise self._error(f"{where}: server did not send usage; stream_options.include_usage is required")
        chunk_times = state.chunk_times
        return RequestRecord(
            request_id=req.request_id,
            mode=req.mode,
            prompt_class=req.prompt_class,
            prompt_id=req.prompt_id,
            concurrency=concurrency,
            started_at=started_at,
            first_token_at=chunk_times[0] if chunk_times else None,
            last_token_at=chunk_times[-1] if chunk_times else None,
            finished_at=finished_at,
            chunk_times=chunk_times,
            prompt_tokens=int(state.usage.get("prompt_tokens") or 0),
            completion_tokens=int(state.usage.get("completion_tokens") or 0),
            text="".join(state.text_parts),
            finish_reason=state.finish_reason,
        )

    async def _stream(
        self, req: GenerationRequest, where: str, state: _StreamState, watchdog: _StallWatchdog
    ) -> None:
        """The hot path: read bytes, split events, parse JSON, note text and times."""
        is_chat = req.messages is not None
        decoder = SSEDecoder()
        # raw_decode skips json.loads' two wrapper calls and whitespace regex:
        # a third less time per event, and JSON is the largest cost left here.
        raw_decode = _JSON_DECODER.raw_decode
        perf_counter = time.perf_counter
        clock = watchdog.clock
        chunk_times = state.chunk_times
        text_parts = state.text_parts
        body = req.to_body()
        async with self._http.stream(
            "POST", req.endpoint, json=body, timeout=self._stream_timeout
        ) as response:
            if response.status_code != 200:
                answer = (await response.aread()).decode("utf-8", "replace")
                raise self._error(
                    f"{where}: HTTP {response.status_code} from {self.base_url}{req.endpoint}: "
                    f"{answer[:_HTTP_BODY_QUOTE_CHARS]}"
                )
            encoded = response.headers.get("content-encoding", "identity") != "identity"
            async for raw in response.aiter_bytes() if encoded else response.aiter_raw():
                # One timestamp per network read: every event in it arrived then,
                # and parsing earlier events of the read must not delay later ones.
                received_at = perf_counter()
                watchdog.last_data_at = clock()
                for payload in decoder.feed(raw):
                    state.events += 1
                    if payload == DONE_PAYLOAD:
                        state.saw_done = True
                        continue
                    try:
                        event, end = raw_decode(payload)
                        if end != len(payload):
                            raise ValueError("trailing characters")
                    except ValueError:
                        # The fast path takes no surrounding whitespace; json.loads
                        # decides whether the payload is valid after all.
                        try:
                            event = json.loads(payload)
                        except ValueError:
                            raise self._error(
                                f"{where}: malformed JSON in stream event {state.events}: "
                                f"{payload[:_PAYLOAD_QUOTE_CHARS]!r}"
                            ) from None
                    if type(event) is not dict:
                        raise self._error(
                            f"{where}: stream event {state.events} is not a JSON object: "
                            f"{payload[:_PAYLOAD_QUOTE_CHARS]!r}"
                        )
                    if "error" in event or event.get("object") == "error":
                        raise self._error(f"{where}: server sent an error event: {_describe_error(event)}")
                    choices = event.get("choices")
                    if choices:
                        choice = choices[0]
                        if is_chat:
                            delta = choice.get("delta") or {}
                            text = (
                                delta.get("content")
                                or delta.get("reasoning_content")
                                or delta.get("reasoning")
                            )
                        else:
                            text = choice.get("text")
                        if text:
                            text_parts.append(text)
                            chunk_times.append(received_at)
                        reason = choice.get("finish_reason")
                        if reason is not None:
                            state.finish_reason = reason
                    usage = event.get("usage")
                    if usage:  # the last usage seen is the final one
                        state.usage = usage
            for payload in decoder.close():
                state.events += 1
                if payload == DONE_PAYLOAD:
                    state.saw_done = True

    # -- errors -----------------------------------------------------------------

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
        return self._error(
            f"{where}: read timeout: no data for {self.read_timeout:g} s after {state.events} events"
        )

    def _transport_error(self, where: str, exc: httpx.HTTPError) -> RequestError:
        detail = str(exc) or type(exc).__name__
        if isinstance(exc, httpx.ConnectTimeout):
            what = f"connect timeout to {self.base_url}"
        elif isinstance(exc, httpx.ConnectError):
            what = f"could not connect to {self.base_url}"
        elif isinstance(exc, (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError)):
            what = f"connection to {self.base_url} lost (reset or closed mid-response)"
        elif isinstance(exc, httpx.TimeoutException):
            what = f"{type(exc).__name__} talking to {self.base_url}"
        else:
            what = f"HTTP transport error talking to {self.base_url}"
        return self._error(f"{where}: {what}: {detail}")


def _describe_error(event: dict[str, Any]) -> str:
    """Message and code of a vLLM error event, in either of its two shapes."""
    error = event.get("error")
    source = error if isinstance(error, dict) else event
    message = source.get("message", error if isinstance(error, str) else None)
    code = source.get("code")
    text = str(message) if message is not None else json.dumps(event)[:_PAYLOAD_QUOTE_CHARS]
    return f"{text} (code {code})" if code is not None else text


# ---------------------------------------------------------------------- batching


async def run_requests(
    client: StreamingClient,
    requests: Iterable[GenerationRequest],
    *,
    concurrency: int,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> list[RequestRecord]:
    """Run ``requests`` with at most ``concurrency`` in flight; records in input order.

    Fails fast: the first failure cancels every other request and is re-raised
    as itself (not wrapped in an ExceptionGroup), because one broken request
    already invalidates the measurement and the rest would only waste time.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    slots = asyncio.Semaphore(concurrency)

    async def run_one(req: GenerationRequest) -> RequestRecord:
        async with slots:
            record = await client.generate(req, concurrency=concurrency)
        if on_done is not None:
            on_done(record)
        return record

    # Tasks are created in input order and the semaphore wakes waiters FIFO,
    # so requests also *start* in input order.
    tasks = [asyncio.create_task(run_one(req)) for req in requests]
    try:
        pending: set[asyncio.Task[RequestRecord]] = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            failed = [
                task
                for task in tasks
                if task in done and not task.cancelled() and task.exception() is not None
            ]
            if failed:
                raise failed[0].exception()  # type: ignore[misc]
        return [task.result() for task in tasks]
    finally:
        unfinished = [task for task in tasks if not task.done()]
        for task in unfinished:
            task.cancel()
        if unfinished:
            await asyncio.gather(*unfinished, return_exceptions=True)
