#!/bin/bash
# Pack a running or finished gpu-lab-campaign.sh campaign (or gpu-lab-steps.sh visit) into $OUT/NAME.tgz (server logs trimmed to
# their last MB), print its log and the windows measured so far; with --stop, end it first (see
# gpu-lab-campaign.sh) and wait for the running calibrate to write its tables.
#   bash lab/scripts/gpu-lab-collect.sh NAME [--stop]
set -uo pipefail
run="/root/runs/$1"
if [ "${2:-}" = "--stop" ]; then
  touch "$run/stop"
  if [ -f "$run/calibrate.pid" ]; then
    pid=$(cat "$run/calibrate.pid")
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  fi
  if [ -f "$run/step.pid" ]; then  # gpu-lab-steps.sh: the step leads its own process group
    pid=$(cat "$run/step.pid")
    kill -INT -- "-$pid" 2>/dev/null
    for _ in $(seq 1 90); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  fi
fi
cat "$run/campaign.log" 2>/dev/null
for log in "$run"/seg*.log "$run"/step*.log; do [ -f "$log" ] && { echo "== tail of $(basename "$log")"; tail -n 4 "$log"; }; done
for w in "$run"/seg*/windows.jsonl; do [ -f "$w" ] && echo "$w: $(wc -l < "$w") window lines"; done
find "$run" -name '*.log' -size +1M -exec sh -c 'tail -c 1000000 "$1" > "$1.tail" && mv "$1.tail" "$1"' _ {} \;
[ -n "${OUT:-}" ] && tar czf "$OUT/$1.tgz" -C /root/runs "$1"
exit 0
