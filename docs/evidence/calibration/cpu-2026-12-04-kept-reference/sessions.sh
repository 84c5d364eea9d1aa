#!/bin/bash
# Both sessions, the plan between them and the stop, under one hold of the lock (run via flock).
cd /work/wt-kept
export SPECGATE_STATE_DIR=/tmp/kept/state
K="throughput and eagle3 and coding and not untrained"
PY=.tox/cpu-full/bin/python
echo "lock held $(date -u +%T)"; uptime
session() {  # RUNDIR CANDIDATE_OPTION
  echo "== plan before $1 ($2)"; $PY -m specgate plan --rig cpu-smollm2-eagle3 -m cpu -k "$K" "$2" --specgate-keep-servers
  echo "== session $1 ($2) start $(date -u +%T)"
  s=$(date +%s.%N)
  $PY -m pytest -m cpu --specgate-rig=cpu-smollm2-eagle3 -k "$K" "$2" --specgate-keep-servers --specgate-run-dir=$1 -p no:cacheprovider
  rc=$?; e=$(date +%s.%N)
  echo "== session $1 rc=$rc wall_s=$(python3 -c "print(round($e-$s,1))") end $(date -u +%T)"
  $PY -m specgate servers
}
session /tmp/kept/K1 --specgate-ab-candidate-env=SPECGATE_SLOWDOWN=0.10
session /tmp/kept/K2 --specgate-ab-candidate-env=SPECGATE_SLOWDOWN=0.0
echo "== stop"; $PY -m specgate servers --stop-all; $PY -m specgate servers
uptime; echo "done $(date -u +%T)"
