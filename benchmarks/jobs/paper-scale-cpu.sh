#!/usr/bin/env bash
# The paper-scale benchmark on this project's 2-core CPU: the reference lines of the seeds'
# splits first (no CNN, seconds a seed once the volumes are measured), then the runs, one
# torch thread each, WORKERS at a time, taken in order from one list (seed by seed, the
# methods of METHODS in their order); every run writes RESULTS/<method>-seed<S>.json when it
# finishes, and a run cut short resumes from its checkpoint when started again. Runs whose
# results file exists are skipped; a failed run is reported and the others go on.
# Usage: bash benchmarks/jobs/paper-scale-cpu.sh [WORK] [SEED ...]   (seeds 0 1 2 by default)
# Environment: METHODS (default "selfpu nnpu naive upu nnpu-estimated"), RESULTS (default
# benchmarks/results/paper-scale), PREPROCESSING (for a cohort prepared by this call: ideal,
# the default, or real), WORKERS (default 2).
# 2026-11-26 ran seeds 0-2, then 3-4 (then as two fixed queues, Self-PU in one); 2026-11-29
# the real-preprocessing cohort:
#   METHODS="selfpu naive nnpu" PREPROCESSING=real RESULTS=benchmarks/results/paper-scale-real \
#     bash benchmarks/jobs/paper-scale-cpu.sh runs/paper-scale-real 0 1 2 3 4
set -u
cd "$(dirname "$0")/../.."
WORK=${1:-runs/paper-scale}
shift || true
SEEDS=${*:-0 1 2}
PY=${PYTHON:-.venv/bin/python}
METHODS=${METHODS:-selfpu nnpu naive upu nnpu-estimated}
RESULTS=${RESULTS:-benchmarks/results/paper-scale}
mkdir -p "$WORK" "$RESULTS"
[ -f "$WORK/prepared.json" ] || "$PY" -m benchmarks.paper_scale prepare --work "$WORK" \
  --preprocessing "${PREPROCESSING:-ideal}" || { echo "failed: prepare" >&2; exit 1; }
refs=()
for s in $SEEDS; do
  [ -f "$RESULTS/reference-seed$s.json" ] || refs+=("$s")
done
[ ${#refs[@]} -eq 0 ] || "$PY" -m benchmarks.paper_scale references --work "$WORK" \
  --results "$RESULTS" --seed "${refs[@]}" > "$WORK/references.log" 2>&1 \
  || echo "failed: references (see $WORK/references.log)" >&2
jobs=()
for s in $SEEDS; do
  for m in $METHODS; do jobs+=("$m-$s"); done
done
claims=$(mktemp -d)   # a worker takes a job by creating its folder here (atomic)
trap 'rm -rf "$claims"' EXIT
worker() {
  for job in "${jobs[@]}"; do
    method=${job%-*}; seed=${job##*-}
    [ -f "$RESULTS/$method-seed$seed.json" ] && continue
    mkdir "$claims/$job" 2>/dev/null || continue
    "$PY" -m benchmarks.paper_scale run --work "$WORK" --results "$RESULTS" \
      --method "$method" --seed "$seed" --threads 1 > "$WORK/$method-seed$seed.log" 2>&1 \
      || echo "failed: $job (see $WORK/$method-seed$seed.log)" >&2
  done
}
for _ in $(seq "${WORKERS:-2}"); do worker & done
wait
