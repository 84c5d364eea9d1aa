#!/bin/bash
# Run the gpu tier on the GPU lab machine (see ../shared/gpu-lab/README.md), after staging.
#   SPECGATE_COMMIT=<sha> [RIG=h200-smollm2] [LAB_TIMEOUT_S=540] bash scripts/gpu-lab-run.sh NAME [pytest args...]
# SPECGATE_COMMIT: the device's copied tree carries a stale .git, so pass the commit from the
# checkout that sent it (SPECGATE_COMMIT=$(git rev-parse --short HEAD) in the device command).
# pytest gets SIGINT at LAB_TIMEOUT_S (its servers are torn down), so the results still come back:
# the log, JUnit XML, report, summary, plots, server logs, baselines and any --record-responses
# folder under /root/runs/NAME are packed into $OUT/NAME.tgz (the device tool returns 8 files at most).
set -uo pipefail
name="$1"; shift
rig="${RIG:-h200-smollm2}"
export PYTHONPATH="/root/site:/root/extra:$PWD" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
# vLLM's compile cache survives between the runs of one lab visit (the machine keeps /root while
# warm): the second start of a config skips torch.compile.
export VLLM_CACHE_ROOT=/root/vllm-cache TORCHINDUCTOR_CACHE_DIR=/root/vllm-cache/inductor
mkdir -p /root/vllm-cache /root/extra
# specgate is on PYTHONPATH, not installed: declare its vLLM plugin (the slowdown injector,
# specgate/inject.py) so vLLM's entry-point scan finds it.
if [ ! -d /root/extra/specgate_lab-0.dist-info ]; then
  mkdir -p /root/extra/specgate_lab-0.dist-info
  printf 'Metadata-Version: 2.1\nName: specgate-lab\nVersion: 0\n' > /root/extra/specgate_lab-0.dist-info/METADATA
  printf '[vllm.general_plugins]\nspecgate_slowdown = specgate.inject:register\n' \
    > /root/extra/specgate_lab-0.dist-info/entry_points.txt
fi
# The GPU-bound rig's model: Llama-3-8B-shaped, no weights (--load-format dummy).
[ -f /root/models/llama8b-dummy/config.json ] || python3 -m specgate prepare-model \
  --dummy-llama8b /root/models/llama8b-dummy --source /root/models/smollm2-135m
run="/root/runs/$name"
mkdir -p "$run"
echo "lab run $name: rig $rig, started $(date -u +%FT%TZ)" | tee "$run/started.txt"
nvidia-smi --query-gpu=index,name,memory.used --format=csv > "$run/gpu-before.csv" 2>&1
start=$(date +%s)
timeout -s INT -k 30 "${LAB_TIMEOUT_S:-540}" \
  python3 -m pytest -p specgate.plugin -c pyproject.toml --rootdir "$PWD" perf_tests -m gpu --rig "$rig" -p no:cacheprovider --run-dir "$run" \
  --junitxml "$run/junit.xml" "$@" 2>&1 | tee "$run/pytest.log" | grep -v "requests, " | tail -150
rc=${PIPESTATUS[0]}
echo "pytest exit $rc after $(( $(date +%s) - start ))s"
cp baselines.json "$run/baselines.json"
nvidia-smi --query-gpu=index,name,memory.used --format=csv > "$run/gpu-after.csv" 2>&1
cat "$run/gpu-after.csv"
find "$run" -name 'server-*.log' -size +1M -exec sh -c 'tail -c 1000000 "$1" > "$1.tail" && mv "$1.tail" "$1"' _ {} \;
tar czf "$OUT/$name.tgz" -C /root/runs "$name"
exit 0
