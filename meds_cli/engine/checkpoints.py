"""Checkpoints of a training run: trainable weights (and the peft adapter), optimizer, scheduler,
every process's RNG and algorithm state, the prompt sampler's position.

A checkpoint is written into a temporary folder and renamed into place (meds_cli/engine/runs.py),
so an interrupted write never leaves a half checkpoint that a resume would pick up.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch

from meds_cli.core.errors import UserError
from meds_cli.engine import runs


def save_checkpoint(trainer) -> Path:
    """Write checkpoints/step_N of the trainer's run (every process takes part); returns its folder."""
    from safetensors.torch import save_file

    acc = trainer.acc
    acc.wait_for_everyone()
    tmp = runs.temporary_checkpoint_dir(trainer.run_dir, trainer.step)  # every rank writes its RNG and algorithm state there
    if acc.is_main_process:
        runs.begin_checkpoint(trainer.run_dir, trainer.step)
        model = trainer.unwrapped
        trainable = {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}
        save_file(trainable, str(tmp / "weights.safetensors"))
        if hasattr(model, "peft_config"):
            model.save_pretrained(str(tmp / "adapter"))
        torch.save(trainer.optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(trainer.scheduler.state_dict(), tmp / "scheduler.pt")
        state = {"step": trainer.step, "sampler_position": trainer.sampler.position, "world_size": trainer.world,
                 "model": trainer.cfg.model.name, "algorithm": trainer.cfg.algo.name}
        (tmp / "state.json").write_text(json.dumps(state, indent=2) + "\n")
    acc.wait_for_everyone()
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
               tmp / f"rng_{trainer.rank}.pt")
    torch.save(trainer.algorithm.state_dict(), tmp / f"algorithm_{trainer.rank}.pt")
    acc.wait_for_everyone()
    final = runs.checkpoint_dir(trainer.run_dir, trainer.step)
    if acc.is_main_process:
        final = runs.finish_checkpoint(tmp, trainer.run_dir, trainer.step)
    acc.wait_for_everyone()
    return final

def load_checkpoint(trainer, path: Path) -> None:
    """Restore the trainer from a checkpoint folder written by save_checkpoint."""
    from safetensors.torch import load_file

    state = json.loads((path / "state.json").read_text())
    if state.get("world_size", 1) != trainer.world:
        raise UserError(f"checkpoint {path} was written by {state.get('world_size')} processes; resume it with the same number")
    weights = load_file(str(path / "weights.safetensors"))
    missing = trainer.unwrapped.load_state_dict(weights, strict=False)
    unexpected = [k for k in missing.unexpected_keys]
    if unexpected:
        raise UserError(f"checkpoint {path} does not match this model (unexpected weights such as {unexpected[0]})")
    trainer.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    trainer.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    rng = torch.load(path / f"rng_{trainer.rank}.pt", weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    trainer.algorithm.load_state_dict(torch.load(path / f"algorithm_{trainer.rank}.pt", weights_only=False))
    trainer.step = state["step"]
    trainer.sampler.position = state["sampler_position"]
    if trainer.acc.is_main_process:
        trainer.metrics.truncate_after(trainer.step)
