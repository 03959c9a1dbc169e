"""DAPO (Yu et al. 2025): GRPO plus clip-higher, token-level loss, dynamic sampling and
overlong reward shaping; no KL term.

Departures from GRPO, each a config key:
- clip_high 0.28 > clip_low 0.2 (clip-higher), optional dual clip for A < 0;
- loss_agg token-mean over every valid token of the batch;
- dynamic sampling: groups whose `filter_metric` is equal across the group are dropped and
  the trainer samples more prompts, at most `max_gen_batches` rounds (verl's filter_groups);
- overlong shaping: r += min(0, -(L - (L_max - L_buf)) / L_buf * factor); truncated responses
  can be left out of the loss (`mask_truncated`).
"""

from dataclasses import dataclass

import torch

from algorithms.advantages import zero_spread_groups
from algorithms.base import Algorithm, GRPOConfig, register
from meds_cli.core.fields import at_least, choice, doc
from meds_cli.core.records import CORRECTNESS


@dataclass
class DAPOConfig(GRPOConfig):
    clip_high: float = doc(0.28, "eps_high (clip-higher)")
    loss_agg: str = choice("token-mean", GRPOConfig.__dataclass_fields__["loss_agg"].metadata["choices"],
                           "loss aggregation")
    dynamic_sampling: bool = doc(True, "drop groups with equal rewards and sample more prompts")
    max_gen_batches: int = doc(3, "sampling rounds per step at most (dynamic sampling)", at_least(1))
    filter_metric: str = choice(CORRECTNESS, [CORRECTNESS, "reward"], "what must vary within a kept group")
    overlong_buffer: int = doc(0, "L_buf in tokens (0 disables overlong shaping)", at_least(0))
    overlong_factor: float = doc(1.0, "penalty at the length limit", at_least(0))
    mask_truncated: bool = doc(False, "leave responses without EOS out of the loss")


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int, factor: float) -> torch.Tensor:
    """min(0, -(L - (L_max - L_buf)) / L_buf * factor) for each response length L."""
    if buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float)
    expected = max_length - buffer
    return torch.clamp(-(lengths.float() - expected) / buffer * factor, max=0.0)


@register("dapo", "DAPO: clip-higher, token-mean loss, dynamic sampling, overlong shaping, no KL")
class DAPO(Algorithm):
    config_class = DAPOConfig

    @property
    def uses_reference(self) -> bool:
        return False  # DAPO has no KL term

    def reward_components(self, rollouts):
        components = super().reward_components(rollouts)
        cfg = self.config
        if cfg.overlong_buffer > 0:
            components["overlong"] = overlong_penalty(rollouts.response_lengths, self.context.max_new_tokens,
                                                      cfg.overlong_buffer, cfg.overlong_factor)
        return components

    def generation_rounds(self) -> int:
        return self.config.max_gen_batches if self.config.dynamic_sampling else 1

    def short_batch_hint(self) -> str:
        return "raise dapo.max_gen_batches to sample more" if self.config.dynamic_sampling else ""

    def keep_groups(self, rollouts):
        if not self.config.dynamic_sampling:
            return super().keep_groups(rollouts)
        metric = (rollouts.reward_components[CORRECTNESS] if self.config.filter_metric == CORRECTNESS
                  else rollouts.rewards)
        return ~zero_spread_groups(metric, rollouts.group_size)

    def loss_mask(self, rollouts):
        mask = rollouts.response_mask
        if self.config.mask_truncated:
            mask = mask * (~rollouts.truncated).float().unsqueeze(-1)
        return mask
