"""The update side of a training step: the policy set up for training (gradient checkpointing,
precision, DDP or FSDP2), and one rollout batch turned into optimizer steps.

One optimizer step per mini-batch under every accepted launch: micro-batches accumulate
gradients, each micro-batch's loss normalised by counts of the whole mini-batch over all
processes, so any number of processes and any micro-batch size make the update one process makes
with the whole mini-batch. Under DDP gradients are all-reduced on the last micro-batch only; under
FSDP2 they are reduce-scattered after every micro-batch (no process ever holds a full gradient).
Launches that would step differently (DeepSpeed, Accelerate's FSDP plugin, Accelerate's own
accumulation) are refused before the model loads (engine/training/sharding.py).
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import torch

from algorithms.policy_loss import agg_loss
from meds_cli.core.markup import plain
from meds_cli.core.rollouts import Rollouts
from meds_cli.engine.training import micro_batches, sharding
from meds_cli.engine.training.importance import is_correction_weights
from meds_cli.engine.training.metrics import mean_of
from meds_cli.engine.training.micro_batches import MicroBatch, micro_batch_inputs, to_width
from meds_cli.engine.training.packing import PADDED, Packing
from meds_cli.engine.training.precision import low_precision_training_warning
from meds_cli.engine.training.scoring import policy_forward, scoring_temperature


@dataclass
class Policy:
    """The model as the loop calls it (DDP wrapper, sharded module or plain), its optimizer, the
    FSDP2 units when sharded (None otherwise), and the learning-rate schedule (set by the trainer
    once the number of optimizer steps is known)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    sharded: sharding.Sharded | None = None
    scheduler: Any = None


@dataclass(frozen=True)
class UpdateSettings:
    """What the update reads of the run config, per process."""

    ppo_epochs: int
    mini_batch_size: int | None  # rows per process and optimizer step; None: the whole batch
    micro_batch_size: int
    temperature: float  # log-probs at the sampling temperature (scoring.scoring_temperature)
    chunk_tokens: int
    is_correction: str
    tis_cap: float
    grad_clip: float
    norm_length: int  # the length a fixed-length loss aggregation divides by
    share_prompts: bool
    micro_batch_tokens: int = 0  # 0: micro_batch_size rows at the batch's width (engine/training/micro_batches.py)
    packing: Packing = PADDED  # padding-free micro-batches (engine/training/packing.py)

    @classmethod
    def from_config(cls, cfg, world: int, share_prompts: bool, packing: Packing = PADDED) -> UpdateSettings:
        mini = cfg.train.mini_batch_size // world if cfg.train.mini_batch_size else None
        return cls(ppo_epochs=cfg.train.ppo_epochs, mini_batch_size=mini, micro_batch_size=cfg.train.micro_batch_size,
                   temperature=scoring_temperature(cfg.rollout.temperature),
                   chunk_tokens=cfg.train.logprob_chunk_tokens, is_correction=cfg.rollout.is_correction,
                   tis_cap=cfg.rollout.tis_cap, grad_clip=cfg.optim.grad_clip, norm_length=cfg.rollout.max_new_tokens,
                   share_prompts=share_prompts, micro_batch_tokens=cfg.train.micro_batch_tokens, packing=packing)


def enable_gradient_checkpointing(model) -> None:
    """Recompute every decoder layer in the backward pass. With a LoRA adapter the frozen
    embeddings produce no gradient, so their output is made to require one: the checkpointed
    layers then still have a gradient path to the adapter weights inside them."""
    lm = sharding.causal_lm(model)
    settings = {"use_reentrant": False}
    if hasattr(lm, "activation_checkpointing_enable"):  # transformers 5: makes input embeddings require grad itself
        lm.activation_checkpointing_enable(activation_checkpointing_kwargs=settings)
    else:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=settings)
        lm.enable_input_require_grads()
    lm.config.use_cache = False


