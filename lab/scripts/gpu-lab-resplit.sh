#!/bin/bash
# Split the GPU lab kit into parts small enough to travel beside this repository's tracked tree.
#   bash lab/scripts/gpu-lab-resplit.sh [PART_MIB]        (default 23; after ../shared/gpu-lab/build-bundle.sh)
# A device call carries the tracked tree (~40 MB: lab reports and the trained EAGLE-3 head) plus one
# part, 64 MiB at most. build-bundle.sh names parts with one digit, so it cannot make the 11 or more
# parts that fit beside this tree; this re-splits its bundle (kept in $GPU_LAB_WORK, default
# /tmp/gpu-lab-build/bundle) with two-digit names. device-setup.sh joins `part.*` in name order.
set -euo pipefail
PART_MIB="${1:-23}"
WORK="${GPU_LAB_WORK:-/tmp/gpu-lab-build}"
HERE="$(cd "$(dirname "$0")/../.." && pwd)"
[ -d "$WORK/bundle" ] || { echo "gpu-lab-resplit: $WORK/bundle is missing: run ../shared/gpu-lab/build-bundle.sh first" >&2; exit 1; }
tree_mib=$(( $(cd "$HERE" && git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) / 1048576 ))
if [ $(( tree_mib + PART_MIB )) -ge 63 ]; then
  echo "gpu-lab-resplit: ${PART_MIB} MiB parts beside a ${tree_mib} MiB tracked tree exceed a call's 64 MiB: pick a smaller size" >&2
  exit 1
fi
tar -C "$WORK/bundle" -cf "$WORK/bundle.tar" .
rm -rf "$HERE"/.gpu-lab/p[0-9]* "$WORK"/part.*
split -b "${PART_MIB}m" -d -a 2 "$WORK/bundle.tar" "$WORK/part."
i=0; for f in "$WORK"/part.*; do mkdir -p "$HERE/.gpu-lab/p$i"; mv "$f" "$HERE/.gpu-lab/p$i/"; i=$((i+1)); done
last=$((i-1))
cp "$HERE/../shared/gpu-lab/device-setup.sh" "$HERE/.gpu-lab/p$last/"
md5sum "$WORK/bundle.tar" | cut -d' ' -f1 > "$HERE/.gpu-lab/p$last/bundle.md5"
rm -f "$WORK/bundle.tar"
echo "parts: p0..p$last of ${PART_MIB} MiB beside a ${tree_mib} MiB tree (carry one per call; the last also runs p$last/device-setup.sh)"
