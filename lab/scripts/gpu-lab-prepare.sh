#!/bin/bash
# Prepare the GPU lab machine for specgate, once per visit, right after the kit's device-setup.sh
# (../shared/gpu-lab/README.md). Idempotent and quick (no model weights are written); gpu-lab-run.sh
# runs it again before every run, so a run on a machine that was only staged still works.
#   bash lab/scripts/gpu-lab-prepare.sh            (from the repository root on the lab machine)
# - /root/vllm-cache: vLLM's compile cache (VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR), kept between the
#   runs of one visit while the machine stays warm;
# - /root/extra: packages from .gpu-lab/extra/pkg when that folder is carried (httpx-sse, httpx-aiohttp:
#   unpacked wheels, e.g. `pip download --no-deps httpx-sse httpx-aiohttp` then unzip each into
#   .gpu-lab/extra/pkg; the image has aiohttp), and declares
#   the lab's vLLM plugin (the slowdown injector, lab/specgate_lab/inject.py), since
#   specgate and specgate_lab are on PYTHONPATH, not installed, and vLLM finds plugins through entry points;
# - /root/models/llama8b-dummy, llama8b-dummy-draft4l, -draft1l and llama8b-dummy-eagle3: the GPU-bound rig's
#   Llama-3-8B-shaped model, its 4-layer and 1-layer drafts and an EAGLE-3 head of its shape, config and SmolLM2's tokenizer only (vLLM fills the weights with
#   --load-format dummy); /root/models/wide15b-dummy and -draft1l: the same at width 6144 (--shape wide15b);
# - prints what the lab machine is (versions, GPU clocks and limits, the telemetry readers found) and
#   keeps it in /root/runs/lab-machine.txt (copied to $OUT when set).
set -euo pipefail
export PYTHONPATH="/root/site:/root/extra:$PWD:$PWD/lab" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export VLLM_CACHE_ROOT=/root/vllm-cache TORCHINDUCTOR_CACHE_DIR=/root/vllm-cache/inductor
mkdir -p /root/vllm-cache /root/extra /root/runs
# Pure-Python packages specgate needs that the lab image lacks (httpx-sse, httpx-aiohttp), when the run carries
# the git-ignored .gpu-lab/extra (unpacked wheels under pkg/).
if [ -d .gpu-lab/extra/pkg ]; then cp -r .gpu-lab/extra/pkg/. /root/extra/; fi
# py-spy (the binary from PyPI's py_spy wheel, under .gpu-lab/extra/bin) for lab/scripts/core-canary.py's
# profile bursts (PYSPY=1 in gpu-lab-run.sh).
if [ -d .gpu-lab/extra/bin ]; then mkdir -p /root/extra/bin && cp .gpu-lab/extra/bin/* /root/extra/bin/; fi
python3 -c "import httpx_sse, httpx_aiohttp" 2>/dev/null || {
  echo "gpu-lab-prepare: httpx_sse or httpx_aiohttp is missing: carry .gpu-lab/extra once (see the script's header)" >&2
  exit 1; }
# The lab's entry points as lab/pyproject.toml declares them (the injector's variables in a kept server's
# fingerprint: specgate.server_env).
if ! grep -qs "specgate.server_env" /root/extra/specgate_lab-0.dist-info/entry_points.txt; then
  mkdir -p /root/extra/specgate_lab-0.dist-info
  printf 'Metadata-Version: 2.1\nName: specgate-lab\nVersion: 0\n' > /root/extra/specgate_lab-0.dist-info/METADATA
  printf '[vllm.general_plugins]\nspecgate_slowdown = specgate_lab.inject:register\n[specgate.server_env]\nspecgate_slowdown = specgate_lab.inject:ENV_PREFIXES\n' \
    > /root/extra/specgate_lab-0.dist-info/entry_points.txt
fi
if [ ! -f /root/models/llama8b-dummy/config.json ] || [ ! -f /root/models/llama8b-dummy-draft4l/config.json ] \
   || [ ! -f /root/models/llama8b-dummy-eagle3/config.json ]; then
  [ -f /root/models/smollm2-135m/config.json ] || {
    echo "gpu-lab-prepare: /root/models/smollm2-135m is missing: stage the kit first (device-setup.sh)" >&2; exit 1; }
  python3 -m specgate_lab prepare-shape --dummy-llama8b /root/models/llama8b-dummy \
    --dummy-llama8b-draft /root/models/llama8b-dummy-draft4l \
    --dummy-llama8b-eagle3 /root/models/llama8b-dummy-eagle3 --source /root/models/smollm2-135m
fi
# The 1-layer draft of the 8B shape (modes draft1l_*): the draft path with the least host work per pass.
if [ ! -f /root/models/llama8b-dummy-draft1l/config.json ]; then
  python3 -m specgate_lab prepare-shape --dummy-llama8b-draft /root/models/llama8b-dummy-draft1l --draft-layers 1 \
    --source /root/models/smollm2-135m
fi
# The wide15b shape (width 6144, 15.5 B parameters, ~1.8x the 8B's GPU time per step for the same
# kernel launches) and its 1-layer draft: the rig h200-wide15b-dummy, where the draft path's step is the GPU's.
if [ ! -f /root/models/wide15b-dummy/config.json ] || [ ! -f /root/models/wide15b-dummy-draft1l/config.json ]; then
  python3 -m specgate_lab prepare-shape --shape wide15b --dummy-llama8b /root/models/wide15b-dummy \
    --dummy-llama8b-draft /root/models/wide15b-dummy-draft1l --draft-layers 1 --source /root/models/smollm2-135m
fi
# The EAGLE-3 backfire fixture (random weights, valid config; seconds), for h200-smollm2-eagle3.
if [ ! -f /root/models/smollm2-135m-eagle3-untrained/config.json ]; then
  python3 -m specgate_lab train-eagle3 --untrained --target /root/models/smollm2-135m \
    --out /root/models/smollm2-135m-eagle3-untrained
fi
if [ "${1:-}" = "--quiet" ]; then exit 0; fi
{
  echo "prepared $(date -u +%FT%TZ) on $(hostname), $(nproc) cores"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit,clocks.sm,power.draw,temperature.gpu,persistence_mode,compute_mode --format=csv 2>&1 || true
  nvidia-smi -q -d PERFORMANCE 2>&1 | grep -v '^$' | head -40 || true
  python3 - <<'PY'
import importlib.metadata as md
for name in ("vllm", "torch", "transformers", "nvidia-ml-py", "psutil", "httpx-sse", "httpx-aiohttp", "aiohttp"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name}: not installed")
eps = [e.name for e in md.entry_points(group="vllm.general_plugins")]
print("vllm.general_plugins:", eps)
from specgate.measure.telemetry import Telemetry
t = Telemetry.for_rig("gpu", "0")
with t:
    pass
print("telemetry readers:", t.sources, "; one sample:", t.samples[-1][1])
PY
  ls -la /root/models/llama8b-dummy /root/models/llama8b-dummy-draft4l /root/models/llama8b-dummy-draft1l /root/models/llama8b-dummy-eagle3 \
    /root/models/wide15b-dummy /root/models/wide15b-dummy-draft1l
} 2>&1 | tee /root/runs/lab-machine.txt
if [ -n "${OUT:-}" ]; then cp /root/runs/lab-machine.txt "$OUT/"; fi
