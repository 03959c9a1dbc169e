"""The one training loop, for every algorithm. One step (`Trainer.train_step`):

  collect     sample rounds of prompts until the step has its groups, grade and reward them
              (engine/training/collect.py; the rollouts come from the rollout source,
              engine/rollout/source.py, with the engine behind it)
  score       the no-grad scoring pass where the algorithm or the update needs it, then the
              algorithm shapes the rewards and computes advantages (engine/training/scoring.py)
  update      the policy's optimizer steps over the batch (engine/training/update.py)
  sync        the engine takes the new weights (inside the update: engine.policy_updated; then
              source.policy_settled(step): the weights are version `step`)
  log         the step's metrics, averaged over processes, into metrics.jsonl and the trackers
              (the source's too: with an engine apart, the rollouts' staleness, the waiting,
              the overlap and the planned rounds a step did not use)
  checkpoint  every train.checkpoint_every steps, at the end and on Ctrl-C (run_folders/checkpoints.py)

Accelerate owns devices, mixed precision and process groups; peft owns the adapter. The loop
calls the algorithm's hooks (algorithms/base.py) and never asks which algorithm it runs. What
it works with is built once, in order, by engine/trainer_parts.py.

Off-policy steps (`rollout.max_staleness: k` >= 1, an engine that runs apart from the trainer)
are the rollout source's business (engine/rollout/source.py): it samples the first round of the
next k steps while this step trains, re-plans after DAPO's extra rounds, reports staleness and
records what is in flight at a checkpoint. The loop makes the same calls with a colocated
engine, for which the source has nothing ahead.

Data parallelism: every process samples its share of each step's prompts (the prompt sampler
advances identically everywhere), and the loss of every micro-batch is normalised by counts of
the whole mini-batch over all processes, so N processes make the same update as one process
with the same global batch.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from meds_cli.core.markup import plain
from meds_cli.engine.config import to_dict
from meds_cli.engine.rollout.quick_eval import held_out_accuracy
from meds_cli.engine.run_folders import checkpoints
from meds_cli.engine.run_folders.samples_log import record_samples, should_log_samples
from meds_cli.engine.trainer_parts import build_parts, lr_lambda, say
from meds_cli.engine.training.collect import collect_groups, reward_rollouts
from meds_cli.engine.training.metrics import rollout_metrics, update_metrics
from meds_cli.engine.training.scoring import score_rollouts, scoring_temperature
from meds_cli.engine.training.seeding import seed_everything, step_seed
from meds_cli.engine.training.sharding import gathered_parameters
from meds_cli.engine.training.update import update_policy

__all__ = ["TIMING_KEYS", "Trainer", "lr_lambda"]

TIMING_KEYS = ("time_generate_s", "time_score_s", "time_train_s", "time_step_s", "tokens_per_s", "time_eval_s")


class Trainer:
    """One run's loop; what it works with is built by engine/trainer_parts.py."""

    def __init__(self, cfg, run_dir: Path, *, accelerator=None, model_and_tokenizer=None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        parts = build_parts(cfg, self.run_dir, accelerator, model_and_tokenizer)  # see TrainerParts
        self.acc, self.world, self.rank, self.collectives = parts.acc, parts.world, parts.rank, parts.collectives
        self.task, self.algorithm, self.reward_functions = parts.task, parts.algorithm, parts.reward_functions
        self.tokenizer, self.tracker, self.source = parts.tokenizer, parts.tracker, parts.source
        self.policy, self.reference, self.metrics = parts.policy, parts.reference, parts.metrics
        self.share_prompts, self.update_settings = parts.share_prompts, parts.update_settings
        self.forward_needs, self.lens_probe, self.scoring = parts.forward_needs, parts.lens_probe, parts.scoring
        self.sampler_is_full_softmax = parts.sampler_is_full_softmax
        self.diversity = parts.diversity  # the diversity/ metrics (engine/training/diversity.py)
        self.precision = parts.precision  # "precision: bf16 (why)", said when training starts
        self.layout = parts.layout  # "padding-free: on (why)", said beside it
        self.step = 0
        self._stop_requested = False
        self._warned_short_batch = False

    @property
    def unwrapped(self):
        return self.acc.unwrap_model(self.model)

    @property
    def engine(self):
        """The rollout engine, behind the rollout source (engine/rollout/source.py)."""
        return self.source.engine

    @engine.setter
    def engine(self, engine) -> None:
        self.source.engine = engine

    # The policy's parts, as the loop, checkpoints and tests read them (engine/training/update.py).
    model = property(lambda self: self.policy.model)
    optimizer = property(lambda self: self.policy.optimizer)
    sharded = property(lambda self: self.policy.sharded)
    scheduler = property(lambda self: self.policy.scheduler)

    # ------------------------------------------------------------ one step, the loop

    def train_step(self) -> dict:
        step = self.step + 1
        seed_everything(step_seed(self.cfg.train.seed, step, self.rank))  # a resume samples the same
        timing = {"time_generate_s": 0.0, "time_score_s": 0.0, "generated_tokens": 0}
        t_start = time.perf_counter()
        self.source.begin_step(step)  # an engine apart starts on the rounds planned for the next steps
        batch, sampled, info = self.collect(timing)  # sampled, rewarded, shaped, with advantages
        t_train = time.perf_counter()
        row = {"step": step, **info, **rollout_metrics(sampled)}
        if batch is not None:
            row["reward_shaped"] = batch.rewards.mean().item()
            row.update(self.update(batch))  # fills batch.old_logp where no scoring pass did; syncs the engine
            row.update(update_metrics(batch, tis_cap=self.cfg.rollout.tis_cap,
                                      sampler_is_full_softmax=self.sampler_is_full_softmax))
            self.algorithm.on_step_end(batch, step)  # MEDS's memory, say
            row.update(self.algorithm.step_metrics(batch))
        else:
            row["skipped_update"] = 1.0  # a process kept no group, so no process updates
        row.update(self.diversity.step_metrics(sampled, batch))  # every process: it sums a count over them
        self.source.policy_settled(step)  # the weights are version `step` (an engine apart: sent with its next job)
        if should_log_samples(step, self.cfg.train.log_samples_every) and self.acc.is_main_process:
            record_samples(self.run_dir, step, batch if batch is not None else sampled,
                           self.cfg.train.log_samples_prompts, self.tracker)
        row["lr"] = self.scheduler.get_last_lr()[0]
        timing["time_train_s"] = time.perf_counter() - t_train
        timing["time_step_s"] = time.perf_counter() - t_start
        timing["tokens_per_s"] = timing["generated_tokens"] / max(timing["time_generate_s"], 1e-9)
        row.update({k: v for k, v in timing.items() if k != "generated_tokens"})
        row.update(self.source.step_metrics(sampled))  # staleness, waiting and overlap, prefetch misses
        self.step = step
        if self.cfg.eval.every and step % self.cfg.eval.every == 0:
            row.update(self.quick_eval())
        row = self.collectives.mean_of_numbers(row)  # after the eval: each process evaluated its share
        if self.acc.is_main_process:
            self.metrics.append(row)
            self.tracker.log(row, step)
        return row

    def train(self, on_step=None) -> list[dict]:
        """Run to cfg.train.steps; a first Ctrl-C finishes the step, checkpoints and stops."""
        rows = []
        self._say(plain(self.precision))
        self._say(plain(self.layout))
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
                if self.collectives.any(self._stop_requested):  # every process stops at the same step
                    if not (every and self.step % every == 0):
                        self.save_checkpoint()
                    raise KeyboardInterrupt
        finally:
            signal.signal(signal.SIGINT, previous)
            self.tracker.end()
            self.close()
        return rows

    def close(self) -> None:
        """Stop an engine that runs apart (its worker or server); nothing for one in this process."""
        self.source.close()

    # ------------------------------------------------------------ collect and score

    def collect(self, timing: dict) -> tuple:
        """Sample rounds until this step has its groups (dynamic sampling), then shape and advantage them."""
        algo = self.algorithm
        batch, sampled, info = collect_groups(
            self.source.prompts, algo, lambda indices: self._sample(indices, timing), self.collectives,
            prompts_per_step=self.cfg.rollout.prompts_per_step, rank=self.rank,
            sample_when_full=self.sharded is not None, pad_token_id=self.tokenizer.pad_token_id)
        self.source.rounds_done(info["generation_rounds"])  # extra rounds (DAPO) replan the rounds ahead
        self._warn_if_short(info)
        if batch is None:
            return None, sampled, info
        if self.scoring == "trained":  # only the groups that train; the same count on every process
            self._score(batch, timing)
        if self.forward_needs.lens is not None:  # the algorithm reads lens values the engine recorded while sampling
            t0 = time.perf_counter()
            algo.observe_probe(batch, self.tokenizer)
            timing["time_score_s"] += time.perf_counter() - t0
        algo.shape_rewards(batch)
        batch.advantages = algo.compute_advantages(batch)
        return batch, sampled, info

    def _sample(self, indices: list[int], timing: dict):
        """This process's `indices` sampled G times each, then graded and rewarded."""
        t0 = time.perf_counter()
        self.unwrapped.eval()
        # Under the update's autocast, as the scoring pass: the lens values the decode loop records
        # then equal the pass's. (A model Accelerate prepared runs its forward under autocast anyway;
        # under FSDP2 it is not prepared.) The gather is collective under FSDP2: every process enters.
        with self._gathered_for_engine(), self.acc.autocast():
            batch, problems, prompts = self.source.sample(
                indices, vocab_size=self.unwrapped.get_input_embeddings().num_embeddings)
        timing["time_generate_s"] += time.perf_counter() - t0
        timing["generated_tokens"] += int(batch.response_mask.sum())
        if not indices:  # entered the engine's call only
            if self.scoring == "sampled":
                self.engine.release()  # as the others do before their scoring pass: the group sleeps and wakes together
            return batch
        if self.scoring == "sampled":  # the rewards or the keep decision read the scoring pass
            self._score(batch, timing)
        reward_rollouts(batch, problems, prompts, self.cfg.rollout.group_size, self.task, self.algorithm,
                        self.reward_functions)
        return batch

    def _gathered_for_engine(self):
        """Under FSDP2, the whole policy gathered for an engine that samples from the training model
        itself (hf: many forwards without collectives in between); an engine with its own copy
        (vLLM) is sent the weights one unit at a time instead, so nothing is gathered for it."""
        return gathered_parameters(self.sharded if self.engine.reads_policy_weights else None)

    def _score(self, batch, timing: dict) -> None:
        """The no-grad scoring pass (engine/training/scoring.py) over `batch`, the algorithm watching.
        The engine is released first (vLLM sleeps): its KV cache would otherwise hold its share of
        the GPU while the pass's forwards run."""
        self.engine.release()
        t0 = time.perf_counter()
        cfg, algo, model = self.cfg, self.algorithm, self.unwrapped
        model.eval()
        # only an algorithm that reads the pass watches it (its views: consecutive rows at the batch's width)
        observe = (lambda view: algo.observe_forward(batch, view)) if self.forward_needs.view else None
        with self.acc.autocast():  # the precision of the update's forward, so that an unchanged policy has ratio 1
            score_rollouts(model, batch, cfg.train.micro_batch_size, with_reference=algo.uses_reference,
                           temperature=scoring_temperature(cfg.rollout.temperature),
                           chunk_tokens=cfg.train.logprob_chunk_tokens,
                           wants_hidden_states=self.forward_needs.hidden_states,
                           observe=observe,
                           disable_adapter=self.reference,
                           tokenizer=self.tokenizer, share_prompts=self.share_prompts,
                           micro_batch_tokens=cfg.train.micro_batch_tokens,
                           most_over_processes=self.collectives.max,  # every process runs as many forwards
                           packing=self.update_settings.packing)
        timing["time_score_s"] += time.perf_counter() - t0

    def _warn_if_short(self, info: dict) -> None:
        quota = self.cfg.rollout.prompts_per_step // self.world
        groups = info["groups_trained"]
        if groups < quota and not self._warned_short_batch:
            self._warned_short_batch = True
            hint = self.algorithm.short_batch_hint()
            self._say(f"[yellow]warning:[/] only {groups} of {quota} groups per process had a reward spread after "
                      f"{info['generation_rounds']} sampling rounds; training on what was kept"
                      + (f" ({plain(hint)})" if hint else ""))

    # ------------------------------------------------------------ update, eval

    def update(self, batch) -> dict:
        return update_policy(self.policy, self.algorithm, batch, self.update_settings, self.acc, self.engine)

    def quick_eval(self) -> dict:
        """Held-out accuracy, the same numbers on every process (engine/rollout/quick_eval.py)."""
        self.unwrapped.eval()
        return held_out_accuracy(self.engine, self.tokenizer, self.task, self.cfg, self.rank, self.world,
                                 self._gathered_for_engine(), self.collectives.sum)

    # ------------------------------------------------------------ interrupts, messages

    def _request_stop(self, signum, frame):
        if self._stop_requested:
            raise KeyboardInterrupt  # second Ctrl-C: stop now, without a checkpoint
        self._stop_requested = True
        self._say("[yellow]interrupt:[/] finishing this step, then writing a checkpoint "
                  "(Ctrl-C again to abort at once)")

    def _say(self, text: str):
        say(self.acc, text)

    # ------------------------------------------------------------ checkpoints (run_folders/checkpoints.py)

    def _training_state(self) -> checkpoints.TrainingState:
        return checkpoints.TrainingState(self.policy, self.unwrapped, self.algorithm, self.step,
                                         self.source.prompts.position, self.source.in_flight_writer())

    def save_checkpoint(self) -> Path:
        cfg = self.cfg
        run = checkpoints.RunIdentity(self.acc, self.run_dir, cfg.train.keep_checkpoints, cfg.model.name, cfg.algo.name)
        return checkpoints.save_checkpoint(run, self._training_state())

    def load_checkpoint(self, path: Path) -> None:
        state = self._training_state()
        checkpoints.load_checkpoint(self.acc, state, path, self.cfg.optim)
        self.step, self.source.prompts.position = state.step, state.sampler_position
        self.source.resume(path, self.step, self.unwrapped)  # the loaded weights, and the jobs in flight then
        if self.acc.is_main_process:  # last: a checkpoint refused above leaves the metrics as they were
            self.metrics.truncate_after(self.step)
