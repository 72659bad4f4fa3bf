#!/usr/bin/env bash
# The population's step replayed as a CUDA graph (adni_pu/pu/replay.py) on a GPU: its tests
# and its seconds per epoch. One device call, run from the repository root with
# carry [".whl", ".pieces"] (.whl: pytest and its dependencies, which the device image
# lacks; .pieces/data/mnist: the MNIST IDX files, as in benchmarks/gpu-queue.md):
#   bash benchmarks/jobs/gpu-capture-check.sh
# 1. The capture's tests, skipped on a CPU: captured population == eager population.
# 2. Seconds per epoch of populations of 1 and 10 Self-PU seeds, eager and captured, in one
#    process: $OUT/population-cost-capture-gpu.json (resumes: rerun to finish the modes).
set -u
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/nvidia-smi.txt"
timeout "${TT:-180}" python3 -m pytest -q -p no:cacheprovider tests/test_replay.py \
  tests/test_population.py -k "captured or replay" > "$OUT/tests.txt" 2>&1
rc=$?; tail -n 20 "$OUT/tests.txt"; [ "$rc" = 0 ] || exit "$rc"
[ -f .pieces/population-cost-capture-gpu.json ] && \
  cp .pieces/population-cost-capture-gpu.json "$OUT/"
timeout "${T:-360}" python3 -m benchmarks.population_cost --device cuda \
  --data-dir .pieces/data/mnist --sizes ${SIZES:-1 10} --capture \
  --out "$OUT/population-cost-capture-gpu.json" > "$OUT/log.txt" 2>&1
rc=$?; tail -n 30 "$OUT/log.txt"; exit "$rc"