def prepare_policy(acc, model, train_cfg, optim_cfg, say: Callable[[str], None]) -> Policy:
    """Gradient checkpointing, a warning for low-precision trainable weights, then DDP through
    Accelerate (train.sharding none) or FSDP2 (fsdp2, with several processes); the optimizer is
    made after sharding, over the shards."""
    if train_cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    warning = low_precision_training_warning(model.parameters())
    if warning:
        say(f"[yellow]warning:[/] {plain(warning)}")

    def adamw(module):
        params = [p for p in module.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=optim_cfg.lr, betas=tuple(optim_cfg.betas),
                                 weight_decay=optim_cfg.weight_decay)

    if train_cfg.sharding == "fsdp2" and acc.num_processes > 1:
        # Shard first, never move the whole model: fully_shard moves each unit's parameters to the
        # mesh's device itself, one unit at a time, and keeps only the shard (FSDP2's own examples
        # build on CPU or meta, then shard); a move before would hold the full model on every GPU.
        gpu_bf16 = acc.device.type == "cuda" and acc.mixed_precision == "bf16"
        sharded = sharding.shard_model(model, sharding.device_mesh(acc),
                                       param_dtype=torch.bfloat16 if gpu_bf16 else None)
        return Policy(model, acc.prepare(adamw(model)), sharded)
    if train_cfg.sharding == "fsdp2":
        say("[yellow]note:[/] train.sharding=fsdp2 with one process has nothing to shard; training unsharded")
    optimizer = adamw(model)
    model, optimizer = acc.prepare(model, optimizer)
    return Policy(model, optimizer)


def update_policy(policy: Policy, algo, batch: Rollouts, settings: UpdateSettings, acc, engine) -> dict:
    """PPO epochs x mini-batches of optimizer steps on `batch`; returns the update's metrics.

    Without a scoring pass (batch.old_logp is None: one optimizer step per batch, engine/training/scoring.py)
    the old log-probs are this forward's own, detached: they fill batch.old_logp, and its entropy
    batch.entropy. The rollout engine is released for the update (vLLM sleeps) and told of every
    optimizer step."""
    model, world = policy.model, acc.num_processes
    engine.release()
    model.train()
    size = batch.size
    mini = settings.mini_batch_size or size
    own_old = batch.old_logp is None
    if own_old:
        batch.entropy = torch.zeros_like(batch.response_mask)
        batch.old_logp = torch.zeros_like(batch.response_mask)
    mask = algo.loss_mask(batch)
    params = [p for p in model.parameters() if p.requires_grad]
    stats, losses, grad_norms = [], [], []
    for _epoch in range(settings.ppo_epochs):
        for start in range(0, size, mini):
            rows = list(range(start, min(start + mini, size)))
            total_tokens = max(sharding.global_sum(acc, mask[rows].sum().item()), 1.0)
            total_seqs = max(sharding.global_sum(acc, len(rows)), 1.0)
            step_loss = 0.0
            chunks = plan_update_micro_batches(batch, rows, settings, acc)
            for k, chunk in enumerate(chunks):
                last = k == len(chunks) - 1
                sync = nullcontext() if last or policy.sharded is not None else acc.no_sync(model)
                with sync:
                    loss, s = micro_batch_loss(model, algo, batch, list(chunk.rows), mask, settings, acc,
                                               own_old and chunk.counts, total_tokens=total_tokens,
                                               total_seqs=total_seqs)
                    loss = loss if chunk.counts else loss * 0.0  # a stand-in that lines up collectives
                    # DDP and FSDP2 average gradients over processes; the normalisers are global already.
                    acc.backward(loss * world)
                step_loss += loss.item()
                if chunk.counts:
                    stats.append(s)
            acc.unscale_gradients()  # fp16's loss scale, before the norm is measured
            grad_norms.append(float(sharding.clip_gradients(params, settings.grad_clip)))
            losses.append(step_loss)
            policy.optimizer.step()
            engine.policy_updated()
            policy.scheduler.step()
            policy.optimizer.zero_grad(set_to_none=True)
    out = mean_of(stats)
    out.update(loss=sum(losses) / len(losses), grad_norm=sum(grad_norms) / len(grad_norms),
               optimizer_steps=len(losses))
    return out


