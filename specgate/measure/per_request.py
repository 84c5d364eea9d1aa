"""Each request's acceptance, two ways: vLLM's exact count (``--per-request-spec-decode-metrics``,
``RequestRecord.spec_decode``) and the stream's (one chunk per engine step), which can be off by a
draft cut at max_tokens or steps merged into one chunk. :func:`agreement` compares the accepted
tokens (the steps counted differ: vLLM's carried a draft, the stream's are every decode step)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specgate.measure.client import RequestRecord


def stream_acceptance(completion_tokens: int, chunks: int) -> tuple[int, int] | None:
    """(accepted draft tokens, decode steps) from a stream of ``chunks`` chunks (those with text and
    those without, RequestRecord.empty_chunks): accepted = tokens - chunks, steps = chunks - 1 (the
    first chunk is the prefill's token). None with no decode step seen."""
    if chunks < 2 or completion_tokens < chunks:
        return None
    return completion_tokens - chunks, chunks - 1


def vllm_acceptance(record: RequestRecord) -> tuple[int, int] | None:
    """(accepted draft tokens, steps that carried a draft) as vLLM counted them, or None."""
    spec = record.spec_decode
    if not spec or not isinstance(spec.get("num_accepted_draft_tokens"), int):
        return None
    return spec["num_accepted_draft_tokens"], int(spec.get("num_spec_steps") or 0)


def accepted_per_position(specs: Sequence[dict[str, Any] | None]
                          ) -> tuple[list[int], list[list[int]]] | None:
    """Each request's draft steps and accepted tokens per draft position (position i: the steps that
    accepted i tokens or more, as vLLM's per-position counters count), from vLLM's per-request
    histograms (``RequestRecord.spec_decode``); None unless every request has one of the same
    length."""
    histograms = [(spec or {}).get("acceptance_histogram") for spec in specs]
    if not histograms or any(not isinstance(h, list) or len(h) != len(histograms[0])
                             for h in histograms):
        return None
    positions = [[sum(h[i:]) for i in range(1, len(h))] for h in histograms]
    return [sum(h) for h in histograms], positions


@dataclass(frozen=True)
class Agreement:
    """The stream's count against vLLM's, request by request: (key, stream, vLLM, allowed low) each;
    a request agrees when vLLM - one draft (cut at max_tokens) <= stream <= vLLM."""

    rows: tuple[tuple[str, int, int, int], ...]

    @property
    def disagreeing(self) -> list[tuple[str, int, int, int]]:
        return [row for row in self.rows if not row[3] <= row[1] <= row[2]]

    def text(self) -> str:
        off = self.disagreeing
        agree = len(self.rows) - len(off)
        head = f"{agree} of {len(self.rows)} requests' streams agree with vLLM's own count"
        if not off:
            return head
        shown = ", ".join(f"{key} {stream} vs {vllm}" for key, stream, vllm, _ in off[:3])
        return f"{head} (accepted tokens, stream vs vLLM: {shown}{', ...' if len(off) > 3 else ''})"


def agreement(keys: Sequence[str], records: Sequence[RequestRecord]) -> Agreement | None:
    """The stream's accepted tokens against vLLM's for every request that has both; None where none
    has."""
    rows = []
    for key, r in zip(keys, records, strict=True):
        ours = stream_acceptance(r.completion_tokens, len(r.chunk_times) + r.empty_chunks)
        theirs = vllm_acceptance(r)
        if ours is None or theirs is None:
            continue
        drafted = int((r.spec_decode or {}).get("num_spec_tokens") or 0)
        cut = drafted if r.finish_reason == "length" else 0
        rows.append((key, ours[0], theirs[0], theirs[0] - cut))
    return Agreement(tuple(rows)) if rows else None
