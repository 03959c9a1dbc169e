"""Checkpoints of a training run: trainable weights (and the peft adapter), optimizer, scheduler,
every process's RNG and algorithm state, the prompt sampler's position.

Everything is data: weights in safetensors, the other states through the state codec
(meds_cli/engine/run_folders/state_codec.py: safetensors + JSON, read back without unpickling), so a
checkpoint can never run code. A checkpoint is written into a temporary folder, finished with a
manifest of every file's size and checksum, and renamed into place
(meds_cli/engine/run_folders/checkpoint_store.py): a kill or a full disk never leaves a half checkpoint
that a resume would pick up, and the temporary folder of a failed write is removed. A full disk
stops the run with one line naming the checkpoint it can resume from.

  step_N/weights.safetensors   trainable weights          adapter/   peft adapter (for eval)
         optimizer.{json,safetensors}  scheduler.{json,safetensors}
         rng_<rank>.{json,safetensors}  algorithm_<rank>.{json,safetensors}
         in_flight_<rank>.json, in_flight_policy_v<V>.safetensors   at rollout.max_staleness >= 1:
                                       the sampling in flight (engine/rollout/in_flight.py)
         state.json                    step, sampler position, world size, model, algorithm
         manifest.json                 written last: sizes and sha256 of all the above
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from meds_cli.core.errors import UserError, storage_error
from meds_cli.engine.run_folders.checkpoint_store import (
    begin_checkpoint,
    checkpoint_path,
    prune_checkpoints,
    publish_checkpoint,
    temporary_path,
    write_manifest,
)
from meds_cli.engine.run_folders.run_dir import interrupted_run_error
from meds_cli.engine.run_folders.state_codec import load_state, read_tensors, save_state
from meds_cli.engine.training import sharding
from meds_cli.engine.training.update import Policy

WEIGHTS = "weights.safetensors"
STATE = "state.json"


@dataclass
class TrainingState:
    """What a checkpoint saves and restores: the policy (engine/training/update.py Policy: the
    optimizer, the schedule and the FSDP2 units), the model it trains without its DDP wrapper, the
    algorithm's state (MEDS's memory), and the run's progress."""

    policy: Policy
    model: torch.nn.Module
    algorithm: Any
    step: int
    sampler_position: int
    # writes more files of process RANK into the checkpoint folder, write_more(folder, rank): the
    # sampling in flight of an engine apart (engine/rollout/in_flight.py), which the trainer reads back
    write_more: Callable[[Path, int], None] | None = None


@dataclass(frozen=True)
class RunIdentity:
    """Who writes the checkpoint: the accelerator (process rank, world, barriers), the run folder,
    how many checkpoints to keep, and the names recorded for a reader of state.json."""

    acc: Any
    run_dir: Path
    keep: int
    model_name: str
    algorithm_name: str


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(run: RunIdentity, state: TrainingState) -> Path:
    """Write checkpoints/step_N of the run (every process takes part); returns its folder. A
    failed write (full disk, read-only folder) removes its temporary folder and is a UserError."""
    acc, run_dir, step = run.acc, run.run_dir, state.step
    sharded = state.policy.sharded
    main = acc.is_main_process
    tmp = temporary_path(run_dir, step)  # every rank writes its RNG and algorithm state there
    final = checkpoint_path(run_dir, step)
    acc.wait_for_everyone()
    try:
        # Every process: under FSDP2 the full tensors are gathered from the shards (engine/training/sharding.py).
        trainable = sharding.trainable_state(state.model, sharded, main=main)
        optimizer_state = sharding.optimizer_state(state.model, state.policy.optimizer, sharded, main=main)
        if main:
            begin_checkpoint(run_dir, step)
            _write_main_files(run, state, tmp, trainable, optimizer_state)
        acc.wait_for_everyone()
        save_state(rng_state(), tmp, f"rng_{acc.process_index}")
        save_state(state.algorithm.state_dict(), tmp, f"algorithm_{acc.process_index}")
        if state.write_more is not None:
            state.write_more(tmp, acc.process_index)
        acc.wait_for_everyone()
        if main:
            write_manifest(tmp, step=step)
            publish_checkpoint(tmp, run_dir, step)
            prune_checkpoints(run_dir, run.keep)
    except BaseException as error:
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
        failed = storage_error(error)  # safetensors reports a full disk as its own error type
        if failed is not None:
            raise interrupted_run_error(failed, run_dir, f"checkpoint {step}") from None
        raise
    acc.wait_for_everyone()
    return final


