#!/usr/bin/env bash
# The paper-scale benchmark on one lent GPU machine (16 cores): the cohort is generated there
# (its 2 GB of volumes do not travel), then METHOD-SEED pieces run P at a time, in the order
# given, until BUDGET seconds after the start; a piece still running then is stopped and
# writes nothing. Each finished piece writes RESULTS/<method>-seed<S>.json, as on the CPU.
#
#   bash benchmarks/jobs/paper-scale-gpu.sh RESULTS BUDGET_S JOB [JOB ...]   # JOB: naive-5
#
# Environment: WORK (cohort and runs, default /tmp/paper-scale), P (pieces at a time, 6),
# THREADS (torch threads per piece, 2), EPOCHS (8, the benchmark's), PYTHON (python3),
# LOGS (RESULTS/logs). It runs the same on a CPU machine (the machine string says so).
# The device call that ran it is in benchmarks/results/README.md ("How the runs were made").
set -u
cd "$(dirname "$0")/../.." || exit 1
RESULTS=$1; BUDGET=$2; shift 2
export WORK=${WORK:-/tmp/paper-scale} THREADS=${THREADS:-2} EPOCHS=${EPOCHS:-8} \
  PY=${PYTHON:-python3} RESULTS BUDGET STOP=$(($(date +%s) + BUDGET))
P=${P:-6}
export LOGS=${LOGS:-$RESULTS/logs}
mkdir -p "$LOGS"
if command -v nvidia-smi >/dev/null; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  MACHINE="$gpu (lent device machine, $(nproc) cores; $P pieces at a time)"
else
  MACHINE="$(nproc)-core CPU VM, no GPU; $P pieces at a time"
fi
export MACHINE
if [ ! -f "$WORK/prepared.json" ]; then
  "$PY" -m benchmarks.paper_scale prepare --work "$WORK" --workers "$(nproc)" \
    > "$LOGS/prepare.log" 2>&1 || { echo "prepare failed" >&2; exit 1; }
fi
# The cohort is regenerated from its seed: its fingerprint shows it equals the CPU pieces'.
md5sum "$WORK/synth/truth.csv" | tee "$LOGS/truth-md5.txt"
piece() {
  local job=$1 method=${1%-*} seed=${1##*-} left
  [ -f "$RESULTS/$method-seed$seed.json" ] && return 0
  left=$((STOP - $(date +%s)))
  if [ "$left" -lt 60 ]; then echo "not started (budget): $job"; return 0; fi
  timeout "$left" "$PY" -m benchmarks.paper_scale run --work "$WORK" --method "$method" \
    --seed "$seed" --epochs "$EPOCHS" --threads "$THREADS" --machine "$MACHINE" \
    --results "$RESULTS" > "$LOGS/$job.log" 2>&1
  local rc=$?
  echo "$job: exit $rc at $(($(date +%s) + BUDGET - STOP)) s"
}
export -f piece
printf '%s\n' "$@" | xargs -P "$P" -I{} bash -c 'piece {}'
find "$RESULTS" -maxdepth 1 -name "*.json" | wc -l
