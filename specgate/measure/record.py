"""Record real vLLM responses for the fast tier's replay tests.

Per mode: a streamed chat and text completion (raw SSE bytes) and ``/metrics`` before and after,
which the fast tier replays through the client and the metrics parser. During a perf run
(``--specgate-record-responses=DIR``), or each mode's server started for it (:func:`record_rig`).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx

from specgate.config.rig import Rig
from specgate.serve.http import auth_headers, tls_context
from specgate.serve.server import VLLMServer, spec_for_mode

PROMPT = ("Copy this list exactly, then add two more items in the same style: red apple, green "
          "pear, yellow lemon.")


def record_rig(rig: Rig, out_dir: Path, *, modes: list[str] | None = None, max_tokens: int = 48,
               log=print) -> list[Path]:
    """Start each mode's server in turn and record it."""
    import tempfile

    logs = Path(tempfile.mkdtemp(prefix="specgate-record-"))  # server logs stay out of fixtures/
    written: list[Path] = []
    for mode in rig.modes:
        if modes and mode.name not in modes:
            continue
        spec = spec_for_mode(rig, mode, log_dir=logs)
        with VLLMServer(spec, progress=log) as server:
            written += record_server(server.base_url, rig.served_model_name, mode.name, out_dir,
                                     max_tokens=max_tokens)
        log(f"recorded mode {mode.name} into {out_dir} (server log: {spec.log_path})")
    return written


def record_server(base_url: str, served_model_name: str, mode_name: str, out_dir: Path, *,
                  max_tokens: int = 48, api_key: str | None = None, timeout_s: float = 300,
                  transport: httpx.BaseTransport | None = None) -> list[Path]:
    """Record one running server: /metrics, a streamed chat and text completion, /metrics."""
    out_dir.mkdir(parents=True, exist_ok=True)
    headers = auth_headers(api_key)
    written: list[Path] = []
    with httpx.Client(base_url=base_url, timeout=timeout_s, headers=headers, transport=transport,
                      verify=tls_context()) as http:
        written.append(_save(out_dir / f"{mode_name}-metrics-before.txt.gz",
                             _gzipped(http.get("/metrics").text)))
        common = {"model": served_model_name, "max_tokens": max_tokens, "temperature": 0.0,
                  "seed": 0, "stream": True, "stream_options": {"include_usage": True},
                  "ignore_eos": True}
        chat = {**common, "messages": [{"role": "user", "content": PROMPT}]}
        for name, path, body in (
            ("chat", "/v1/chat/completions", chat),
            ("completions", "/v1/completions", {**common, "prompt": PROMPT})):
            with http.stream("POST", path, json=body) as response:
                response.raise_for_status()
                raw = response.read()
            written.append(_save(out_dir / f"{mode_name}-{name}-stream.sse", raw))
            written.append(_save(out_dir / f"{mode_name}-{name}-request.json",
                                 (json.dumps(body, indent=2) + "\n").encode()))
        written.append(_save(out_dir / f"{mode_name}-metrics-after.txt.gz",
                             _gzipped(http.get("/metrics").text)))
    return written


def _gzipped(text: str) -> bytes:
    """A /metrics page compressed, the same bytes for the same text."""
    return gzip.compress(text.encode(), mtime=0)


def _save(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path
