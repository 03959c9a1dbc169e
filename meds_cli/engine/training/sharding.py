"""How the update is spread over processes: DDP (Accelerate's, the default) or FSDP2 (torch's
`fully_shard`), and the pieces of the loop that must know which.

FSDP2 is applied here rather than through Accelerate's FSDP plugin, which does not engage on
CPU: every decoder layer is sharded on its own, then the causal LM around them (embeddings,
final norm, output head), with bf16 compute and fp32 gradient reduction on GPU. Accelerate still
launches the processes, owns the process group and picks the device. The same code runs under
`accelerate launch --cpu` (gloo) and on GPUs (NCCL).

What the loop needs from a sharded model, and gets from this module:
- generation: `gathered_parameters` all-gathers every parameter once and keeps it gathered
  across the many forward calls of HF generate (processes may generate different numbers of
  tokens without any collective in between), then frees the copies;
- clipping: `clip_gradients` takes the norm over the shards of every process;
- checkpoints: `full_state`, `full_optimizer_state` and their loaders turn sharded tensors into
  the same full, name-keyed tensors a one-process run writes, so resume is exact and does not
  depend on how the parameters were cut.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from meds_cli.core.errors import UserError
from meds_cli.core.forward import peft_base
from meds_cli.core.unsharded import unsharded

SHARDINGS = ["none", "fsdp2"]


# ---------------------------------------------------------------- which setups the loop accepts


def make_accelerator(train_cfg, **extra):
    """The run's Accelerator: mixed precision from the config when set, else from the launch
    (engine/training/precision.py), and the process group's timeout (train.dist_timeout_s); the
    setup is checked by the trainer (check_distributed_setup). `extra` goes to Accelerator as it is
    (the trackers of train.report_to)."""
    from datetime import timedelta

    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    from meds_cli.engine.training.precision import resolve_mixed_precision

    timeout = InitProcessGroupKwargs(timeout=timedelta(seconds=train_cfg.dist_timeout_s))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # join the process group before the Accelerator (which reuses it, as it would have made
        # it), so that the processes can take process 0's choice of precision
        from accelerate import PartialState
        from accelerate.utils import parse_flag_from_env

        PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"), **timeout.to_kwargs())  # as Accelerator does
    return Accelerator(mixed_precision=resolve_mixed_precision(train_cfg.mixed_precision), kwargs_handlers=[timeout],
                       **extra)


def check_distributed_setup(accelerator, sharding: str) -> None:
    """Refuse Accelerate setups the loop would run wrongly, in one line each."""
    from accelerate.utils import DistributedType

    kind = accelerator.distributed_type
    if kind == DistributedType.DEEPSPEED:
        raise UserError("DeepSpeed is not supported (its engine steps the optimizer inside backward, once per "
                        "micro-batch); for sharding use train.sharding=fsdp2 with a plain multi-GPU Accelerate "
                        "config (configs/accelerate/)")
    if kind == DistributedType.FSDP:
        raise UserError("Accelerate's FSDP plugin is not used by this loop; remove it from the Accelerate config and "
                        "set train.sharding=fsdp2 (configs/accelerate/ has configs that work)")
    if accelerator.gradient_accumulation_steps != 1:
        raise UserError(f"accelerate gradient_accumulation_steps={accelerator.gradient_accumulation_steps}: the loop "
                        "accumulates micro-batches itself (train.mini_batch_size, train.micro_batch_size); launch "
                        "with gradient_accumulation_steps 1")
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != accelerator.num_processes:
        # torch.distributed.run started several processes, but Accelerate found no GPU to put
        # them on and runs each alone: N copies would train the whole batch into one folder
        raise UserError(f"{launched} processes were launched but Accelerate joined {accelerator.num_processes}; "
                        "on a machine without GPUs set ACCELERATE_USE_CPU=1 (see the README, many processes)")
    if sharding not in SHARDINGS:
        raise UserError(f"train.sharding '{sharding}' is unknown; accepted: {', '.join(SHARDINGS)}")


# ---------------------------------------------------------------- applying FSDP2


@dataclass
class Sharded:
    """The FSDP2 units of a model: the decoder layers and the causal LM around them (the root)."""

    root: nn.Module
    layers: list[nn.Module] = field(default_factory=list)

    def units(self) -> list[nn.Module]:
        return [*self.layers, self.root]


def causal_lm(model: nn.Module) -> nn.Module:
    """The transformers model inside peft's wrappers: HF generate and the training forward both
    run through its forward, so it is the one root every call passes."""
    return peft_base(model)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: the classes transformers lists in `_no_split_modules`."""
    lm = causal_lm(model)
    names = set(getattr(lm, "_no_split_modules", None) or [])
    layers = [m for m in lm.modules() if type(m).__name__ in names]
    if not layers:
        raise UserError(f"train.sharding=fsdp2 found no decoder layers in {type(lm).__name__} "
                        "(it shards the classes the model lists in _no_split_modules)")
    return layers


