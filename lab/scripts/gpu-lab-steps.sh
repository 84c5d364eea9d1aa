#!/bin/bash
# A lab visit's steps, one after the other, detached from the device call that starts them (as
# gpu-lab-campaign.sh runs calibrate segments), so pytest sessions follow each other with no idle
# gap between device calls:
#   setsid bash lab/scripts/gpu-lab-steps.sh NAME STEPS_FILE </dev/null >/dev/null 2>&1 &
# STEPS_FILE holds one shell command per line (# comments and blank lines skipped), each run with
# bash in the repository, its output in /root/runs/NAME/stepK.log; a gpu-lab-run.sh step's own run
# folder goes under /root/runs/NAME/ when its name is NAME/STEP. The log is /root/runs/NAME/campaign.log.
# Collect and stop exactly as a campaign: bash lab/scripts/gpu-lab-collect.sh NAME [--stop]
# (--stop interrupts the running step's process group with SIGINT: pytest tears its servers down).
set -uo pipefail
name="$1"; steps="$2"
source "$(dirname "$0")/gpu-lab-env.sh" "$name"
export OUT=/root/steps-out  # where gpu-lab-run.sh packs its run (unused: collect packs /root/runs/NAME)
mkdir -p "$OUT/$name"
exec >> "$run/campaign.log" 2>&1
k=0
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in ''|'#'*) continue ;; esac
  k=$((k + 1))
  [ -f "$run/stop" ] && { echo "== stopped before step $k"; break; }
  echo "== step $k started $(date -u +%FT%TZ): $line"
  setsid bash -c "$line" > "$run/step$k.log" 2>&1 < /dev/null &
  echo $! > "$run/step.pid"
  wait $!
  echo "== step $k: exit $? at $(date -u +%FT%TZ)"
done < "$steps"
rm -f "$run/step.pid"
echo "== steps over at $(date -u +%FT%TZ)"
