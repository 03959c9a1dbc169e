"""W-REINFORCE (Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM
Reasoning"; code TianHongZXY/RLVR-Decomposed, compute_psr_nsr_outcome_advantage).

The objective splits into positive-sample reinforcement (PSR, correct responses) and
negative-sample reinforcement (NSR, wrong ones); W-REINFORCE weighs PSR by lambda:
    A_i = lambda * (r_i - r_wrong)     for a correct response
    A_i = r_i - r_correct              for a wrong one
with r_correct / r_wrong the reward values of the run (reward.correct / reward.wrong). With the
reference's rewards 1 / 0 this is its 'weighted' mode: lambda for a correct response, -1 for a
wrong one; lambda 0 is NSR alone (its 'negative' mode). No group baseline and no normalisation:
the advantages replace the base's (its estimator has no say; a non-default one is refused when
the config loads), while the base's loss, clipping and sampling rules stay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms.base import OnBase, correct_mask, mean_where, register
from meds_cli.core.fields import Check, doc


@dataclass
class WReinforceConfig:
    positive_weight: float = doc(0.1, "lambda, the weight of correct responses (the paper's 0.1; 0 = NSR alone)",
                                 Check(lambda v: 0 <= v <= 1, "in [0, 1] (the paper's lambda)"))


def w_reinforce_advantages(rewards: torch.Tensor, correct: torch.Tensor, positive_weight: float,
                           reward_correct: float, reward_wrong: float) -> torch.Tensor:
    """[B] advantages: positive_weight * (r - reward_wrong) where correct, r - reward_correct elsewhere."""
    rewards = rewards.float()
    return torch.where(correct, positive_weight * (rewards - reward_wrong), rewards - reward_correct)


@register("w-reinforce", "W-REINFORCE: correct responses weighted by lambda (w-reinforce.positive_weight), wrong "
                         "ones by 1; 0 = NSR; on GRPO or DAPO (--base)")
class WReinforce(OnBase):
    config_class = WReinforceConfig
    bases = ("grpo", "dapo")
    replaces_advantages = True

    def compute_advantages(self, rollouts):
        correct = correct_mask(rollouts)
        ctx = self.context
        advantages = w_reinforce_advantages(rollouts.rewards, correct, self.config.positive_weight,
                                            ctx.reward_correct, ctx.reward_wrong)
        self._metrics = {
            "w-reinforce/reweighted": float(correct.sum()),  # correct responses scaled by lambda
            "w-reinforce/positive_mean": mean_where(advantages, correct),
            "w-reinforce/penalty_mean": mean_where(advantages, ~correct),
        }
        return advantages