def shard_model(model: nn.Module, mesh, *, param_dtype: torch.dtype | None = None) -> Sharded:
    """fully_shard every decoder layer, then the causal LM; parameters become DTensor shards.

    param_dtype (GPU: bf16) is what the all-gathered weights compute in; gradients are reduced
    in fp32 and the sharded master weights and optimizer state stay in their own dtype (fp32).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    layers = decoder_layers(model)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    root = causal_lm(model)
    fully_shard(root, mesh=mesh, mp_policy=policy)
    return Sharded(root=root, layers=layers)


def device_mesh(accelerator):
    """A one-dimensional mesh over every process (data-parallel sharding)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(accelerator.device.type, (accelerator.num_processes,))


@contextmanager
def gathered_parameters(sharded: Sharded | None):
    """Full parameters on every process for the duration (HF generate, evaluation).

    Each unit is all-gathered once and told not to free its copy after forward, so the hundreds
    of forward calls of a generate loop run without collectives; on exit the copies are freed.
    The root keeps FSDP's own choice (it is never freed after forward).
    """
    if sharded is None:
        yield
        return
    for layer in sharded.layers:
        layer.set_reshard_after_forward(False, recurse=False)
    try:
        with unsharded(sharded.units()):
            yield
    finally:
        for layer in sharded.layers:
            layer.set_reshard_after_forward(True, recurse=False)


# ---------------------------------------------------------------- gradients


