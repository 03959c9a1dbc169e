"""Unlikeliness reward (He, Fried and Welleck 2025, "Rewarding the Unlikely: Lifting GRPO Beyond
Distribution Sharpening"; code AndreHe02/rewarding-unlikely-release,
RayLeanTrainer._compute_advantages, `lean.rank_penalty`).

GRPO sharpens the distribution: it raises correct responses the policy already finds likely.
Here a correct response the policy found unlikely keeps more of its reward. In each group of G,
responses are ranked by their mean token log-probability under the sampling policy (ascending:
rank 0 is the least likely; ties in order of appearance, as torch.argsort), and
    r_i <- r_i * (1 - rank_penalty * rank_i / G)      for a correct response i;
wrong responses keep their reward (the reference multiplies every reward, and a wrong one is 0
there; with a non-zero reward.wrong or DAPO's overlong penalty, shrinking a wrong response's
negative reward would favour the likely wrong ones). The base's advantages follow (GRPO's group
normalisation in the reference). The log-probabilities come from the scoring pass, which
forward_needs asks for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms.base import OnBase, correct_mask, mean_where, register
from meds_cli.core.fields import Check, doc
from meds_cli.core.forward import ForwardNeeds


@dataclass
class UnlikelinessConfig:
    rank_penalty: float = doc(0.25, "beta_rank: the likeliest correct response keeps 1 - rank_penalty * (G-1)/G of "
                                    "its reward (reference script 0.25)",
                              Check(lambda v: 0 <= v <= 1, "in [0, 1] (above 1 a reward changes sign)"))


def sequence_logprob(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] mean log-probability of each response's tokens."""
    return (logp * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def likelihood_ranks(seq_logp: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B] rank of each response's log-prob within its group, 0 = least likely, divided by G."""
    grouped = seq_logp.view(-1, group_size)
    return (torch.argsort(torch.argsort(grouped, dim=1), dim=1).float() / group_size).view(-1)


def unlikeliness_rewards(rewards: torch.Tensor, correct: torch.Tensor, seq_logp: torch.Tensor, group_size: int,
                         rank_penalty: float) -> torch.Tensor:
    """[B] rewards with each correct response's scaled by 1 - rank_penalty * rank / G."""
    factor = 1 - rank_penalty * likelihood_ranks(seq_logp, group_size)
    return torch.where(correct, rewards.float() * factor, rewards.float())


@register("unlikeliness", "unlikeliness reward: correct responses the policy found likely keep less reward "
                          "(rank penalty); on GRPO or DAPO (--base)")
class Unlikeliness(OnBase):
    config_class = UnlikelinessConfig
    bases = ("grpo", "dapo")
    shapes_rewards = True

    def forward_needs(self, num_layers, records_lens):
        # the scoring pass's old log-probs, read in shape_rewards
        return super().forward_needs(num_layers, records_lens).merged(ForwardNeeds(view="shaping"))

    def shape_rewards(self, rollouts):
        self.base.shape_rewards(rollouts)
        if rollouts.old_logp is None:
            raise RuntimeError("unlikeliness needs the scoring pass's log-probs before shape_rewards")
        correct = correct_mask(rollouts)
        before = rollouts.rewards.float()
        rollouts.rewards = unlikeliness_rewards(before, correct, sequence_logprob(rollouts.old_logp,
                                                                                  rollouts.response_mask),
                                                rollouts.group_size, self.config.rank_penalty)
        lowered = before - rollouts.rewards
        self._metrics = {"unlikeliness/reweighted": float((lowered != 0).sum()),
                         "unlikeliness/penalty_mean": mean_where(lowered, correct)}
