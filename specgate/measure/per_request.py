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
    """(accepted draft tokens, decode steps) from a stream of ``chunks`` chunks, text or not:
    tokens - chunks and chunks - 1 (the first is the prefill's); None with no decode step."""
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
    """Each request's draft steps and accepted tokens per position (as vLLM's counters count), from
    its per-request histograms; None unless every request has one of the same length."""
    histograms = [(spec or {}).get("acceptance_histogram") for spec in specs]
    if not histograms or any(not isinstance(h, list) or len(h) != len(histograms[0])
                             for h in histograms):
        return None
    positions = [[sum(h[i:]) for i in range(1, len(h))] for h in histograms]
    return [sum(h) for h in histograms], positions


@dataclass(frozen=True)
class Agreement:
    """The stream's count against vLLM's: (key, stream, vLLM, allowed low) per request; it agrees
    when vLLM - one draft (cut at max_tokens) <= stream <= vLLM."""

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
    """The stream's accepted tokens against vLLM's for every request that has both, or None."""
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
