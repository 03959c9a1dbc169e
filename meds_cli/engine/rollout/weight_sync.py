"""What a rollout engine with its own copy of the policy (vLLM) is sent after an update: the
policy's weights with LoRA folded in, or its LoRA adapter alone, as full tensors whether the
training model is plain or sharded with FSDP2.

Under FSDP2 every parameter is a shard (DTensor). The merged weights are gathered one FSDP2 unit
at a time (a decoder layer, then the embeddings, final norm and head around them): gathered,
merged, cast to the engine's dtype, handed over and freed before the next unit is gathered, as
verl's per-tensor sync does, so a process never holds more than one unit unsharded. Gathering is
collective: every process reads the weights to the end, in the same order.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from meds_cli.core.forward import peft_base
from meds_cli.core.unsharded import unsharded


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A parameter's whole value, detached: an FSDP2 shard (DTensor) is gathered from every
    process (a collective: every process calls it), any other tensor is itself."""
    tensor = tensor.detach()
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def adapter_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The LoRA weights as full CPU tensors, keyed as in model.state_dict(): the same whether the
    model's parameters are FSDP2 shards or gathered for sampling. A collective under FSDP2."""
    return {name: full_tensor(p).cpu() for name, p in model.named_parameters() if ".lora_" in name}


def process_rank() -> int:
    """This process's rank in the launcher's process group (0 without one)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def wait_for_processes() -> None:
    """A barrier over the launcher's process group, where there is one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def sharding_units(model: nn.Module) -> list[tuple[nn.Module | None, list[str]]]:
    """The FSDP2 units of `model` with the names (as in model.named_parameters()) of the
    parameters each one shards, nested units first; one (None, every name) for a model that is
    not sharded."""
    from torch.distributed.fsdp import FSDPModule

    units = [(prefix, m) for prefix, m in model.named_modules() if isinstance(m, FSDPModule)]
    names = [name for name, _ in model.named_parameters()]
    if not units:
        return [(None, names)]
    owned: dict[str | None, list[str]] = {prefix: [] for prefix, _ in units}
    owned[None] = []  # parameters outside every unit: plain tensors
    for name in names:  # a parameter belongs to the innermost unit around it
        owner = max((p for p, _ in units if p == "" or name.startswith(p + ".")), key=len, default=None)
        owned[owner].append(name)
    ordered = [*sorted(units, key=lambda unit: unit[0] == ""), (None, None)]  # the root (prefix "") last
    return [(module, owned[prefix]) for prefix, module in ordered if owned[prefix]]


@contextmanager
def unit_gathered(model: nn.Module, unit: nn.Module | None, names: list[str]):
    """The unit's parameters unsharded for the duration, then sharded again; a unit already
    gathered (sampling's gathered_parameters) is left as it is."""
    from torch.distributed.tensor import DTensor

    sharded = unit is not None and isinstance(model.get_parameter(names[0]), DTensor)
    with unsharded([unit] if sharded else []):
        yield


def merged_weights(model: nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of the policy as plain transformers weights: each LoRA adapter folded
    into its base weight, peft's wrapping removed from the names, cast to `dtype` (None: as they
    are); under FSDP2 gathered one unit at a time (the module docstring). Read it to the end on
    every process."""
    inner = peft_base(model)
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        LoraLayer = ()  # noqa: N806 - no peft, no adapters
    adapted = {name: m for name, m in inner.named_modules() if LoraLayer and isinstance(m, LoraLayer)}
    for unit, names in sharding_units(inner):
        with unit_gathered(inner, unit, names):
            for name in names:
                if ".lora_" in name:
                    continue
                tensor = full_tensor(inner.get_parameter(name))
                if ".base_layer." in name:
                    module_name, leaf = name.split(".base_layer.")
                    layer = adapted[module_name]
                    name = f"{module_name}.{leaf}"
                    if leaf == "weight" and not layer.merged and not layer.disable_adapters:
                        # one merged copy of this weight, in its own dtype, cast below
                        tensor = tensor + sum(layer.get_delta_weight(a).to(tensor.dtype)
                                              for a in layer.active_adapters if a in layer.lora_A)
                yield name, tensor if dtype is None else tensor.to(dtype)
