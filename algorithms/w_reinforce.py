"""PSR, NSR and W-REINFORCE (Zhu et al. 2025, "The Surprising Effectiveness of Negative
Reinforcement in LLM Reasoning"; code TianHongZXY/RLVR-Decomposed, compute_psr_nsr_outcome_advantage
and its trainer).

The objective splits into positive-sample reinforcement (PSR, correct responses) and
negative-sample reinforcement (NSR, wrong ones); `w-reinforce.mode` picks:
    weighted  A_i = lambda * (r_i - r_wrong) correct,  r_i - r_correct wrong   (W-REINFORCE)
    psr       A_i = r_i - r_wrong            correct,  wrong rows left out of the loss
    nsr       A_i = r_i - r_correct          wrong,    correct rows left out of the loss
with r_correct / r_wrong the reward values of the run (reward.correct / reward.wrong). With the
reference's rewards 1 / 0 these are its 'weighted' (lambda for a correct response, -1 for a wrong
one), 'positive' and 'negative' modes. The reference's trainer drops the rows a PSR or NSR run
does not train on from the batch (batch.subset); here they leave the loss mask, which gives the
same token-mean denominators (docs/algorithms.md: where the seq-mean aggregations differ). No group
baseline and no normalisation: the advantages replace the base's (its estimator has no say; a
non-default one is refused when the config loads), while the base's loss, clipping and sampling
rules stay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms.base import OnBase, correct_mask, mean_where, register
from meds_cli.core.fields import Check, choice, doc

MODES = ["weighted", "psr", "nsr"]


@dataclass
class WReinforceConfig:
    mode: str = choice("weighted", MODES, "weighted = W-REINFORCE (lambda on correct responses), psr = correct "
                                          "responses only, nsr = wrong responses only (the reference's three modes)")
    positive_weight: float = doc(0.1, "lambda of mode weighted, the weight of correct responses (the paper's 0.1; "
                                      "0 = NSR's advantages with the correct rows kept in the loss)",
                                 Check(lambda v: 0 <= v <= 1, "in [0, 1] (the paper's lambda)"))


def w_reinforce_advantages(rewards: torch.Tensor, correct: torch.Tensor, positive_weight: float,
                           reward_correct: float, reward_wrong: float) -> torch.Tensor:
    """[B] advantages: positive_weight * (r - reward_wrong) where correct, r - reward_correct elsewhere."""
    rewards = rewards.float()
    return torch.where(correct, positive_weight * (rewards - reward_wrong), rewards - reward_correct)


def psr_nsr_advantages(rewards: torch.Tensor, correct: torch.Tensor, mode: str, positive_weight: float,
                       reward_correct: float, reward_wrong: float) -> torch.Tensor:
    """[B] advantages of `mode`: weighted as w_reinforce_advantages; psr keeps the correct rows'
    part at weight 1 and gives wrong rows 0; nsr keeps the wrong rows' part and gives correct rows 0."""
    if mode == "weighted":
        return w_reinforce_advantages(rewards, correct, positive_weight, reward_correct, reward_wrong)
    both = w_reinforce_advantages(rewards, correct, 1.0, reward_correct, reward_wrong)
    trained = trained_rows(correct, mode)
    return torch.where(trained, both, torch.zeros_like(both))


def trained_rows(correct: torch.Tensor, mode: str) -> torch.Tensor:
    """[B] bool: the rows the mode trains on (psr: correct, nsr: wrong, weighted: all)."""
    if mode == "psr":
        return correct
    if mode == "nsr":
        return ~correct
    return torch.ones_like(correct)


@register("w-reinforce", "PSR / NSR / W-REINFORCE (w-reinforce.mode): correct responses weighted by lambda "
                         "(w-reinforce.positive_weight), wrong ones by 1; on GRPO or DAPO (--base)")
class WReinforce(OnBase):
    config_class = WReinforceConfig
    bases = ("grpo", "dapo")
    replaces_advantages = True

    @classmethod
    def key_settings(cls, own):  # lambda only where it acts
        return {"mode": own.mode, **({"positive_weight": own.positive_weight} if own.mode == "weighted" else {})}

    def compute_advantages(self, rollouts):
        correct = correct_mask(rollouts)
        ctx, cfg = self.context, self.config
        advantages = psr_nsr_advantages(rollouts.rewards, correct, cfg.mode, cfg.positive_weight,
                                        ctx.reward_correct, ctx.reward_wrong)
        self._metrics = {
            "w-reinforce/reweighted": float(correct.sum()),  # correct responses (scaled by lambda when weighted)
            "w-reinforce/positive_mean": mean_where(advantages, correct),
            "w-reinforce/penalty_mean": mean_where(advantages, ~correct),
            "w-reinforce/trained_rows": float(trained_rows(correct, cfg.mode).sum()),
        }
        return advantages

    def loss_mask(self, rollouts):
        """The base's mask, without the rows PSR or NSR leaves out (the reference drops them from the batch)."""
        mask = self.base.loss_mask(rollouts)
        if self.config.mode == "weighted":
            return mask
        keep = trained_rows(correct_mask(rollouts), self.config.mode)
        return mask * keep.to(mask.dtype).unsqueeze(-1)
