"""The highest event rate a real vLLM server sends specgate's client: the figure the client
benchmark's rule is set against (docs/client-benchmark.md).

Usage: ``python -m specgate_lab.analyses.lab_peak_rate (--rig NAME | --url URL --model NAME) [--streams 1,8,32]
[--max-tokens 256] [--json OUT]``: with ``--rig``, it starts that rig's reference mode (no
speculation: the lab's fastest) exactly as the perf tests do, and stops it afterwards. For each
concurrency it sends that many streams at once, twice, through ``specgate.measure.client`` and prints
the events per second the client took in (all streams together), each stream's median time
between events and its time per output token.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

from specgate.measure.client import GenerationRequest, StreamingClient, run_requests

PROMPT = "Write a long, detailed essay on the history of the printing press."


async def one_level(url: str, model: str, streams: int, max_tokens: int) -> dict:
    requests = [GenerationRequest(request_id=f"peak/{streams}/{i}", mode="peak", prompt_class="peak",
                                  prompt_id=str(i), model=model, max_tokens=max_tokens, ignore_eos=True,
                                  messages=[{"role": "user", "content": f"{PROMPT} ({i})"}])
                for i in range(2 * streams)]
    async with StreamingClient(url, read_timeout=60, request_deadline=300) as client:
        started = time.perf_counter()
        records = await run_requests(client, requests, concurrency=streams)
        wall = time.perf_counter() - started
    gaps = [statistics.median(r.inter_chunk_latencies_s) * 1e3 for r in records if r.inter_chunk_latencies_s]
    events = sum(len(r.chunk_times) for r in records)
    tokens = sum(r.completion_tokens for r in records)
    return {
        "streams": streams, "requests": len(records), "wall_s": round(wall, 3),
        "events_per_s": round(events / wall), "tokens_per_s": round(tokens / wall),
        "stream_median_event_gap_ms": [round(min(gaps), 3), round(statistics.median(gaps), 3), round(max(gaps), 3)],
        "stream_tpot_ms": [round(min(r.tpot_s for r in records if r.tpot_s) * 1e3, 3),
                           round(statistics.median(r.tpot_s for r in records if r.tpot_s) * 1e3, 3)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--rig", help="start this rig's reference mode (e.g. h200-smollm2)")
    target.add_argument("--url", help="a live server")
    parser.add_argument("--model", help="with --url: the served model name")
    parser.add_argument("--streams", default="1,8,32")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url, model = args.url, args.model
        if args.rig:
            from specgate.config.rig import load_rig
            from specgate.serve.server import VLLMServer, spec_for_mode

            rig = load_rig(args.rig, Path(__file__).resolve().parents[3] / "fixtures")
            log_dir = Path(tempfile.mkdtemp(prefix="specgate-peak-"))
            server = stack.enter_context(VLLMServer(spec_for_mode(rig, rig.mode(rig.reference_mode),
                                                                  log_dir=log_dir), progress=print))
            url, model = server.base_url, rig.served_model_name
        elif not model:
            parser.error("--url needs --model")
        results = []
        for streams in (int(s) for s in args.streams.split(",")):
            result = asyncio.run(one_level(url, model, streams, args.max_tokens))
            print(json.dumps(result), flush=True)
            results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
