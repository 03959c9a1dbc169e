#!/usr/bin/env bash
# Three DAPO+MEDS steps of the Qwen2.5-Math-1.5B architecture (random weights) at 1,024-token
# responses on one GPU, no network: seconds per step (generate / score / train), tokens per
# second, peak GPU memory. Under 8 minutes on one recent GPU. See scripts/gpu_check.py.
#   bash scripts/gpu_check.sh            # needs a CUDA build of torch and one visible GPU
#   bash scripts/gpu_check.sh --tiny     # the same code path on CPU with a 2-layer model
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$PYTHON" scripts/gpu_check.py "$@"
