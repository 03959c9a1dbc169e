"""The rollout source: where a training step gets its rollouts, whatever the engine.

It owns what off-policy sampling needs, in one place:

  the prompt order   the PromptSampler (benchmarks/tasks.py) whose position a checkpoint keeps
  the seeds          one generator per (step, process), read by `round_seeds` only: the step's own
                     rounds and the rounds planned for it ahead draw the same seeds by construction
  what is ahead      with an engine apart and `rollout.max_staleness: k` >= 1, the first round of
                     each of the next k steps, submitted before this step updates (pipeline.py)
  re-planning        a step that drew extra rounds (DAPO's dynamic sampling) moved the prompts:
                     what was planned for the later steps is dropped and planned again
  the metrics        staleness (how many versions behind the trained weights a rollout was
                     sampled), waiting and overlap (pipeline.py), and `rollout/prefetch_miss`:
                     planned rounds the step did not use (0 in a sound run; a warning the first
                     time it is not, since each miss is a round sampled twice)
  a checkpoint       the jobs in flight (in_flight.py), submitted again on resume

A colocated engine (hf, vllm) is a source with nothing ahead: the same calls, which then only
sample when asked. The trainer's calls, in this order every step:

  begin_step(step)                 the step's seeds; the planned rounds of the next k steps submitted
  sample(indices)                  one round of rollouts (collect asks as often as it needs)
  rounds_done(rounds)              after the collect: re-planning where extra rounds moved the prompts
  policy_settled(step)             the step's update is over: the weights are version `step`
  step_metrics(sampled)            the step's rollout metrics, a fresh record for the next
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from benchmarks.tasks import PromptSampler
from meds_cli.core.markup import plain
from meds_cli.engine.rollout.batch import draw_seeds, sample_requests, sample_rollouts
from meds_cli.engine.rollout.in_flight import read_in_flight, save_in_flight, trained_shapes
from meds_cli.engine.rollout.pipeline import RolloutPipeline, staleness
from meds_cli.engine.rollout.sampling_engine import SamplingSettings
from meds_cli.engine.rollout.tool_turns import turn_settings


@dataclass(frozen=True)
class SourcePlan:
    """What the source needs to know of the run: `seed_of_step(step)` the seed of a step's draws
    on this process (engine/training/seeding.step_seed), the sampling settings (rollout section),
    the prompts per step (over all processes), the samples per prompt, the last step, this
    process's share."""

    seed_of_step: Callable[[int], int]
    settings: SamplingSettings
    prompts_per_step: int
    group_size: int
    steps: int
    rank: int = 0
    world: int = 1
    # True on every process when True on one (Collectives.any; None: one process): with tools the
    # processes make the same engine calls, whatever turns their responses take (tools/turn_loop.py)
    any_process: Callable[[bool], bool] | None = None


