"""The slowdown injector (lab/specgate_lab/inject.py) against a real vLLM on CPU: a server started with
SPECGATE_SLOWDOWN_FILE, requests alternated between fraction 0 and 0.5 (pairs of the same prompt),
decided with the gates' own paired statistic. Each engine step 50 % longer must show as a clear
slowdown of the client-measured decode rate, and of vLLM's own time per output token."""

import asyncio
from pathlib import Path

import pytest

from specgate.config.rig import Side, load_rig
from specgate.decide.paired import paired_ratio
from specgate.measure.client import StreamingClient
from specgate.measure.protocol import build_requests
from specgate.report.verdicts import ratio_text
from specgate.serve.server import VLLMServer, spec_for_mode
from specgate_lab.inject import ENV_FILE

pytestmark = [pytest.mark.cpu, pytest.mark.faults]

ROOT = Path(__file__).resolve().parents[2]
FRACTION = 0.5


def _tpot_sum_count(text: str) -> tuple[float, float]:
    """vLLM's request_time_per_output_token histogram from /metrics text: (sum, count)."""
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("vllm:request_time_per_output_token_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:request_time_per_output_token_seconds_count"):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


def test_injected_slowdown_slows_the_real_engine(tmp_path, record_property):
    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    level = tmp_path / "slowdown"
    level.write_text("0\n")
    mode = rig.mode("no_spec")
    spec = spec_for_mode(rig, mode, log_dir=tmp_path, side=Side(env={ENV_FILE: str(level)}), side_name="injected")
    coding = next(c for c in rig.prompt_classes if c.name == "coding")
    requests = build_requests(rig, mode, coding)

    async def one(client, request, fraction):
        level.write_text(f"{fraction}\n")
        await asyncio.sleep(0.3)  # the plugin re-reads the file at most every 0.2 s
        before = _tpot_sum_count(await client.get_text("/metrics"))
        record = await client.generate(request)
        after = _tpot_sum_count(await client.get_text("/metrics"))
        return record.decode_tokens_per_s, (after[0] - before[0]) / max(after[1] - before[1], 1)

    async def pairs(base_url):
        plain, slowed, tpot_plain, tpot_slowed = [], [], [], []
        async with StreamingClient(base_url, read_timeout=rig.protocol.read_timeout_s) as client:
            await client.generate(requests[0])  # warm-up
            for i, request in enumerate(requests + requests[:2]):  # 8 pairs, ABBA
                order = (0.0, FRACTION) if i % 2 == 0 else (FRACTION, 0.0)
                got = {f: await one(client, request, f) for f in order}
                plain.append(got[0.0][0])
                slowed.append(got[FRACTION][0])
                tpot_plain.append(got[0.0][1])
                tpot_slowed.append(got[FRACTION][1])
        return plain, slowed, tpot_plain, tpot_slowed

    with VLLMServer(spec) as server:
        plain, slowed, tpot_plain, tpot_slowed = asyncio.run(pairs(server.base_url))
    assert "[specgate_lab.inject]" in spec.log_path.read_text()  # the plugin loaded in the server

    client_side = paired_ratio(slowed, plain, threshold=1.0)
    server_side = paired_ratio(tpot_slowed, tpot_plain, threshold=1.0)  # time per token: higher is slower
    record_property("decode_ratio", round(client_side.ratio, 3))
    record_property("server_tpot_ratio", round(server_side.ratio, 3))
    print(f"injected {FRACTION}: decode {ratio_text(client_side.to_dict(), 'uninjected')}; "
          f"vLLM TPOT x{server_side.ratio:.3f} ({server_side.ci_low:.3f}-{server_side.ci_high:.3f})")
    assert client_side.verdict == "slower" and client_side.ci_high < 0.9, ratio_text(client_side.to_dict(), "0")
    assert server_side.ci_low > 1.1, f"vLLM's own TPOT ratio {server_side.ratio:.3f} ({server_side.ci_low:.3f}-)"
