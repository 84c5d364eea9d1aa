"""Dummy models of a given shape for the GPU lab's rigs (``python -m specgate_lab prepare-shape``):
Llama-shaped folders with no weights (``vllm serve --load-format dummy``) whose decode step is bound
by the GPU, and an EAGLE-3 head's config shaped for them. The cpu tier's real model is the product's
(``specgate.serve.model_prep``)."""

from __future__ import annotations

import json
from pathlib import Path

from specgate.errors import SpecgateError

# Llama-3-8B's shape: big enough that a decode step on an H200 is bound by the GPU (with SmolLM2's
# 49152-token vocabulary, 7.38 B parameters: 14.8 GB of bf16 weights read per step), not by vLLM's
# CPU-side overhead as the 135M model's ~2 ms steps are.
LLAMA8B_SHAPE = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "intermediate_size": 14336, "head_dim": 128}
# Its draft for the GPU-bound rig: the same shape cut to fewer layers (prepare-model --draft-layers,
# default 4: 1.27 B parameters with the vocabulary, 2.5 GB read per draft pass, ~1/6 of a target
# step and still the GPU's time, where SmolLM2-135M's 30 thin layers are launch overhead; vLLM 0.26
# runs draft_model without the model runner V2, and the 135M draft's ratio moved 30 % between two
# sessions).
# A wider model of the same depth (width 6144, 1.5x the 8B's: 48 heads of 128, MLP 20480): 15.5 B
# parameters with SmolLM2's vocabulary, 31 GB (28.9 GiB) read per step, 2.1x the 8B's weights and
# ~1.8x its GPU time per plain step on an H200 (122 against 217 tok/s,
# docs/journal/lab/2026-12-03-h200-visit17.md) for the same
# layers, so the same kernel launches: vLLM's host work per step grows with the layers it launches,
# not their width. Two fit side by side on one H200 at 0.4 of its memory each. For the draft path,
# whose host work per step on the 8B shape is close to the GPU's and so moves with the host's speed.
WIDE15B_SHAPE = {**LLAMA8B_SHAPE, "hidden_size": 6144, "num_attention_heads": 48, "intermediate_size": 20480}
SHAPES = {"llama8b": LLAMA8B_SHAPE, "wide15b": WIDE15B_SHAPE}


def write_dummy_llama(source: Path, out: Path, shape: str = "llama8b", layers: int | None = None) -> Path:
    """A Llama-shaped model folder with no weights, for ``vllm serve --load-format dummy``: the
    config of ``source`` (a Llama HF folder, here SmolLM2-135M) with the named ``shape`` of
    ``SHAPES`` put in (cut to ``layers`` layers when given: a draft of the same shape), and
    ``source``'s tokenizer, chat template and vocabulary, so prompts and draft models of the same
    vocabulary work unchanged. Returns ``out``."""
    import shutil

    if shape not in SHAPES:
        raise SpecgateError(f"shape {shape!r}: expected one of {', '.join(SHAPES)}")
    depth = SHAPES[shape]["num_hidden_layers"]
    if layers is not None and not 1 <= layers <= depth:
        raise SpecgateError(f"--draft-layers {layers}: a draft of the {shape} shape has 1 to {depth} layers")
    try:
        config = json.loads((source / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise SpecgateError(f"{source}/config.json: cannot read the source model's config ({exc})") from None
    if config.get("model_type") != "llama":
        raise SpecgateError(f"{source}/config.json: model_type {config.get('model_type')!r}, expected 'llama'")
    config.update(SHAPES[shape])
    if layers is not None:
        config["num_hidden_layers"] = layers
    config["architectures"] = ["LlamaForCausalLM"]
    config["tie_word_embeddings"] = False
    config["_specgate"] = (f"dummy weights (vllm --load-format dummy); shape {shape} with "
                           f"{config['num_hidden_layers']} layers; tokenizer of {source}")
    out.mkdir(parents=True, exist_ok=True)
    # Whatever transformers version wrote the source: tokenizer.json or vocab/merges, the template
    # inside tokenizer_config.json or beside it. Never a weight file (the point is to have none).
    for pattern in ("tokenizer*", "vocab.*", "merges.txt", "special_tokens_map.json", "added_tokens.json",
                    "chat_template.*", "generation_config.json"):
        for path in source.glob(pattern):
            if path.is_file():
                shutil.copy2(path, out / path.name)
    if not (out / "tokenizer.json").exists() and not (out / "vocab.json").exists():
        raise SpecgateError(f"{source}: no tokenizer files (tokenizer.json or vocab.json) to copy")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
