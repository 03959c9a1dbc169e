"""A step's groups: the rewards of a sampled part (the task's grades, the algorithm's channels, the
user's functions) and the dynamic-sampling rounds that keep sampling until every process has its
quota of groups the algorithm keeps (DAPO drops groups without a reward spread) or the
algorithm's round limit is reached.

The rounds are a collective protocol: every process enters every round and the same calls on the
collectives, whatever its own count, so the engine's call (vLLM's tensor-parallel pooling) and an
FSDP2 gather line up; and every process then trains on the same number of groups."""

from __future__ import annotations

from typing import Callable

import torch

from meds_cli.core.rollouts import Rollouts
from meds_cli.engine.training.collectives import Collectives
from meds_cli.engine.training.user_rewards import add_channels, user_reward_channels


def reward_rollouts(batch: Rollouts, problems: list, prompts: list[str], group_size: int, task, algorithm,
                    reward_functions: list) -> None:
    """Fill `batch`'s verdicts, reward channels and rewards (their sum). The task and the user's
    functions read the responses without their observations (Rollouts.answer_texts): an answer the
    tool printed is not the model's, and a tool's error message is no answer at all."""
    per_response = [p for p in problems for _ in range(group_size)]
    texts = batch.answer_texts
    batch.verdicts = task.grade(list(zip(per_response, texts)))
    own = user_reward_channels(reward_functions, [q for q in prompts for _ in range(group_size)],
                               texts, per_response)
    batch.reward_components = add_channels(algorithm.reward_components(batch), own)
    batch.rewards = sum(batch.reward_components.values())


def collect_groups(sampler, algorithm, sample: Callable[[list[int]], Rollouts], collectives: Collectives, *,
                   prompts_per_step: int, rank: int, sample_when_full: bool,
                   pad_token_id: int) -> tuple[Rollouts | None, Rollouts, dict]:
    """Sample rounds (`sample(indices)`: this process's share of a round's prompts, rewarded)
    until every process has `prompts_per_step / processes` kept groups. Returns the kept groups
    cut to the count every process has (None when that is 0), everything sampled, and the counts.
    `sample_when_full`: a process whose quota is full still samples its share (under
    FSDP2 the scoring pass gathers parameters collectively, forward by forward)."""
    world = collectives.world
    quota = prompts_per_step // world
    sampled, kept_parts, kept, rounds = [], [], 0, 0
    while rounds < max(1, algorithm.generation_rounds()):
        indices = sampler.take(prompts_per_step)[rank::world]
        rounds += 1
        # A process whose quota is full still enters the engine's call, with nothing to ask.
        if kept >= quota and not sample_when_full:
            indices = []
        part = sample(indices)
        if part.size:
            sampled.append(part)
            part = part.select_groups(algorithm.keep_groups(part))
            kept_parts.append(part)
            kept += part.num_groups
        if not collectives.any(kept < quota):
            break
    all_sampled = Rollouts.concat(sampled, pad_token_id)
    groups = collectives.min(min(kept, quota))
    info = {"groups_sampled": all_sampled.num_groups, "groups_kept": kept, "generation_rounds": rounds,
            "groups_dropped": all_sampled.num_groups - kept, "groups_trained": groups}
    if groups == 0:
        return None, all_sampled, info
    batch = Rollouts.concat([p for p in kept_parts if p.size], pad_token_id)
    return batch.select_groups(torch.arange(batch.num_groups) < groups), all_sampled, info
