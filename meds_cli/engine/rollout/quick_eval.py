"""The quick eval during training (`eval.every`): accuracy on the task's held-out problems,
each process sampling its share, the counts summed over processes so that every process returns
the same numbers. One response per problem, greedy unless `eval.temperature` says otherwise; graded on the text the
model wrote (observations of tool calls left out, docs/tools.md), as in training."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Callable

import torch

from meds_cli.engine.rollout.batch import sample_rollouts, sampling_settings


@torch.no_grad()
def held_out_accuracy(engine, tokenizer, task, cfg, rank: int, world: int, gathered: AbstractContextManager,
                      global_sum: Callable[[float], float]) -> dict:
    """`gathered`: the context the engine samples in (the policy gathered under FSDP2);
    `global_sum`: a value summed over processes. Empty when the task holds no held-out problems."""
    t0 = time.perf_counter()
    problems = task.held_out[: cfg.eval.problems][rank::world]
    correct = 0
    prompts = [task.prompt(p, tokenizer) for p in problems]
    settings = sampling_settings(cfg.rollout, tokenizer, temperature=cfg.eval.temperature, top_p=1.0)
    # Every process, even one without problems (an empty list): the gather is collective under
    # FSDP2, and so may the engine's call be (vLLM's tensor-parallel pooling).
    with gathered:
        batch = sample_rollouts(engine, tokenizer, prompts, problems, 1, settings,
                                any_process=lambda flag: global_sum(float(flag)) > 0)
    if problems:  # the model's text without tool output: a \boxed{} a tool printed is not its answer
        correct = sum(v.correct for v in task.grade(list(zip(problems, batch.answer_texts))))
    total = global_sum(len(problems))
    if total == 0:
        return {}
    return {"eval/accuracy": global_sum(correct) / total, "eval/problems": int(total),
            "time_eval_s": time.perf_counter() - t0}