class RolloutSource:
    """A step's rollouts from `engine` (see the module docstring). `prompts`: the run's
    PromptSampler; `task`, `tokenizer`: the problems and how they become prompts; `say`: a line
    for the user (the prefetch-miss warning)."""

    def __init__(self, engine, prompts, task, tokenizer, plan: SourcePlan, *, say: Callable[[str], None] = print):
        self.engine, self.prompts, self.task, self.tokenizer, self.plan = engine, prompts, task, tokenizer, plan
        self.say = say
        self.step = 0  # the step being sampled
        self._seeds: torch.Generator | None = None
        self._window = (0.0, 0.0)
        self._misses = 0
        self._warned_miss = False

    @property
    def pipeline(self) -> RolloutPipeline | None:
        return self.engine if isinstance(self.engine, RolloutPipeline) else None

    @property
    def ahead(self) -> int:
        """How many steps ahead the source samples (0: a colocated engine, or k = 0)."""
        pipeline = self.pipeline
        return pipeline.max_staleness if pipeline is not None else 0

    # ------------------------------------------------------------ seeds and prompts

    def step_generator(self, step: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.plan.seed_of_step(step))

    def round_seeds(self, generator: torch.Generator, prompts: int) -> list[list[int]]:
        """The seeds of one round of `prompts` prompts, the next draw of the step's `generator`."""
        return draw_seeds(prompts, self.plan.group_size, generator)

    def problems_and_prompts(self, indices: list[int]) -> tuple[list, list[str]]:
        problems = [self.task.train[i] for i in indices]
        return problems, [self.task.prompt(p, self.tokenizer) for p in problems]

    def planned_requests(self, step: int, first: int):
        """The requests of step `step`'s first round as that step will draw them, `first` being the
        step the prompt sampler stands at: the prompts it gives after one round per step before
        `step`, and the first seeds of `step`'s generator."""
        plan = self.plan
        order = PromptSampler(self.prompts.size, self.prompts.seed,
                                   self.prompts.position + (step - first) * plan.prompts_per_step)
        _, prompts = self.problems_and_prompts(order.take(plan.prompts_per_step)[plan.rank::plan.world])
        return sample_requests(self.tokenizer, prompts, self.round_seeds(self.step_generator(step), len(prompts)))

    # ------------------------------------------------------------ the trainer's calls

    def begin_step(self, step: int) -> None:
        """Step `step` begins: its seeds, and (k >= 1) the first round of each of the steps up to
        `step + k` not yet submitted, from the weights of now."""
        self.step, self._seeds = step, self.step_generator(step)
        self._window = (time.monotonic(), 0.0)  # the pipeline's clock, for the overlap with the engine apart
        self._plan_ahead(step, step, self.ahead + 1)

    def sample(self, indices: list[int], *, vocab_size: int | None = None):
        """One round: this process's `indices` sampled group_size times each, as (Rollouts,
        problems, prompts)."""
        problems, prompts = self.problems_and_prompts(indices)
        seeds = self.round_seeds(self._seeds, len(prompts))
        batch = sample_rollouts(self.engine, self.tokenizer, prompts, problems, self.plan.group_size,
                                self.plan.settings, vocab_size=vocab_size, seeds=seeds,
                                any_process=self.plan.any_process)
        return batch, problems, prompts

    def rounds_done(self, rounds: int) -> None:
        """The step's collect is over after `rounds` rounds: what was planned for it and not used is
        a miss; extra rounds moved the prompts, so what was planned for later steps is planned again."""
        pipeline = self.pipeline
        if pipeline is None:
            return
        self._misses += pipeline.forget_through(self.step)
        if self.ahead and rounds > 1:
            pipeline.forget_through(self.plan.steps)  # planned from prompts the extra rounds took: not misses
            self._plan_ahead(self.step + 1, self.step + 1, self.ahead)

    def policy_settled(self, step: int) -> None:
        """Step `step`'s update is over: the trainer's weights are version `step`."""
        self.engine.policy_settled(step)  # an engine apart is sent them with its next job

    def step_metrics(self, sampled) -> dict[str, float]:
        """Staleness of the step's rollouts, waiting and overlap, prefetch misses."""
        row = staleness_metrics(sampled, self.step - 1)
        pipeline = self.pipeline
        if pipeline is None:
            return row
        row.update(pipeline.step_metrics((self._window[0], time.monotonic())))
        if self.ahead:
            row["rollout/prefetch_miss"] = float(self._misses)
            if self._misses and not self._warned_miss:
                self._warned_miss = True
                self.say(f"[yellow]warning:[/] step {self.step} did not use {plain(self._misses)} planned "
                         "sampling round(s) and sampled them again: the plan of the rounds ahead no longer matches "
                         "what a step draws (rollout/prefetch_miss in metrics.jsonl counts them)")
        self._misses = 0
        return row

    def close(self) -> None:
        """Stop an engine that runs apart (its worker or server); nothing for one in this process."""
        self.engine.close()

    # ------------------------------------------------------------ checkpoints

    def in_flight_writer(self) -> Callable[[Path, int], None] | None:
        """What a checkpoint writes of the sampling in flight (in_flight.py), None where nothing is ahead."""
        if not self.ahead:
            return None
        pipeline = self.pipeline
        return lambda folder, rank: save_in_flight(folder, rank, *pipeline.in_flight())

    def resume(self, checkpoint: Path, step: int, model) -> None:
        """After loading checkpoint `checkpoint` (at `step`, the prompt sampler at its position):
        the engine takes the loaded weights as version `step`, and the jobs in flight then are
        submitted again, each from its own version's weights."""
        self.engine.policy_updated()  # an engine with its own copy of the policy takes the loaded weights
        self.policy_settled(step)
        if not self.ahead:
            return
        in_flight = read_in_flight(checkpoint, self.plan.rank, step=step, trained=trained_shapes(model),
                                   vocab_size=model.get_input_embeddings().num_embeddings,
                                   planned=lambda at: self.planned_requests(at, step + 1))
        self.pipeline.resubmit(*(in_flight or ([], None)), turn_settings(self.plan.settings))

    # ------------------------------------------------------------ internals

    def _plan_ahead(self, first: int, sampler_at: int, count: int) -> None:
        pipeline = self.pipeline
        if pipeline is None or not pipeline.max_staleness:
            return
        submitted = pipeline.prefetched_steps()
        for planned in range(first, min(first + count, self.plan.steps + 1)):
            if planned not in submitted:
                # what the step's first engine call asks (with tools: its first turn, tool_turns.py)
                pipeline.prefetch(self.planned_requests(planned, sampler_at), turn_settings(self.plan.settings),
                                  planned)


def staleness_metrics(sampled, version: int) -> dict[str, float]:
    """How many steps behind `version` (the weights this step trains) the step's rollouts were sampled."""
    if sampled.sampler_version is None or sampled.size == 0:
        return {}
    behind = staleness(sampled.sampler_version.tolist(), version)
    return {"rollout/staleness_mean": sum(behind) / len(behind), "rollout/staleness_max": float(max(behind))}
