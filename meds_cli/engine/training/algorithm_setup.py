"""Building the run's algorithm: its config section, the base it composes with, and the small
context it may see (reward values, length limit, the task's answer reader, update count)."""

from __future__ import annotations

import math

from algorithms import AlgorithmContext, compose_algorithm
from algorithms.base import Algorithm, one_process
from benchmarks.tasks import Task, build_task
from meds_cli.engine.training.user_rewards import planned_channels


def optimizer_steps_per_batch(cfg) -> int:
    """PPO epochs times mini-batches per epoch: the optimizer steps one rollout batch makes."""
    batch = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    mini = cfg.train.mini_batch_size or batch
    return cfg.train.ppo_epochs * max(1, math.ceil(batch / mini))


def algorithm_context(cfg, task: Task, gather=one_process) -> AlgorithmContext:
    """`gather`: the all-gather over the run's processes (engine/training/collectives.py)."""
    return AlgorithmContext(reward_correct=cfg.reward.correct, reward_wrong=cfg.reward.wrong, gather=gather,
                            max_new_tokens=cfg.rollout.max_new_tokens, read_answer=task.read_answer,
                            answer_mode=task.answer_mode, optimizer_steps_per_batch=optimizer_steps_per_batch(cfg),
                            sampling_temperature=cfg.rollout.temperature,
                            extra_reward_channels=tuple(
                                (name, weight) for name, _, weight
                                in planned_channels(cfg.reward.functions, cfg.reward.function_weights)))


def build_algorithm(cfg, task: Task | None = None, gather=one_process) -> Algorithm:
    """The algorithm of run config `cfg` (cfg.algo.name over cfg.algo.base when it composes);
    `gather` the all-gather over the run's processes (default: a run of one)."""
    task = task if task is not None else build_task(cfg.task, cfg.train.seed)
    return compose_algorithm(cfg.algo.name, cfg.algo.base, cfg.algorithms, algorithm_context(cfg, task, gather))
