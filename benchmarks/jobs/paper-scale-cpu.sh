#!/usr/bin/env bash
# The paper-scale benchmark on this project's 2-core CPU: the reference lines of the seeds'
# splits first (no CNN, seconds a seed), then two queues side by side, one torch thread each
# (naive, nnPU, uPU and nnPU with the estimated prior in one, Self-PU in the other); every
# run writes benchmarks/results/paper-scale/<method>-seed<S>.json when it finishes, and a
# run cut short resumes from its checkpoint when started again. Runs whose results file
# exists are skipped. Usage: bash benchmarks/jobs/paper-scale-cpu.sh [WORK] [SEED ...]
# (seeds 0 1 2 by default; 2026-11-26 ran seeds 0-2, then 3-4).
set -u
cd "$(dirname "$0")/../.."
WORK=${1:-runs/paper-scale}
shift || true
SEEDS=${*:-0 1 2}
PY=${PYTHON:-.venv/bin/python}
[ -f "$WORK/prepared.json" ] || "$PY" -m benchmarks.paper_scale prepare --work "$WORK"
refs=()
for s in $SEEDS; do
  [ -f "benchmarks/results/paper-scale/reference-seed$s.json" ] || refs+=("$s")
done
[ ${#refs[@]} -eq 0 ] || "$PY" -m benchmarks.paper_scale references --work "$WORK" \
  --seed "${refs[@]}" > "$WORK/references.log" 2>&1 || echo "failed: references" >&2
queue() {
  for job in "$@"; do
    method=${job%-*}; seed=${job##*-}
    [ -f "benchmarks/results/paper-scale/$method-seed$seed.json" ] && continue
    "$PY" -m benchmarks.paper_scale run --work "$WORK" --method "$method" --seed "$seed" \
      --threads 1 > "$WORK/$method-seed$seed.log" 2>&1 || echo "failed: $job" >&2
  done
}
first=(); second=(); third=()
for s in $SEEDS; do
  first+=("nnpu-$s" "naive-$s"); third+=("upu-$s" "nnpu-estimated-$s"); second+=("selfpu-$s")
done
queue "${first[@]}" "${third[@]}" &
queue "${second[@]}" &
wait
