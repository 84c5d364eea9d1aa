"""The GPU lab rigs as data: CUDA graphs on, two servers fit on one H200, and the GPU-bound rig's
synthetic-acceptance modes are configs vLLM 0.26 accepts (its checks restated: vllm/config/
speculative.py, SpeculativeConfig._resolve_synthetic_acceptance_rates)."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from specgate.config.rig import load_rig

pytestmark = pytest.mark.fast

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LAB_RIGS = ("h200-smollm2", "h200-llama8b-dummy", "h200-wide15b-dummy")


def _arg(rig, flag: str) -> str:
    args = list(rig.extra_args)
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("name", LAB_RIGS)
def test_lab_rigs_run_with_cuda_graphs_and_two_servers_fit(name: str) -> None:
    rig = load_rig(name, FIXTURES)
    assert "--enforce-eager" not in rig.argv_prefix, "the lab rigs run as vLLM is deployed: CUDA graphs"
    # A duet keeps the reference and one mode live on the one GPU.
    assert rig.duet and 2 * float(_arg(rig, "--gpu-memory-utilization")) <= 0.9


def test_gpu_bound_rig_runs_the_weightless_8b_model_with_known_acceptance() -> None:
    rig = load_rig("h200-llama8b-dummy", FIXTURES)
    assert _arg(rig, "--load-format") == "dummy" and _arg(rig, "--dtype") == "bfloat16"
    assert rig.model == "/root/models/llama8b-dummy"  # lab/scripts/gpu-lab-prepare.sh writes it
    synthetic = {m.name: m.speculative_config for m in rig.modes
                 if m.speculative_config and m.speculative_config.get("rejection_sample_method") == "synthetic"}
    assert len(synthetic) >= 2
    lengths = []
    for name, spec in synthetic.items():
        k = spec["num_speculative_tokens"]
        # draft_model and EAGLE-3 draft k tokens every step, so the acceptance is the synthetic one alone.
        # Drafts prepare-shape writes (the 8B shape cut to 4 or 1 layers; the lab's prepare script
        # writes each folder a mode names) or the kit's SmolLM2 (same vocabulary).
        # An EAGLE-3 mode's head is prepare-shape's dummy head of the target's shape.
        prepare = (FIXTURES.parent / "lab" / "scripts" / "gpu-lab-prepare.sh").read_text()
        if spec["method"] == "eagle3":
            assert spec["model"] == "/root/models/llama8b-dummy-eagle3", name
            assert f"--dummy-llama8b-eagle3 {spec['model']}" in prepare
        else:
            assert spec["method"] == "draft_model", name
            assert spec["model"] in ("/root/models/llama8b-dummy-draft4l", "/root/models/llama8b-dummy-draft1l",
                                     "/root/models/smollm2-135m"), name
            assert (spec["model"].startswith("/root/models/smollm2")
                    or f"--dummy-llama8b-draft {spec['model']}" in prepare)
        assert ("synthetic_acceptance_length" in spec) != ("synthetic_acceptance_rates" in spec), name
        if "synthetic_acceptance_length" in spec:
            length = spec["synthetic_acceptance_length"]
            assert 1.0 <= length <= k + 1, name
        else:
            rates = spec["synthetic_acceptance_rates"]
            assert len(rates) == k and all(0 <= r <= 1 for r in rates), name
            assert all(a >= b for a, b in pairwise(rates)), f"{name}: rates must not increase"
            length = 1 + sum(rates)
        lengths.append(length)
    # Spanning acceptance, so the break-even diagnosis sees speculation pay and backfire.
    assert min(lengths) <= 1.5 and max(lengths) >= 3.0
    # The gated pair drafts with the GPU-bound draft; the 135M one is overhead-bound (docs/journal/lab).
    assert {synthetic[m]["model"] for m in ("draft_al15", "draft_al30")} == {"/root/models/llama8b-dummy-draft4l"}
    for mode in rig.modes:
        if mode.speculative_config and mode.name not in synthetic:
            pytest.fail(f"mode {mode.name}: on random weights only synthetic acceptance is known")


def test_the_wide_rig_runs_the_draft_path_on_folders_the_lab_prepare_script_writes() -> None:
    rig = load_rig("h200-wide15b-dummy", FIXTURES)
    prepare = (FIXTURES.parent / "lab" / "scripts" / "gpu-lab-prepare.sh").read_text()
    assert _arg(rig, "--load-format") == "dummy" and "--shape wide15b" in prepare
    assert f"--dummy-llama8b {rig.model}" in prepare
    drafts = {m.name: m.speculative_config for m in rig.modes if m.speculative_config}
    assert drafts, "the rig exists for its draft-model modes"
    for name, spec in drafts.items():
        assert spec["method"] == "draft_model" and spec["rejection_sample_method"] == "synthetic", name
        assert f"--dummy-llama8b-draft {spec['model']}" in prepare, name
        assert 1.0 <= spec["synthetic_acceptance_length"] <= spec["num_speculative_tokens"] + 1, name
