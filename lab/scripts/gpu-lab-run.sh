#!/bin/bash
# Run the gpu tier on the GPU lab machine (see ../shared/gpu-lab/README.md), after staging.
#   SPECGATE_COMMIT=<sha> [RIG=h200-smollm2] [LAB_TIMEOUT_S=540] [HELPER=core-canary.py [SHARE_AFTER=0] [PYSPY=1] [MEMCANARY=1]] bash lab/scripts/gpu-lab-run.sh NAME [pytest args...]
# HELPER=core-canary.py: the servers pinned, canaries timed beside them; both engine cores on one CPU
# after SHARE_AFTER windows (0, the default: from the start; a number above the windows run: never);
# PYSPY=1: 1-s py-spy profiles of the candidate's engine core back to back (/root/extra/bin/py-spy).
# MEMCANARY=1: memory canaries (1-MiB copies) on the candidate engine's CPU and the control CPU.
# SPECGATE_COMMIT: the device's copied tree carries a stale .git, so pass the commit from the
# checkout that sent it (SPECGATE_COMMIT=$(git rev-parse --short HEAD) in the device command).
# pytest gets SIGINT at LAB_TIMEOUT_S (its servers are torn down), so the results still come back:
# the log, JUnit XML, report, summary, plots, server logs, baselines and any --specgate-record-responses
# folder under /root/runs/NAME are packed into $OUT/NAME.tgz (the device tool returns 8 files at most).
set -uo pipefail
name="$1"; shift
rig="${RIG:-h200-smollm2}"
source "$(dirname "$0")/gpu-lab-env.sh" "$name"
echo "lab run $name: rig $rig, started $(date -u +%FT%TZ)" | tee "$run/started.txt"
nvidia-smi --query-gpu=index,name,memory.used --format=csv > "$run/gpu-before.csv" 2>&1
start=$(date +%s)
if [ -n "${HELPER:-}" ]; then
  ( while [ ! -f "$run/pytest.pid" ]; do sleep 0.2; done
    python3 "lab/scripts/$HELPER" "$run/windows.jsonl" "${SHARE_AFTER:-0}" "$(cat "$run/pytest.pid")" "$run/pin.log" ) &
fi
timeout -s INT -k 30 "${LAB_TIMEOUT_S:-540}" bash -c 'echo $$ > "$1/pytest.pid"; shift; exec "$@"' _ "$run" \
  python3 -m pytest -p specgate.plugin -c pyproject.toml --rootdir "$PWD" perf_tests -m gpu --specgate-rig "$rig" -p no:cacheprovider --specgate-run-dir "$run" \
  --junitxml "$run/junit.xml" "$@" 2>&1 | tee "$run/pytest.log" | grep -v "requests, " | tail -150
rc=${PIPESTATUS[0]}
[ -n "${HELPER:-}" ] && { kill %1 2>/dev/null; cat "$run/pin.log" 2>/dev/null; }
echo "pytest exit $rc after $(( $(date +%s) - start ))s"
cp baselines.json "$run/baselines.json"
# A kept server's log lives in specgate's server registry, not the run folder: copy every log the report names.
python3 -c "import json, sys; [print(s['log']) for s in json.load(open(sys.argv[1])).get('servers', {}).values() if s.get('log')]" \
  "$run/report.json" 2>/dev/null | while read -r log; do
  [ -f "$log" ] && [ ! -f "$run/$(basename "$log")" ] && cp "$log" "$run/server-kept-$(basename "$log")"
done
# Start times per server (ready_after_s from the report) and what each start spent them on: a
# compile-cache hit logs "Directly load the compiled graph(s)", a miss "Compiling a graph".
{
  python3 -c "import json, sys; r = json.load(open(sys.argv[1]))
for label, s in r.get('servers', {}).items(): print(f'{label}: ready after {s[\"ready_after_s\"] or 0:.1f} s')" \
    "$run/report.json" 2>/dev/null || echo "(no report.json)"
  for log in "$run"/server-*.log; do
    [ -f "$log" ] || continue
    echo "== $(basename "$log")"
    grep -o -E "Directly load the compiled graph|Compiling a graph for compile range [^ ]+ takes [0-9.]+ s|torch.compile took [0-9.]+ s in total|Model loading took [0-9.]+ GiB memory and [0-9.]+ seconds|Graph capturing finished in [0-9]+ secs, took [0-9.]+ GiB|init engine \(profile, create kv cache, warmup model\) took [0-9.]+ s|Available KV cache memory: [-0-9.]+ GiB|Asynchronous scheduling is [a-z]+|Async scheduling not supported with [a-z_]+" \
      "$log" | sort | uniq -c
  done
} > "$run/startup.txt" 2>&1
cat "$run/startup.txt"
nvidia-smi --query-gpu=index,name,memory.used --format=csv > "$run/gpu-after.csv" 2>&1
cat "$run/gpu-after.csv"
find "$run" -name 'server-*.log' -size +1M -exec sh -c 'tail -c 1000000 "$1" > "$1.tail" && mv "$1.tail" "$1"' _ {} \;
tar czf "$OUT/$name.tgz" -C /root/runs "$name"
exit 0
