"""Mixed precision (meds_cli/engine/training/precision.py): the config's value wins when set, then the
launch's, then bf16 on a GPU; training low-precision parameters is warned about."""

import pytest
import torch

from meds_cli.engine.training.precision import low_precision_training_warning, resolve_mixed_precision


@pytest.mark.parametrize("setting, environ, gpu_bf16, expected", [
    ("no", {"ACCELERATE_MIXED_PRECISION": "bf16"}, True, "no"),  # set in the config: it wins
    ("bf16", {}, False, "bf16"),
    ("fp16", {}, True, "fp16"),
    ("auto", {"ACCELERATE_MIXED_PRECISION": "fp16"}, True, None),  # launched with a value: Accelerate reads it
    ("auto", {"ACCELERATE_MIXED_PRECISION": "no"}, True, None),
    ("auto", {}, True, "bf16"),  # plain run on a bf16 GPU
    ("auto", {}, False, "no"),  # CPU
    ("auto", {"ACCELERATE_MIXED_PRECISION": ""}, False, "no"),
])
def test_mixed_precision_source(setting, environ, gpu_bf16, expected):
    environ = {**environ, "MEDS_CPU_FAST_PATHS": "default"}  # a CPU without calibration: float32
    assert resolve_mixed_precision(setting, environ=environ, gpu_bf16=gpu_bf16) == expected


def test_low_precision_parameters_are_warned_about():
    fp32 = torch.nn.Linear(2, 2)
    assert low_precision_training_warning(fp32.parameters()) is None
    bf16 = torch.nn.Linear(2, 2).to(torch.bfloat16)
    message = low_precision_training_warning(bf16.parameters())
    assert message and "bfloat16 parameters with AdamW" in message and "model.dtype: float32" in message
    assert "\n" not in message
    frozen = torch.nn.Linear(2, 2).to(torch.bfloat16).requires_grad_(False)  # a frozen base under fp32 LoRA
    assert low_precision_training_warning([*frozen.parameters(), *fp32.parameters()]) is None
    both = [*bf16.parameters(), *torch.nn.Linear(2, 2).half().parameters()]
    assert "bfloat16/float16" in low_precision_training_warning(both)


def test_no_from_yaml_is_the_word_no():
    """YAML 1.1 reads a bare `no` as false; train.mixed_precision=no still means no autocast."""
    from meds_cli.engine.config import load_config

    assert load_config(overrides=["train.mixed_precision=no"]).train.mixed_precision == "no"
    assert load_config().train.mixed_precision == "auto"
