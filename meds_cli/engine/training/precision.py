"""Which precision the update computes in, and what it keeps its weights in.

The rule the loop follows: master weights and optimizer state in fp32, the forward and backward
under bf16 autocast on a GPU. AdamW on bf16 parameters rounds every update smaller than about
2^-8 of a weight back to the weight (at the paper's lr 1e-6, nearly all of them), so a run that
trains bf16 or fp16 parameters is warned.

Where the autocast setting comes from, first match wins:
1. train.mixed_precision when the config sets it (no, bf16, fp16);
2. `accelerate launch --mixed_precision` or the launch file's value (Accelerate passes it to the
   processes in ACCELERATE_MIXED_PRECISION), left for Accelerate to read;
3. bf16 on a GPU that supports it, otherwise no.
"""

from __future__ import annotations

import os
from typing import Mapping

import torch

MIXED_PRECISION = ["auto", "no", "bf16", "fp16"]
LAUNCH_VARIABLE = "ACCELERATE_MIXED_PRECISION"


def resolve_mixed_precision(setting: str, *, environ: Mapping[str, str] | None = None,
                            gpu_bf16: bool | None = None) -> str | None:
    """The value to hand Accelerator(mixed_precision=...): None lets Accelerate use the launch's."""
    environ = os.environ if environ is None else environ
    if setting != "auto":
        return setting
    if environ.get(LAUNCH_VARIABLE):
        return None
    if gpu_bf16 is None:
        gpu_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return "bf16" if gpu_bf16 else "no"


def low_precision_training_warning(parameters, optimizer_name: str = "AdamW") -> str | None:
    """A one-line warning when trainable parameters are bf16/fp16, else None."""
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in parameters
                     if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16)})
    if not dtypes:
        return None
    return (f"training {'/'.join(dtypes)} parameters with {optimizer_name}: updates below about 1/256 of a weight "
            "round away (at lr 1e-6 nearly all); load the weights in float32 (model.dtype: float32) and compute in "
            "bf16 with train.mixed_precision: bf16 (the default on a GPU)")
