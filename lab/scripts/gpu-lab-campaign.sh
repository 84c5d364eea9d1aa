#!/bin/bash
# A calibration campaign on the GPU lab machine that outlives the device call which starts it (the
# device tool ends a call's processes when it returns, except those of a new session), so one
# campaign runs on through several calls with no idle gap between segments:
#   CAL_ARGS="--mode no_spec --injector gpu --levels 0,0.05 --repeats 1 --classes coding" \
#     setsid bash lab/scripts/gpu-lab-campaign.sh NAME "RIG ROUNDS SEED" ... </dev/null >/dev/null 2>&1 &
# Each segment is one `python -m specgate_lab calibrate` (one start of both servers, ROUNDS rounds)
# into /root/runs/NAME/segK-RIG; the campaign's own log is /root/runs/NAME/campaign.log.
# While it runs, and at the end: bash lab/scripts/gpu-lab-collect.sh NAME (packs it into $OUT).
# Stop it early (the budget's end): bash lab/scripts/gpu-lab-collect.sh NAME --stop: no
# further segment starts, and the running calibrate gets SIGTERM, stops its servers and writes the
# tables of the windows it measured.
set -uo pipefail
name="$1"; shift
source "$(dirname "$0")/gpu-lab-env.sh" "$name"
exec >> "$run/campaign.log" 2>&1
k=0
for segment in "$@"; do
  read -r rig rounds seed <<< "$segment"
  k=$((k + 1))
  [ -f "$run/stop" ] && { echo "== stopped before segment $k"; break; }
  echo "== segment $k: rig $rig, $rounds rounds, seed $seed, started $(date -u +%FT%TZ)"
  # shellcheck disable=SC2086  # CAL_ARGS is a list of arguments
  python3 -m specgate_lab calibrate --rig "$rig" --rounds "$rounds" --seed "$seed" \
    --out "$run/seg$k-$rig" ${CAL_ARGS:-} > "$run/seg$k.log" 2>&1 &
  echo $! > "$run/calibrate.pid"
  wait $!
  echo "== segment $k: exit $? at $(date -u +%FT%TZ)"
done
rm -f "$run/calibrate.pid"
echo "== campaign over at $(date -u +%FT%TZ)"
