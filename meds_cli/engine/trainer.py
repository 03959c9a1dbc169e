"""The one training loop: sample -> score -> shape -> advantages -> loss, for every algorithm.

Accelerate owns devices, mixed precision and process groups; peft owns the adapter. The loop
calls the algorithm's hooks (algorithms/base.py) and never asks which algorithm it runs. The
scoring pass is engine/training/scoring.py, the update engine/training/update.py, sharding engine/training/sharding.py.

Data parallelism: every process samples its share of each step's prompts (the prompt sampler
advances identically everywhere), and the loss of every micro-batch is normalised by counts of
the whole mini-batch over all processes, so N processes make the same update as one process
with the same global batch.
"""

from __future__ import annotations

import math
import random
import signal
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.tasks import PromptSampler, build_task
from meds_cli.core.errors import UserError
from meds_cli.core.forward import decoder_layers
from meds_cli.core.rollouts import Rollouts
from meds_cli.engine.config import to_dict
from meds_cli.engine.model_io.model import apply_lora, load_model_and_tokenizer, reference_context
from meds_cli.engine.rollout.batch import sample_rollouts, sampling_settings
from meds_cli.engine.rollout.engines import make_engine
from meds_cli.engine.run_folders import checkpoints
from meds_cli.engine.run_folders import run_dir as runs
from meds_cli.engine.run_folders.samples_log import record_samples, should_log_samples
from meds_cli.engine.run_folders.trackers import RunTracker, accelerator_kwargs
from meds_cli.engine.training.algorithm_setup import build_algorithm, optimizer_steps_per_batch
from meds_cli.engine.training.importance import mismatch_metrics, truncation_of_sampler
from meds_cli.engine.training.metrics import rollout_metrics, trained_metrics
from meds_cli.engine.training.scoring import (
    has_active_dropout,
    score_rollouts,
    scoring_pass,
    scoring_temperature,
    shares_prompts,
)
from meds_cli.engine.training.sharding import check_distributed_setup, gathered_parameters, global_sum, make_accelerator
from meds_cli.engine.training.update import UpdateSettings, prepare_policy, update_policy
from meds_cli.engine.training.user_rewards import add_channels, load_reward_functions, user_reward_channels

TIMING_KEYS = ("time_generate_s", "time_score_s", "time_train_s", "time_step_s", "tokens_per_s", "time_eval_s")


