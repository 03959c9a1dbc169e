"""scripts/gpu_check.sh: its settings are a valid run config at the paper's length, the
architecture file is Qwen2.5-Math-1.5B's, and (slow) the tiny mode runs the whole path on CPU
with every response forced to the length limit. The GPU mode itself has not run in this project."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meds_cli.engine.config import load_config
from tests.conftest import needs_embedded

ROOT = Path(__file__).resolve().parent.parent


def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_settings_are_a_valid_run_at_the_paper_length():
    check = gpu_check()
    cfg = load_config(overrides=check.overrides(check.settings(tiny=False, steps=3)))
    assert (cfg.algo.name, cfg.algo.base, cfg.train.steps) == ("meds", "dapo", 3)
    assert cfg.rollout.max_new_tokens == 1024 and cfg.train.gradient_checkpointing
    assert cfg.train.mixed_precision == "bf16" and cfg.model.dtype == "float32" and not cfg.model.lora.enabled
    assert not cfg.section("dapo").dynamic_sampling  # a random model answers nothing: no group would train
    assert cfg.rollout.hf.generation_batch_size == cfg.rollout.prompts_per_step * cfg.rollout.group_size


def test_every_response_is_forced_to_the_length_limit_by_the_rollout_setting():
    """The decode loop holds the stop ids back for rollout.min_new_tokens tokens (it never reads
    the model's generation_config), so the throughput line measures responses of the full length
    and not whatever a random model happens to sample."""
    check = gpu_check()
    for tiny in (True, False):
        cfg = load_config(overrides=check.overrides(check.settings(tiny=tiny, steps=1)))
        assert cfg.rollout.min_new_tokens == cfg.rollout.max_new_tokens
    assert "generation_config" not in (ROOT / "scripts" / "gpu_check.py").read_text()


def test_architecture_file_is_qwen2_5_math_1_5b():
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(gpu_check().ARCHITECTURE)
    assert config.model_type == "qwen2" and config.vocab_size == 151936 and config.tie_word_embeddings
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (1536, 8960, 28)
    assert (config.num_attention_heads, config.num_key_value_heads, config.max_position_embeddings) == (12, 2, 4096)


def run_script(*args):
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@needs_embedded
def test_tiny_mode_runs_the_whole_path_on_cpu():
    result = run_script("--tiny", "--steps", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "gradient checkpointing" in lines[0] and "2 prompts x 4 responses x 8 tokens" in lines[0]
    steps = [line.split() for line in lines if line.split() and line.split()[0] in ("1", "2")]
    assert len(steps) == 2 and all(float(cols[-1]) == 8.0 for cols in steps)  # forced to the length limit
    assert all(float(cols[3]) > 0 for cols in steps)  # the update ran
    assert "peak resident memory" in lines[-1]
    if not _has_gpu():
        refused = run_script()
        assert refused.returncode == 2 and "no GPU visible" in refused.stderr


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()
