"""Per-step metrics every algorithm logs, computed from a finished Rollouts batch."""

from __future__ import annotations

import torch

from algorithms.advantages import zero_spread_groups
from algorithms.diversity import distinct_labels, masked_token_mean
from meds_cli.core.rollouts import Rollouts
from meds_cli.engine.training.diversity import group_answer_labels
from meds_cli.engine.training.importance import mismatch_metrics


def distinct_answers(rollouts: Rollouts, correct: bool | None = None) -> float:
    """Mean over groups of the distinct final answers (only the correct ones, or only the wrong
    ones, when `correct` says), answers compared by the maj@k key (0.5 and \\frac{1}{2} are one);
    no answer is not an answer (algorithms/diversity.py distinct_labels)."""
    counts = [distinct_labels(labels, [correct is None or v.correct == correct for v in rollouts.verdicts[rows]])
              for labels, rows in zip(group_answer_labels(rollouts), rollouts.groups())]
    return sum(counts) / max(len(counts), 1)


def rollout_metrics(rollouts: Rollouts) -> dict[str, float]:
    if rollouts.size == 0:
        return {}
    lengths = rollouts.response_lengths.float()
    metrics = {
        "reward": rollouts.rewards.mean().item(),
        "accuracy": sum(v.correct for v in rollouts.verdicts) / rollouts.size,
        "response_length_mean": lengths.mean().item(),
        "response_length_max": lengths.max().item(),
        "truncated_share": rollouts.truncated.float().mean().item(),
        "zero_spread_group_share": zero_spread_groups(rollouts.rewards, rollouts.group_size).float().mean().item(),
    }
    metrics.update(tool_metrics(rollouts.tool_stats))
    for name, values in rollouts.reward_components.items():
        metrics[f"reward/{name}"] = values.float().mean().item()
    metrics["distinct_answers_per_group"] = distinct_answers(rollouts)
    metrics["distinct_wrong_answers_per_group"] = distinct_answers(rollouts, correct=False)
    metrics["distinct_correct_answers_per_group"] = distinct_answers(rollouts, correct=True)
    return metrics


def tool_metrics(stats: list) -> dict[str, float]:
    """A step's use of tools, from each response's ToolStats (engine/rollout/tools; None for a
    response sampled without tools): calls per response (mean, max), the share of responses that
    ran a block, errors and time-outs per response, observation tokens per response (the response
    lengths above count the model's tokens only) and the seconds spent in the sandbox (the sum over
    responses: their blocks run in parallel, so it can exceed the step's wall clock). {} when no
    response was sampled with tools."""
    stats = [s for s in stats if s is not None]
    if not stats:
        return {}
    n = len(stats)
    calls = [s.calls for s in stats]
    return {"tools/calls_mean": sum(calls) / n, "tools/calls_max": float(max(calls)),
            "tools/used_share": sum(c > 0 for c in calls) / n,
            "tools/errors_mean": sum(s.errors for s in stats) / n,
            "tools/timeouts_mean": sum(s.timeouts for s in stats) / n,
            "tools/over_limit_mean": sum(s.over_limit for s in stats) / n,
            "tools/observation_tokens_mean": sum(s.observation_tokens for s in stats) / n,
            "tools/seconds": float(sum(s.tool_seconds for s in stats))}


def advantage_metrics(advantages: torch.Tensor) -> dict[str, float]:
    """How the advantages weigh the responses (sequence-level ones, [B]): the mean of the positive
    and of the negative ones and the share that are 0, so methods that reweight responses
    (an estimator such as passk, W-REINFORCE) can be compared with GRPO step by step."""
    if advantages is None or advantages.dim() != 1 or advantages.numel() == 0:
        return {}
    positive, negative = advantages[advantages > 0], advantages[advantages < 0]
    return {"advantage/positive_mean": positive.mean().item() if positive.numel() else 0.0,
            "advantage/negative_mean": negative.mean().item() if negative.numel() else 0.0,
            "advantage/zero_share": (advantages == 0).float().mean().item()}


def trained_metrics(batch: Rollouts) -> dict[str, float]:
    """Metrics of the responses that trained: the policy's mean entropy over their tokens (at the
    sampling temperature), from the scoring pass or the update's own forward; the advantages' summary."""
    metrics = advantage_metrics(batch.advantages)
    if batch.entropy is None:
        return metrics
    mask = batch.response_mask
    return {**metrics, "entropy": masked_token_mean(batch.entropy, mask)}


def update_metrics(batch: Rollouts, *, tis_cap: float, sampler_is_full_softmax: bool) -> dict[str, float]:
    """After the update: the sampler/trainer mismatch (where the engine returned its log-probs and
    sampled from the full softmax, so both sides are one distribution), then `trained_metrics`."""
    metrics = {}
    if batch.sampler_logp is not None and sampler_is_full_softmax:
        metrics.update(mismatch_metrics(batch.old_logp, batch.sampler_logp, batch.response_mask, tis_cap))
    return {**metrics, **trained_metrics(batch)}


def mean_of(stats: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Average a list of per-micro-batch stat dicts."""
    keys = {k for s in stats for k in s}
    return {k: float(sum(float(s[k]) for s in stats if k in s) / sum(1 for s in stats if k in s)) for k in sorted(keys)}