def lr_lambda(warmup: int, total: int, schedule: str):
    def factor(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant" or total <= warmup:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress

    return factor


class Trainer:
    def __init__(self, cfg, run_dir: Path, *, accelerator=None, model_and_tokenizer=None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.acc = accelerator or make_accelerator(cfg.train, **accelerator_kwargs(cfg.train.report_to, self.run_dir))
        self.world, self.rank = self.acc.num_processes, self.acc.process_index
        check_distributed_setup(self.acc, cfg.train.sharding)
        self._validate()
        self.task = build_task(cfg.task, cfg.train.seed)
        self.algorithm = build_algorithm(cfg, self.task)
        self.reward_functions = load_reward_functions(cfg.reward.functions, cfg.reward.function_weights,
                                                      cfg.reward.function_timeout_s)
        self._seed(cfg.train.seed)
        model, self.tokenizer = model_and_tokenizer or load_model_and_tokenizer(cfg.model.name, cfg.model.dtype)
        skipped, total = self.task.drop_long_prompts(self.tokenizer, cfg.task.max_prompt_tokens)
        if skipped:
            self._say(f"task.max_prompt_tokens={cfg.task.max_prompt_tokens}: left out {skipped} of {total} "
                      "training problems with longer prompts")
        self.sampler = PromptSampler(len(self.task.train), cfg.train.seed)
        self.tracker = RunTracker(self.acc)
        model = apply_lora(model, cfg.model.lora)
        self.policy = prepare_policy(self.acc, model, cfg.train, cfg.optim, self._say)
        self.share_prompts = shares_prompts(cfg.train, self.sharded)  # forwards run each prompt once
        self.update_settings = UpdateSettings.from_config(cfg, self.world, self.share_prompts)
        # Not prepared: Accelerate's scheduler wrapper steps once per process, which would make
        # the schedule depend on the number of processes.
        optim = cfg.optim
        total = cfg.train.steps * optimizer_steps_per_batch(cfg)
        self.policy.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(optim.warmup_steps, total, optim.schedule))
        if self.acc.is_main_process:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = runs.MetricsLog(self.run_dir / "metrics.jsonl")
        # After prepare: the engine samples from (or is sent) the very module the optimizer updates.
        self.engine = make_engine(cfg, self.unwrapped, self.tokenizer,
                                  scratch_dir=self.run_dir / "scratch",  # shared: process 0 writes there
                                  processes=self.world, rank=self.rank, task=self.task)
        # What the algorithm reads besides the update's forward, asked once: the scoring pass is
        # planned from it, and lens values the engine records while sampling (MEDS's logit lens
        # with the hf engine) stand in for the pass where the algorithm asks for them.
        algo = self.algorithm
        records_lens = getattr(self.engine, "records_lens", False)
        self.forward_needs = algo.forward_needs(len(decoder_layers(self.unwrapped)), records_lens)
        if self.forward_needs.lens is not None and not records_lens:
            raise RuntimeError(f"{cfg.algo.name} asked for logit-lens values from an engine that records none")
        self.lens_probe = self.forward_needs.lens
        self.scoring = scoring_pass(self.forward_needs.view, uses_reference=algo.uses_reference,
                                    optimizer_steps_per_batch=optimizer_steps_per_batch(cfg),
                                    setting=cfg.train.scoring_pass,
                                    deterministic_update=not has_active_dropout(self.unwrapped))
        # The mismatch metrics compare like with like only then (engine/training/importance.py).
        self.sampler_is_full_softmax = truncation_of_sampler(cfg.rollout.top_p, cfg.rollout.min_new_tokens) is None
        self.step = 0
        self._stop_requested = False
        self._warned_short_batch = False

    # ------------------------------------------------------------ setup helpers

    def _validate(self):
        cfg = self.cfg
        if cfg.rollout.prompts_per_step % self.world:
            raise UserError(f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} must divide evenly over "
                            f"{self.world} processes")
        if cfg.train.mini_batch_size and cfg.train.mini_batch_size % self.world:
            raise UserError(f"train.mini_batch_size={cfg.train.mini_batch_size} must divide evenly over "
                            f"{self.world} processes")

    @staticmethod
    def _seed(value: int):
        """Python's, numpy's and torch's generators, all from one value."""
        random.seed(value)
        np.random.seed(value % 2**32)
        torch.manual_seed(value)

    def _step_seed(self, step: int) -> int:
        # Every step reseeds from (seed, step, rank): sampling after a resume repeats exactly.
        return (self.cfg.train.seed * 1_000_003 + step * 7919 + self.rank * 104_729) % 2**63

    @property
    def unwrapped(self):
        return self.acc.unwrap_model(self.model)

    # The policy's parts, as the loop, checkpoints and tests read them (engine/training/update.py).
    model = property(lambda self: self.policy.model)
    optimizer = property(lambda self: self.policy.optimizer)
    sharded = property(lambda self: self.policy.sharded)
    scheduler = property(lambda self: self.policy.scheduler)

    # ------------------------------------------------------------ collecting a batch

    def _sample(self, indices: list[int], timing: dict) -> Rollouts:
        cfg, model = self.cfg, self.unwrapped
        problems = [self.task.train[i] for i in indices]
        prompts = [self.task.prompt(p, self.tokenizer) for p in problems]
        t0 = time.perf_counter()
        model.eval()
        # Under the update's autocast, as the scoring pass: the lens values the decode loop records
        # then equal the pass's. (A model Accelerate prepared runs its forward under autocast anyway;
        # under FSDP2 it is not prepared.) The gather is collective under FSDP2: every process enters.
        with self._gathered_for_engine(), self.acc.autocast():
            batch = sample_rollouts(self.engine, self.tokenizer, prompts, problems, cfg.rollout.group_size,
                                    sampling_settings(cfg.rollout, self.tokenizer, lens=self.lens_probe))
        timing["time_generate_s"] += time.perf_counter() - t0
        timing["generated_tokens"] += int(batch.response_mask.sum())
        if not indices:  # entered the engine's call only
            if self.scoring == "sampled":
                self.engine.release()  # as the others do before their scoring pass: the group sleeps and wakes together
            return batch
        if self.scoring == "sampled":  # the rewards or the keep decision read the scoring pass
            self._score(batch, timing)
        algo = self.algorithm
        per_response = [p for p in problems for _ in range(cfg.rollout.group_size)]
        batch.verdicts = self.task.grade(list(zip(per_response, batch.response_texts)))
        own = user_reward_channels(self.reward_functions, [q for q in prompts for _ in range(cfg.rollout.group_size)],
                                   batch.response_texts, per_response)
        batch.reward_components = add_channels(algo.reward_components(batch), own)
        batch.rewards = sum(batch.reward_components.values())
        return batch

    def _gathered_for_engine(self):
        """Under FSDP2, the whole policy gathered for an engine that samples from the training model
        itself (hf: many forwards without collectives in between); an engine with its own copy
        (vLLM) is sent the weights one unit at a time instead, so nothing is gathered for it."""
        reads_policy = getattr(self.engine, "reads_policy_weights", True)
        return gathered_parameters(self.sharded if reads_policy else None)

    def _score(self, batch: Rollouts, timing: dict) -> None:
        """The no-grad scoring pass (engine/training/scoring.py) over `batch`, the algorithm watching.
        The engine is released first (vLLM sleeps): its KV cache would otherwise hold its share of
        the GPU while the pass's forwards run."""
        self.engine.release()
        t0 = time.perf_counter()
        cfg, algo, model = self.cfg, self.algorithm, self.unwrapped
        model.eval()
        with self.acc.autocast():  # the precision of the update's forward, so that an unchanged policy has ratio 1
            score_rollouts(model, batch, cfg.train.micro_batch_size, with_reference=algo.uses_reference,
                           temperature=scoring_temperature(cfg.rollout.temperature),
                           chunk_tokens=cfg.train.logprob_chunk_tokens,
                           wants_hidden_states=self.forward_needs.hidden_states,
                           observe=lambda view: algo.observe_forward(batch, view),
                           disable_adapter=reference_context(model) if algo.uses_reference else None,
                           tokenizer=self.tokenizer, share_prompts=self.share_prompts)
        timing["time_score_s"] += time.perf_counter() - t0

    def _any_process(self, flag: bool) -> bool:
        value = torch.tensor([1.0 if flag else 0.0], device=self.acc.device)
        return bool(self.acc.reduce(value, reduction="sum").item() > 0)

    def _min_over_processes(self, value: int) -> int:
        if self.world == 1:
            return value
        t = torch.tensor([value], device=self.acc.device)
        return int(self.acc.gather(t).min().item())

    def collect(self, timing: dict) -> tuple[Rollouts | None, Rollouts, dict]:
        """Sample rounds until this step has its groups (dynamic sampling), then shape and advantage them."""
        cfg, algo = self.cfg, self.algorithm
        quota = cfg.rollout.prompts_per_step // self.world
        sampled, kept_parts, kept, rounds = [], [], 0, 0
        while rounds < max(1, algo.generation_rounds()):
            indices = self.sampler.take(cfg.rollout.prompts_per_step)[self.rank::self.world]
            rounds += 1
            # Every process takes part in every round, even one whose quota is full: the engine's
            # call may be collective (vLLM's tensor-parallel pooling), so that process enters it
            # with nothing to ask. Under FSDP2 it samples its share as well: the scoring pass
            # gathers parameters collectively, forward by forward.
            if kept >= quota and self.sharded is None:
                indices = []
            part = self._sample(indices, timing)
            if part.size:
                sampled.append(part)
                part = part.select_groups(algo.keep_groups(part))
                kept_parts.append(part)
                kept += part.num_groups
            if not self._any_process(kept < quota):
                break
        all_sampled = Rollouts.concat(sampled, self.tokenizer.pad_token_id)
        # Every process trains on the same number of groups, so the collective steps line up.
        groups = self._min_over_processes(min(kept, quota))
        info = {"groups_sampled": all_sampled.num_groups, "groups_kept": kept, "generation_rounds": rounds,
                "groups_dropped": all_sampled.num_groups - kept, "groups_trained": groups}
        if groups < quota and not self._warned_short_batch:
            self._warned_short_batch = True
            hint = algo.short_batch_hint()
            self._say(f"[yellow]warning:[/] only {groups} of {quota} groups per process had a reward spread after "
                      f"{rounds} sampling rounds; training on what was kept" + (f" ({hint})" if hint else ""))
        if groups == 0:
            return None, all_sampled, info
        batch = Rollouts.concat([p for p in kept_parts if p.size], self.tokenizer.pad_token_id)
        batch = batch.select_groups(torch.arange(batch.num_groups) < groups)
        if self.scoring == "trained":  # only the groups that train; the same count on every process
            self._score(batch, timing)
        if self.lens_probe is not None:
            t0 = time.perf_counter()
            algo.observe_probe(batch, self.tokenizer)
            timing["time_score_s"] += time.perf_counter() - t0
        algo.shape_rewards(batch)
        batch.advantages = algo.compute_advantages(batch)
        return batch, all_sampled, info

    # ------------------------------------------------------------ the update

    def update(self, batch: Rollouts) -> dict:
        return update_policy(self.policy, self.algorithm, batch, self.update_settings, self.acc, self.engine)

    # ------------------------------------------------------------ one step, the loop

    def train_step(self) -> dict:
        step = self.step + 1
        self._seed(self._step_seed(step))
        timing = {"time_generate_s": 0.0, "time_score_s": 0.0, "generated_tokens": 0}
        t_start = time.perf_counter()
        batch, sampled, info = self.collect(timing)
        t_train = time.perf_counter()
        row = {"step": step, **info, **rollout_metrics(sampled)}
        if batch is not None:
            row["reward_shaped"] = batch.rewards.mean().item()
            row.update(self.update(batch))  # fills batch.old_logp where no scoring pass did
            if batch.sampler_logp is not None and self.sampler_is_full_softmax:
                row.update(mismatch_metrics(batch.old_logp, batch.sampler_logp, batch.response_mask,
                                            self.cfg.rollout.tis_cap))
            row.update(trained_metrics(batch))
            self.algorithm.on_step_end(batch, step)
            row.update(self.algorithm.step_metrics(batch))
        else:
            row["skipped_update"] = 1.0
        if should_log_samples(step, self.cfg.train.log_samples_every) and self.acc.is_main_process:
            record_samples(self.run_dir, step, batch if batch is not None else sampled,
                           self.cfg.train.log_samples_prompts, self.tracker)
        row["lr"] = self.scheduler.get_last_lr()[0]
        timing["time_train_s"] = time.perf_counter() - t_train
        timing["time_step_s"] = time.perf_counter() - t_start
        timing["tokens_per_s"] = timing["generated_tokens"] / max(timing["time_generate_s"], 1e-9)
        row.update({k: v for k, v in timing.items() if k != "generated_tokens"})
        self.step = step
        if self.cfg.eval.every and step % self.cfg.eval.every == 0:
            row.update(self.quick_eval())
        row = self._reduce_metrics(row)  # after the eval: each process evaluated its share
        if self.acc.is_main_process:
            self.metrics.append(row)
            self.tracker.log(row, step)
        return row

    def _reduce_metrics(self, row: dict) -> dict:
        if self.world == 1:
            return row
        keys = sorted(k for k, v in row.items() if isinstance(v, (int, float)) and k != "step")
        values = torch.tensor([float(row[k]) for k in keys], device=self.acc.device)
        mean = self.acc.reduce(values, reduction="mean").tolist()
        return {**row, **dict(zip(keys, mean))}

    @torch.no_grad()
    def quick_eval(self) -> dict:
        """Greedy (or eval.temperature) accuracy on the task's held-out problems, each process
        taking its share; the counts are summed over processes, so every process returns the
        same numbers."""
        t0 = time.perf_counter()
        problems = self.task.held_out[: self.cfg.eval.problems][self.rank::self.world]
        correct = 0
        model = self.unwrapped
        model.eval()
        prompts = [self.task.prompt(p, self.tokenizer) for p in problems]
        settings = sampling_settings(self.cfg.rollout, self.tokenizer, temperature=self.cfg.eval.temperature, top_p=1.0)
        # Every process, even one without problems (an empty list): the gather is collective under
        # FSDP2, and so may the engine's call be (vLLM's tensor-parallel pooling).
        with self._gathered_for_engine():
            batch = sample_rollouts(self.engine, self.tokenizer, prompts, problems, 1, settings)
        if problems:
            correct = sum(v.correct for v in self.task.grade(list(zip(problems, batch.response_texts))))
        total = global_sum(self.acc, len(problems))
        if total == 0:
            return {}
        return {"eval/accuracy": global_sum(self.acc, correct) / total, "eval/problems": int(total),
                "time_eval_s": time.perf_counter() - t0}

    def train(self, on_step=None) -> list[dict]:
        """Run to cfg.train.steps; a first Ctrl-C finishes the step, checkpoints and stops."""
        rows = []
        previous = signal.getsignal(signal.SIGINT)
        if self.acc.is_main_process and hasattr(signal, "SIGINT"):
            signal.signal(signal.SIGINT, self._request_stop)
        self.tracker.start(to_dict(self.cfg, self.algorithm.config_sections), self.run_dir.name)
        try:
            while self.step < self.cfg.train.steps:
                row = self.train_step()
                rows.append(row)
                if on_step:
                    on_step(row)
                every = self.cfg.train.checkpoint_every
                if self.step == self.cfg.train.steps or (every and self.step % every == 0):
                    self.save_checkpoint()
                if self._any_process(self._stop_requested):
                    if not (every and self.step % every == 0):
                        self.save_checkpoint()
                    raise KeyboardInterrupt
        finally:
            signal.signal(signal.SIGINT, previous)
            self.tracker.end()
        return rows

    def _request_stop(self, signum, frame):
        if self._stop_requested:
            raise KeyboardInterrupt  # second Ctrl-C: stop now, without a checkpoint
        self._stop_requested = True
        self._say("[yellow]interrupt:[/] finishing this step, then writing a checkpoint "
                  "(Ctrl-C again to abort at once)")

    def _say(self, text: str):
        if self.acc.is_main_process:
            from rich.console import Console

            Console(stderr=True).print(text)

    # ------------------------------------------------------------ checkpoints (run_folders/checkpoints.py)

    def _training_state(self) -> checkpoints.TrainingState:
        return checkpoints.TrainingState(self.policy, self.unwrapped, self.algorithm, self.step, self.sampler.position)

    def save_checkpoint(self) -> Path:
        cfg = self.cfg
        run = checkpoints.RunIdentity(self.acc, self.run_dir, cfg.train.keep_checkpoints, cfg.model.name, cfg.algo.name)
        return checkpoints.save_checkpoint(run, self._training_state())

    def load_checkpoint(self, path: Path) -> None:
        state = self._training_state()
        checkpoints.load_checkpoint(self.acc, state, path, self.cfg.optim)
        self.step, self.sampler.position = state.step, state.sampler_position
        if self.acc.is_main_process:
            self.metrics.truncate_after(self.step)
        self.engine.policy_updated()  # an engine with its own copy of the policy takes the loaded weights
