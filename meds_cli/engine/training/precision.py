"""Which precision the update computes in, and what it keeps its weights in.

The rule the loop follows: master weights and optimizer state in fp32, the forward and backward
under bf16 autocast on a GPU. AdamW on bf16 parameters rounds every update smaller than about
2^-8 of a weight back to the weight (at the paper's lr 1e-6, nearly all of them), so a run that
trains bf16 or fp16 parameters is warned.

Where the autocast setting comes from, first match wins:
1. train.mixed_precision when the config sets it (no, bf16, fp16);
2. `accelerate launch --mixed_precision` or the launch file's value (Accelerate passes it to the
   processes in ACCELERATE_MIXED_PRECISION), left for Accelerate to read;
3. bf16 on a GPU that supports it; on a CPU, bf16 where it has bf16 matrix units (AMX-BF16,
   AVX512-BF16, not capped by ONEDNN_MAX_CPU_ISA) and bf16 linear layers measured at least 1.1x
   faster than float32 on it (meds_cli/core/cpu_calibration.py, cached per CPU model); otherwise no.
   In a launch of several processes, process 0's calibration decides for all of them
   (process_zeros_answer): processes timing at once on shared cores, or on machines of different
   kinds, could each choose differently, and DDP and FSDP2 need one precision everywhere.

On a CPU, bf16 autocast is torch.autocast("cpu", torch.bfloat16) (Accelerate's autocast for
mixed_precision bf16): the update and the scoring pass compute in bf16 while the LoRA weights,
their gradients and AdamW's state stay float32, and the hf engine decodes from bf16 copies of
the weights made once per batch (engine/rollout/packed_linear.py). The run says in one line
which precision it computes in and why (precision_line).
"""

from __future__ import annotations

import os
from typing import Callable, Mapping

import torch

from meds_cli.core.cpu_calibration import cpu_fast_paths

MIXED_PRECISION = ["auto", "no", "bf16", "fp16"]
LAUNCH_VARIABLE = "ACCELERATE_MIXED_PRECISION"


def process_zeros_answer(decide: Callable[[], object]):
    """decide() as process 0 answers it, in every process of the launch (torch.distributed's
    process group, when one is joined); decide() itself runs on process 0 only."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return decide()
    answer = [decide() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(answer, src=0)
    return answer[0]


def choose_mixed_precision(setting: str, *, environ: Mapping[str, str] | None = None, gpu_bf16: bool | None = None,
                           on_gpu: bool | None = None, cpu_paths=cpu_fast_paths,
                           agree=process_zeros_answer) -> tuple[str | None, str]:
    """(the value to hand Accelerator(mixed_precision=...), why): None lets Accelerate use the
    launch's. `cpu_paths(environ)` is asked only for auto on a CPU, through `agree` (process 0's
    answer for every process)."""
    environ = os.environ if environ is None else environ
    if setting != "auto":
        return setting, f"train.mixed_precision: {setting}"
    if environ.get(LAUNCH_VARIABLE):
        return None, f"accelerate launch --mixed_precision {environ[LAUNCH_VARIABLE]}"
    if gpu_bf16 is None:
        gpu_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if on_gpu is None:
        on_gpu = torch.cuda.is_available()
    if gpu_bf16:
        return "bf16", "GPU with bf16"
    if on_gpu:
        return "no", "GPU without bf16"
    calibration = agree(lambda: cpu_paths(environ))
    why = calibration.paths.why + (f", {calibration.source}" if calibration.source.startswith("calibrated") else "")
    return ("bf16" if calibration.paths.bf16 else "no"), why


def resolve_mixed_precision(setting: str, *, environ: Mapping[str, str] | None = None,
                            gpu_bf16: bool | None = None) -> str | None:
    """The value to hand Accelerator(mixed_precision=...): None lets Accelerate use the launch's."""
    return choose_mixed_precision(setting, environ=environ, gpu_bf16=gpu_bf16)[0]


def precision_line(in_effect: str | None, why: str) -> str:
    """The run's one line on its precision: `in_effect` is the Accelerator's mixed_precision."""
    name = {"no": "float32", None: "float32"}.get(in_effect, in_effect)
    return f"precision: {name} ({why})"


def low_precision_training_warning(parameters, optimizer_name: str = "AdamW") -> str | None:
    """A one-line warning when trainable parameters are bf16/fp16, else None."""
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in parameters
                     if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16)})
    if not dtypes:
        return None
    return (f"training {'/'.join(dtypes)} parameters with {optimizer_name}: updates below about 1/256 of a weight "
            "round away (at lr 1e-6 nearly all); load the weights in float32 (model.dtype: float32) and compute in "
            "bf16 with train.mixed_precision: bf16 (the default on a GPU)")
