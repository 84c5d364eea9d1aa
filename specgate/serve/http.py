"""The HTTP settings every client of a vLLM server shares: one TLS context per process, the key."""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default (verifying) TLS context, built once per process (httpx builds one per
    client, reading the CA bundle each time)."""
    return httpx.create_ssl_context()


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The headers that authenticate to a server started with ``--api-key`` (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}
