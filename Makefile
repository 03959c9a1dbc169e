# The two commands of the README: `make train` (the embedded demo run) and `make test`.
.PHONY: setup train test test-slow

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
