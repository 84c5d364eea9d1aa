"""Stand-in for vLLM's streaming endpoint, for benchmarking specgate's own client.

Run as a script (``python benchmarks/sse_server.py``): it binds 127.0.0.1 on a
free port, prints ``listening on http://127.0.0.1:PORT`` and serves until it
is terminated or its standard input closes (so it never outlives a crashed
parent). It runs in its own process so that the client under test does not
share an event loop, or a core, with the server.

Any POST gets a chat-completion stream shaped like vLLM's: ``max_tokens``
(or ``max_completion_tokens``) content chunks, the last with a finish_reason,
then a usage chunk with ``"choices": []`` and ``[DONE]``, in HTTP/1.1 chunked
encoding as uvicorn sends it. ``sse_interval_s`` in the body paces the chunks;
0 sends the whole stream in one write (a burst). Every content chunk is stamped with its send time,
``time.perf_counter()``, twice: as the field ``"t"`` and as its content text
``"<t>;"`` so that a client that keeps only the text (specgate's
RequestRecord) can still pair each chunk with its send time.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time


def _http_chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _content_chunk(sent_at: str, *, last: bool) -> bytes:
    """One content event as vLLM frames it: one SSE event in one HTTP chunk."""
    finish = '"length"' if last else "null"
    payload = (
        'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
        '"model":"bench","choices":[{"index":0,"delta":{"content":"' + sent_at + ';"},'
        '"logprobs":null,"finish_reason":' + finish + '}],"t":' + sent_at + "}\n\n"
    )
    return _http_chunk(payload.encode())


async def _read_body(reader: asyncio.StreamReader) -> dict[str, object]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return json.loads(await reader.readexactly(length)) if length else {}


async def _stream_completion(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        body = await _read_body(reader)
        events = int(body.get("max_tokens") or body.get("max_completion_tokens") or 2000)  # type: ignore[arg-type]
        interval_s = float(body.get("sse_interval_s") or 0.0)  # type: ignore[arg-type]
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        )
        if interval_s:
            for index in range(events):
                await asyncio.sleep(interval_s)
                # Stamped as late as possible: right before the write.
                writer.write(_content_chunk(repr(time.perf_counter()), last=index == events - 1))
                await writer.drain()
        else:
            # Burst: the whole stream in one write, so that the server's own
            # per-event work cannot be what limits the client's measured rate.
            # Every event carries the time of that write.
            sent_at = repr(time.perf_counter())
            writer.write(
                b"".join(_content_chunk(sent_at, last=index == events - 1) for index in range(events))
            )
        usage = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "bench",
            "choices": [],
            "usage": {"prompt_tokens": 1, "completion_tokens": events, "total_tokens": events + 1},
        }
        writer.write(_http_chunk(f"data: {json.dumps(usage)}\n\n".encode()))
        writer.write(_http_chunk(b"data: [DONE]\n\n"))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass  # the client went away (e.g. a cancelled benchmark): nothing to serve
    finally:
        writer.close()


def _exit_when_stdin_closes() -> None:
    sys.stdin.read()
    os._exit(0)


async def _serve() -> None:
    server = await asyncio.start_server(_stream_completion, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    threading.Thread(target=_exit_when_stdin_closes, daemon=True).start()
    asyncio.run(_serve())
