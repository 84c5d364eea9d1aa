#!/bin/bash
# Run the gpu tier on the GPU lab machine (see ../shared/gpu-lab/README.md), after staging.
#   bash scripts/gpu-lab-run.sh NAME [pytest args...]
# Writes the log, report, summary and plots to $OUT/NAME/ (the device tool brings $OUT back).
set -uo pipefail
name="$1"; shift
export PYTHONPATH="/root/site:/root/extra:$PWD" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT/$name"
start=$(date +%s)
python3 -m pytest -p specgate.plugin -m gpu --rig h200-smollm2 -p no:cacheprovider --run-dir "/root/runs/$name" \
  --junitxml "$OUT/$name/junit.xml" "$@" 2>&1 | tee "$OUT/$name/pytest.log" | grep -v "requests, " | tail -120
rc=${PIPESTATUS[0]}
echo "pytest exit $rc after $(( $(date +%s) - start ))s"
cp baselines.json "$OUT/$name/baselines.json" 2>/dev/null
cp /root/runs/$name/report.json /root/runs/$name/summary.md /root/runs/$name/*.png "$OUT/$name/" 2>/dev/null
for f in /root/runs/$name/server-*.log; do tail -c 20000 "$f" > "$OUT/$name/$(basename "$f")"; done
nvidia-smi --query-gpu=index,name,memory.used --format=csv > "$OUT/$name/gpu-after.csv" 2>&1
exit 0