def clip_gradients(parameters, max_norm: float) -> torch.Tensor:
    """Clip the global gradient norm to max_norm (max_norm <= 0: only measure it); returns the
    norm before clipping. Sharded gradients are DTensors whose norm is partial per process: it is
    reduced over processes before the clip coefficient is computed, as one process would."""
    from torch.distributed.tensor import DTensor

    with_grads = [p for p in parameters if p.grad is not None]
    if not with_grads:
        return torch.tensor(0.0)
    total = torch.nn.utils.get_total_norm([p.grad for p in with_grads], norm_type=2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(with_grads, max_norm, total)
    return total


# ---------------------------------------------------------------- checkpoints


def full_state(model: nn.Module, *, trainable_only: bool = True) -> dict[str, torch.Tensor]:
    """Full CPU tensors keyed like model.named_parameters(), on process 0 (empty elsewhere).
    A collective: every process calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
    state = get_model_state_dict(model, options=options)
    if trainable_only:
        trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        state = {k: v for k, v in state.items() if k in trainable}
    return state


def load_full_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load full tensors (every process passes the same dict) into the sharded model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    # a copy: torch replaces the dict's values with the shards it cut from them
    set_model_state_dict(model, dict(state), options=StateDictOptions(full_state_dict=True, strict=False))


def full_optimizer_state(model: nn.Module, optimizer) -> dict:
    """The optimizer's state with full tensors keyed by parameter name, on process 0. A collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, _inner(optimizer),
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_optimizer_state(model: nn.Module, optimizer, state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    state = {**state, "state": {k: dict(v) for k, v in state["state"].items()}}  # torch edits what it loads
    set_optimizer_state_dict(model, _inner(optimizer), state, options=StateDictOptions(full_state_dict=True))


def trainable_state(model: nn.Module, sharded: Sharded | None, *, main: bool) -> dict[str, torch.Tensor]:
    """The trainable weights as full CPU tensors keyed like model.named_parameters() (`model`
    unwrapped of DDP), on the main process (empty elsewhere). Every process calls it: under FSDP2
    it is a collective."""
    if sharded is not None:
        return full_state(model)
    return {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad} if main else {}


def optimizer_state(model: nn.Module, optimizer, sharded: Sharded | None, *, main: bool) -> dict:
    """What to save of the optimizer: its own state_dict, or under FSDP2 the full name-keyed state;
    on the main process (every process calls it)."""
    if sharded is not None:
        return full_optimizer_state(model, optimizer)
    return optimizer.state_dict() if main else {}


def load_trainable_state(model: nn.Module, sharded: Sharded | None, weights: dict[str, torch.Tensor]) -> list[str]:
    """Load saved trainable weights; returns the names this model does not have (nothing loaded then)."""
    if sharded is None:
        return list(model.load_state_dict(weights, strict=False).unexpected_keys)
    names = {n for n, _ in model.named_parameters()}
    unexpected = [k for k in weights if k not in names]
    if not unexpected:
        load_full_state(model, weights)
    return unexpected


def load_optimizer_state(model: nn.Module, optimizer, sharded: Sharded | None, state: dict) -> None:
    if sharded is not None:
        load_full_optimizer_state(model, optimizer, state)
    else:
        optimizer.load_state_dict(state)


def _inner(optimizer):
    """The torch optimizer inside Accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


def global_sum(accelerator, value: float) -> float:
    """The sum of `value` over every process (the value itself with one process): the update's
    loss normalisers and the eval's counts are global, so any launch makes the same numbers."""
    if accelerator.num_processes == 1:
        return float(value)
    total = torch.tensor([float(value)], device=accelerator.device)
    return float(accelerator.reduce(total, reduction="sum").item())


def global_max(accelerator, value: float) -> float:
    """The largest `value` over every process (the value itself with one process): counts that
    every process must run alike, such as the update's micro-batches."""
    return _all_reduce(accelerator, value, torch.distributed.ReduceOp.MAX)


def global_min(accelerator, value: float) -> float:
    """The smallest `value` over every process (the value itself with one process): the groups
    every process has, so that every process trains on as many."""
    return _all_reduce(accelerator, value, torch.distributed.ReduceOp.MIN)


def _all_reduce(accelerator, value: float, op) -> float:
    if accelerator.num_processes == 1:
        return float(value)
    out = torch.tensor([float(value)], device=accelerator.device)
    torch.distributed.all_reduce(out, op=op)  # Accelerate's reduce has no max or min
    return float(out.item())


BARRIER_SETTLE_S = 0.5


def close_process_group(accelerator) -> None:
    """Every process has finished: tear the process group down here rather than at interpreter
    exit, where gloo's threads are destroyed in no set order and a process sometimes aborts
    ("terminate called without an active exception") after a run that succeeded."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        accelerator.wait_for_everyone()
        # The barrier returns as soon as its work is done, but a gloo worker thread still has to
        # free that work and the ones it waited on, and freeing the last backward's all-reduces
        # takes the GIL (torch keeps the backward's contextvars in their thread-local state).
        # DDP's reducer keeps the group alive past destroy_process_group; when it is freed, the
        # group joins its worker threads with the GIL held, so a worker still waiting for the GIL
        # hangs the process for good (seen once in CI: rank 0 stuck in ~ProcessGroupGloo, its
        # worker in ~AsyncBarrierWork). Sleeping releases the GIL and lets the workers finish.
        time.sleep(BARRIER_SETTLE_S)
        torch.distributed.destroy_process_group()
