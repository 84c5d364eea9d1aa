"""record_server: what `--specgate-record-responses` saves from a running server."""

import gzip
import json

import httpx
import pytest

from specgate.measure.record import record_server

pytestmark = pytest.mark.fast

SSE = (b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
       b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}\n\n'
       b"data: [DONE]\n\n")


def test_record_server_saves_raw_streams_requests_and_metrics_window(tmp_path):
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.headers.get("authorization")))
        if request.url.path == "/metrics":
            return httpx.Response(200, text=f"vllm:generation_tokens_total {len(seen)}.0\n")
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=SSE)

    written = record_server("http://lab.invalid:8000", "smol", "ngram", tmp_path / "gpu", api_key="k",
                            transport=httpx.MockTransport(handler))

    assert sorted(p.name for p in written) == sorted([
        "ngram-metrics-before.txt.gz", "ngram-chat-stream.sse", "ngram-chat-request.json",
        "ngram-completions-stream.sse", "ngram-completions-request.json", "ngram-metrics-after.txt.gz"])
    assert [path for _, path, _ in seen] == ["/metrics", "/v1/chat/completions", "/v1/completions", "/metrics"]
    assert {auth for *_, auth in seen} == {"Bearer k"}
    assert (tmp_path / "gpu" / "ngram-chat-stream.sse").read_bytes() == SSE  # byte for byte
    chat = json.loads((tmp_path / "gpu" / "ngram-chat-request.json").read_text())
    assert chat["model"] == "smol" and chat["stream_options"] == {"include_usage": True}
    after = gzip.decompress((tmp_path / "gpu" / "ngram-metrics-after.txt.gz").read_bytes())
    assert after == b"vllm:generation_tokens_total 4.0\n"


def test_record_server_fails_loudly_on_an_http_error(tmp_path):
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text="")
        return httpx.Response(400, json={"error": "bad model"})

    with pytest.raises(httpx.HTTPStatusError, match="400"):
        record_server("http://lab.invalid", "smol", "no_spec", tmp_path, transport=httpx.MockTransport(handler))
