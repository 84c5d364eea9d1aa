"""The HTTP settings every client of a vLLM server shares: one TLS context per process, the key."""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default (verifying) TLS context, built once per process for every client specgate makes:
    httpx builds a new one per client (and per transport), reading the CA bundle each time (~20-50 ms
    of CPU), though specgate's servers are mostly plain-HTTP ones on this host."""
    return httpx.create_ssl_context()



def auth_headers(api_key: str | None) -> dict[str, str]:
    """The headers that authenticate to a vLLM server started with ``--api-key`` (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}

