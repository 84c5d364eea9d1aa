#!/bin/bash
# Lab experiment (issue 12): what are the 135M rig's ~400/~600 tok/s regimes? An A/A calibration
# (two no-speculation servers, duet windows, per-request telemetry of both servers' processes) whose
# servers are pinned to fixed cores half-way (lab/scripts/pin-servers-after.py): the windows before and
# after compare the same two servers unpinned and pinned.
#   SPECGATE_COMMIT=<sha> [RIG=h200-smollm2] [ROUNDS=16] [PIN_AFTER=8] [LAB_TIMEOUT_S=560] [MODE=<rig's reference>] \
#     [HELPER=pin-servers-after.py] bash lab/scripts/gpu-lab-regimes.sh NAME
# HELPER=core-canary.py instead pins each engine core to a CPU of its own from the start, times a canary
# on those CPUs, and moves both engine cores onto one CPU after PIN_AFTER windows (docs/journal/lab/2026-12-01-h200-visit6.md).
# Results (windows.jsonl, measurements.jsonl.gz with every request and its telemetry, pin.log,
# calibration.md, server logs) come back as $OUT/NAME.tgz.
set -uo pipefail
name="$1"
source "$(dirname "$0")/gpu-lab-env.sh" "$name"
out="$run"
echo "regimes $name: rig ${RIG:-h200-smollm2}, commit ${SPECGATE_COMMIT:-?}, started $(date -u +%FT%TZ)" | tee "$out/started.txt"
# The calibration runs in the foreground of this shell's process group (a background job would
# ignore the SIGINT that timeout sends); the pinner waits beside it for the calibration's pid.
(
  while [ ! -f "$out/cal.pid" ]; do sleep 0.2; done
  python3 "lab/scripts/${HELPER:-pin-servers-after.py}" "$out/windows.jsonl" "${PIN_AFTER:-8}" "$(cat "$out/cal.pid")" "$out/pin.log"
) &
timeout -s INT -k 30 "${LAB_TIMEOUT_S:-560}" bash -c 'echo $$ > "$1/cal.pid"; exec python3 -m specgate_lab calibrate \
  --rig "$2" --rounds "$3" --levels 0 --classes coding --out "$1" ${4:+--mode "$4"}' _ "$out" "${RIG:-h200-smollm2}" "${ROUNDS:-16}" "${MODE:-}" 2>&1 \
  | grep -v "requests, " | tail -80
kill %1 2>/dev/null
cat "$out/pin.log" 2>/dev/null
tar czf "$OUT/$name.tgz" -C /root/runs "$name"
exit 0
