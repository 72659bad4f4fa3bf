#!/usr/bin/env bash
# The paper-scale benchmark on this project's 2-core CPU: two queues side by side, one torch
# thread each; every run writes benchmarks/results/paper-scale/<method>-seed<S>.json when it
# finishes, and a run cut short resumes from its checkpoint when started again. Runs whose
# results file exists are skipped. Usage: bash benchmarks/jobs/paper-scale-cpu.sh [WORK]
set -u
cd "$(dirname "$0")/../.."
WORK=${1:-runs/paper-scale}
PY=${PYTHON:-.venv/bin/python}
[ -f "$WORK/prepared.json" ] || "$PY" benchmarks/paper_scale.py prepare --work "$WORK"
queue() {
  for job in "$@"; do
    method=${job%-*}; seed=${job#*-}
    [ -f "benchmarks/results/paper-scale/$method-seed$seed.json" ] && continue
    "$PY" benchmarks/paper_scale.py run --work "$WORK" --method "$method" --seed "$seed" \
      --threads 1 > "$WORK/$method-seed$seed.log" 2>&1 || echo "failed: $job" >&2
  done
}
queue nnpu-0 naive-0 nnpu-1 naive-1 nnpu-2 naive-2 upu-0 upu-1 upu-2 &
queue selfpu-0 selfpu-1 selfpu-2 &
wait