def _write_main_files(run: RunIdentity, state: TrainingState, tmp: Path, trainable: dict,
                      optimizer_state: dict) -> None:
    from safetensors.torch import save_file

    save_file(trainable, str(tmp / WEIGHTS))
    if hasattr(state.model, "peft_config"):
        state.model.save_pretrained(str(tmp / "adapter"), state_dict=trainable, safe_serialization=True)
    save_state(optimizer_state, tmp, "optimizer")
    save_state(state.policy.scheduler.state_dict(), tmp, "scheduler")
    info = {"step": state.step, "sampler_position": state.sampler_position, "world_size": run.acc.num_processes,
            "sharding": "fsdp2" if state.policy.sharded is not None else "none",
            "model": run.model_name, "algorithm": run.algorithm_name}
    (tmp / STATE).write_text(json.dumps(info, indent=2) + "\n")


# ---------------------------------------------------------------- loading


def refuse_pickled(path: Path) -> None:
    """Checkpoints of older versions hold pickles (*.pt); they are never unpickled."""
    pickled = sorted(p.name for p in Path(path).glob("*.pt"))
    if pickled and not (Path(path) / "optimizer.json").is_file():
        raise UserError(f"checkpoint {path} holds pickle files ({pickled[0]}) from an older meds; they are not "
                        f"loaded, because unpickling a file can run code: start a new run")


def read_checkpoint_info(path: Path) -> dict:
    """state.json of a checkpoint, checked: step, sampler position and world size as integers."""
    try:
        state = json.loads((Path(path) / STATE).read_text())
        for key in ("step", "sampler_position", "world_size"):
            if type(state[key]) is not int or state[key] < 0:
                raise ValueError(key)
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"checkpoint {path} has no readable {STATE}; it was damaged or replaced") from None
    return state


def load_checkpoint(acc, state: TrainingState, path: Path, optim_cfg) -> None:
    """Restore `state` in place from a checkpoint folder written by save_checkpoint (weights,
    optimizer, schedule, this process's RNG and algorithm state, step and sampler position), then
    apply the run's current optimizer settings (a resume may change the rate, schedule or steps)."""
    path = Path(path)
    refuse_pickled(path)
    info = read_checkpoint_info(path)
    world, policy = acc.num_processes, state.policy
    if info["world_size"] != world:
        raise UserError(f"world size changed: checkpoint {path} was written by {info['world_size']} processes, "
                        f"this run has {world}; resume it with {info['world_size']}")
    sharded = "fsdp2" if policy.sharded is not None else "none"
    if info.get("sharding", "none") != sharded:
        raise UserError(f"train.sharding changed: checkpoint {path} was written with {info.get('sharding')}, "
                        f"this run has {sharded}; resume it with {info.get('sharding')}")
    weights = read_tensors(path / WEIGHTS)
    optimizer = load_state(path, "optimizer")
    scheduler = load_state(path, "scheduler")
    rng = load_state(path, f"rng_{acc.process_index}")
    algorithm = load_state(path, f"algorithm_{acc.process_index}")
    trainable = {n for n, p in state.model.named_parameters() if p.requires_grad}
    try:
        unexpected = sharding.load_trainable_state(state.model, policy.sharded, weights)
        if unexpected or trainable - set(weights):
            odd = (unexpected or sorted(trainable - set(weights)))[0]
            raise ValueError(f"{'unexpected' if unexpected else 'missing'} weight {odd}")
        sharding.load_optimizer_state(state.model, policy.optimizer, policy.sharded, optimizer)
        policy.scheduler.load_state_dict(scheduler)
        set_rng_state(rng)
        state.algorithm.load_state_dict(algorithm)
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as error:
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise UserError(f"checkpoint {path} does not fit this run ({reason})") from None
    apply_optimizer_settings(policy, optim_cfg)
    state.step, state.sampler_position = info["step"], info["sampler_position"]


def apply_optimizer_settings(policy: Policy, optim) -> None:
    """Set the optimizer's hyperparameters and the schedule's base rate from the run config's
    `optim` section, and the current rate from the schedule (as the scheduler computes it), after
    loading a checkpoint that may have been written with other values. Unchanged settings give the
    saved values back."""
    scheduler, groups = policy.scheduler, policy.optimizer.param_groups
    scheduler.base_lrs = [optim.lr for _ in groups]
    rates = [base * factor(scheduler.last_epoch) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, rate in zip(groups, rates):
        group.update(initial_lr=optim.lr, lr=rate, betas=tuple(optim.betas), weight_decay=optim.weight_decay)
    scheduler._last_lr = rates  # what get_last_lr() reports, as after a scheduler step