_warned_over_budget = False


def plan_update_micro_batches(batch: Rollouts, rows: list[int], settings: UpdateSettings, acc) -> list[MicroBatch]:
    """The micro-batches of mini-batch `rows`: micro_batch_size rows at a time, or by tokens
    (micro_batch_tokens: real tokens when packed), as many on every process as on the one that
    needs the most."""
    return micro_batches.plan_micro_batches(batch, rows, size=settings.micro_batch_size,
                                            budget=settings.micro_batch_tokens, packed=settings.packing.on,
                                            share_prompts=settings.share_prompts and settings.packing.masked,
                                            most_over_processes=lambda count: int(sharding.global_max(acc, count)),
                                            on_over_budget=lambda count, longest: _warn_over_budget(
                                                count, longest, settings.micro_batch_tokens, acc))


def _warn_over_budget(count: int, longest: int, budget: int, acc) -> None:
    global _warned_over_budget
    if not _warned_over_budget and acc.is_main_process:
        _warned_over_budget = True
        print(f"warning: {count} rows (the longest {longest} tokens) are longer than "
              f"train.micro_batch_tokens={budget}: each runs in a micro-batch of its own (said once)", file=sys.stderr)


def micro_batch_loss(model, algo, batch: Rollouts, chunk: list[int], mask: torch.Tensor, settings: UpdateSettings,
                     acc, own_old: bool, *, total_tokens: float, total_seqs: float) -> tuple[torch.Tensor, dict]:
    """The loss of rows `chunk`, normalised by the mini-batch's global counts, and its statistics.
    Where the update's forward stands in for the scoring pass (`own_old`), its log-probs,
    detached, become the batch's old log-probs and its entropy the batch's entropy."""
    device = acc.device
    bonus = algo.entropy_coef > 0  # the entropy bonus needs the entropy with its gradient
    packing = settings.packing  # packed rows carry no padding: nothing to cut
    ids, attention, prompt_width, tokens, response_mask = micro_batch_inputs(
        batch, chunk, cut=settings.micro_batch_tokens > 0 and not packing.on)
    with acc.autocast():
        logp, entropy, _, _ = policy_forward(
            model, ids.to(device), attention.to(device), prompt_width, tokens.to(device),
            temperature=settings.temperature, response_mask=response_mask.to(device),
            chunk_tokens=settings.chunk_tokens, with_entropy=own_old, share_prompts=settings.share_prompts,
            entropy_grad=bonus, packing=packing, keep_states=False)
    width = batch.response_ids.shape[1]  # a cut micro-batch's values, padded back to the batch's width
    logp = to_width(logp, width)
    entropy = to_width(entropy, width) if entropy is not None else None
    if own_old:
        old = logp.detach()
        batch.entropy[chunk] = entropy.detach().cpu().to(batch.entropy.dtype)
        batch.old_logp[chunk] = old.cpu().to(batch.old_logp.dtype)
    else:
        old = batch.old_logp[chunk].to(device)
    ref = batch.ref_logp[chunk].to(device) if batch.ref_logp is not None else None
    chunk_mask = mask[chunk].to(device)
    sampler = batch.sampler_logp[chunk].to(device) if batch.sampler_logp is not None else None
    # The engine sampled from pi_sampler, not pi_old: the policy-gradient term is reweighted.
    weights = is_correction_weights(settings.is_correction, old, sampler, settings.tis_cap)
    loss_mat, stats = algo.token_loss(logp, old, batch.advantages[chunk].to(device), chunk_mask, ref, weights,
                                      entropy if bonus else None)
    loss = agg_loss(loss_mat, chunk_mask, algo.loss_agg, total_tokens=total_tokens, total_seqs=total_seqs,
                    norm_length=settings.norm_length)
    return loss, stats
