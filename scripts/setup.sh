#!/usr/bin/env bash
# Create .venv and install adni-pu with everything it needs, from the package registries.
# Every version comes from constraints.txt (pinned; docker/Dockerfile installs from the same
# file). torch is installed first so CPU-only machines with a local CPU wheel get it, not a
# CUDA download. deepbet is installed without its GUI dependency (customtkinter), which
# adni-pu never uses. The dev extra brings the test tools, among them pybids and the official
# BIDS validator (bids-validator-deno, with the deno runtime from PyPI; no Node needed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# shellcheck source=/dev/null
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -c constraints.txt torch
python -m pip install -q -c constraints.txt -e ".[dev]"
python -m pip install -q -c constraints.txt --no-deps deepbet
echo "adni-pu installed in $(pwd)/.venv"
