#!/usr/bin/env bash
# Create .venv and install adni-pu with everything it needs, from the package registries.
# torch is pinned first so CPU-only machines get the local CPU build, not a CUDA download;
# deepbet is installed without its GUI dependency (customtkinter), which adni-pu never uses.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==${ADNI_PU_TORCH_VERSION:-2.13.0}"
python -m pip install -q -e ".[dev]"
python -m pip install -q --no-deps "deepbet==1.0.2"
echo "adni-pu installed in $(pwd)/.venv"
