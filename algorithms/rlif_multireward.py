"""Multi-reward RLIF ("Two is better than one: a collapse-free multi-reward RLIF framework";
seed 002, docs/algorithms.md "RLIF multi-reward"): GRPO-style training on two label-free rewards.

- Answer channel, cluster voting: final answers of a group are grouped by equality
  (`algorithms.answer_groups`); R_cluster(i) = |cluster of i| / G, 0 when i has no answer.
  Answers are read from the response texts here, never from the grader's verdicts.
- Completion channel, self-certainty: mean over response tokens of logsumexp(z) - mean(z) with
  z = logits / T (= KL(uniform || softmax(z)) + log V), from the no-grad sampling forward pass
  (observe_forward). T = `certainty_temperature`, by default the sampling temperature: the
  certainty of the distribution the responses were drawn from and the loss's log-probs use.
- GDPO: each channel z-scored within its group on its own, then A = w_c Z_cluster + w_s Z_cert,
  so neither channel wins by scale alone; optional re-normalization over the batch. The user's
  own reward functions (reward.functions) are further channels, z-scored the same way with
  their weights; whether they read the gold answer is the user's choice.
- KL-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs"; verl's kl_cov loss):
  the top `kl_cov_ratio` share of valid tokens by cov_t = (A_t - mean A)(logp_t - mean logp)
  get -A*ratio + kl_cov_coef * |logp - old_logp| instead of the clipped surrogate. The seed
  reports 2% (kl_cov_ratio 0.02); the default 0.0002 is the reference code's (verl recipe). As
  in verl, tokens are ranked within each micro-batch the loss is computed on. It is the policy
  loss 'kl-cov' of algorithms/policy_loss.py, this algorithm's default `policy_loss`.

Label-free: nothing here that shapes training reads Problem.answer or a Verdict; only
step_metrics does, for the diagnostic 'majority agrees with gold', and says so.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from algorithms.advantages import group_advantages
from algorithms.answer_groups import EQUIVALENCE_MODES, answer_classes, class_sizes
from algorithms.base import Algorithm, GRPOConfig, register
from algorithms.policy_loss import POLICY_LOSSES
from benchmarks.answer_extraction import extract_answer
from meds_cli.core.fields import at_least, choice, doc
from meds_cli.core.forward import ForwardNeeds

EXTRACTIONS = ["auto", "boxed", "boxed_then_last_number", "boxed_or_last_integer", "first_char"]


@dataclass
class RLIFConfig(GRPOConfig):
    adv_estimator: str = choice("grpo", ["grpo"], "GDPO computes the advantages (compute_advantages below)")
    scale_rewards: str = choice("group", ["group"], "GDPO z-scores each channel within its group")
    extraction: str = choice("auto", EXTRACTIONS, "how final answers are read from responses; auto: from the task")
    equivalence: str = choice("grader", EQUIVALENCE_MODES, "answer clusters: canonical key then grader, or key only")
    cluster_weight: float = doc(1.0, "GDPO weight of the cluster-voting channel", at_least(0))
    certainty_weight: float = doc(1.0, "GDPO weight of the self-certainty channel", at_least(0))
    certainty_temperature: float = doc(0.0, "T of the self-certainty channel, over softmax(logits / T); "
                                       "0: the sampling temperature (rollout.temperature)", at_least(0))
    batch_norm: bool = doc(False, "re-normalize the summed advantages over the batch (GDPO's optional last step)")
    policy_loss: str = choice("kl-cov", POLICY_LOSSES.names(),
                              "per-token policy loss (algorithms/policy_loss.py); KL-Cov as in the seed")


# ---------------------------------------------------------------- the formulas


def self_certainty(logits: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[b] mean over valid tokens of logsumexp(z_t) - mean(z_t), z_t = logits_t / temperature, from
    logits [b, R, V]: the self-certainty of softmax(logits / temperature)."""
    scaled = logits.float() / temperature
    per_token = torch.logsumexp(scaled, dim=-1) - scaled.mean(dim=-1)
    mask = mask.to(per_token.dtype)
    return (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def cluster_vote_rewards(labels: list[int | None], group_size: int) -> torch.Tensor:
    """|cluster of i| / G per response of one group; 0 for a response without an answer."""
    sizes = class_sizes(labels)
    return torch.tensor([sizes[label] / group_size if label is not None else 0.0 for label in labels])


def gdpo_advantages(channels: list[torch.Tensor], weights: list[float], group_size: int, eps: float = 1e-6,
                    batch_norm: bool = False) -> torch.Tensor:
    """sum_c w_c * z_c with z_c the channel's within-group z-score (unbiased std, + eps);
    with batch_norm the sum is then z-scored over the batch."""
    total = sum(w * group_advantages(c.float(), group_size, "group", eps) for c, w in zip(channels, weights))
    if batch_norm and total.numel() > 1:
        total = (total - total.mean()) / (total.std(unbiased=True) + eps)
    return total


# ---------------------------------------------------------------- reading answers


def read_answer(text: str, mode: str) -> str | None:
    """The final answer of a response under an extraction mode (no gold answer involved)."""
    if mode == "first_char":
        return text[:1] or None
    if mode == "boxed_or_last_integer":  # small models rarely box: the last number when nothing is boxed
        return extract_answer(text or "", "boxed_then_last_number")
    return extract_answer(text, mode)


# ---------------------------------------------------------------- the algorithm


@register("rlif-multireward", "label-free: cluster voting + self-certainty, GDPO normalization, KL-Cov loss")
class RLIFMultiReward(Algorithm):
    config_class = RLIFConfig

    def __init__(self, config, context):
        super().__init__(config, context)
        if config.extraction == "auto":  # the task's own reading, minus the gold answer
            self.extraction, self.read_answer = context.answer_mode, context.read_answer
        else:
            self.extraction = config.extraction
            self.read_answer = functools.partial(read_answer, mode=config.extraction)
        # 0 follows the sampler (the default); the training config requires rollout.temperature > 0
        self.certainty_temperature = config.certainty_temperature or context.sampling_temperature

    # -- rewards: from the responses and the sampling pass only
    def forward_needs(self, num_layers, records_lens):
        return ForwardNeeds(view="rewards")  # self-certainty is a reward channel

    def observe_forward(self, rollouts, view):
        values = rollouts.extras.setdefault("self_certainty", torch.zeros(rollouts.size))
        logits = view.response_logits()
        mask = rollouts.response_mask[view.rows].to(logits.device)
        values[view.rows] = self_certainty(logits, mask, self.certainty_temperature).cpu()

    def reward_components(self, rollouts):
        g = rollouts.group_size
        answers = [self.read_answer(t) for t in rollouts.answer_texts]  # observations are not the model's answer
        groups = [answers[rows] for rows in rollouts.groups()]
        labels = answer_classes(groups, self.config.equivalence)
        rollouts.extras["answer_class"] = [label for group in labels for label in group]
        cluster = torch.cat([cluster_vote_rewards(group, g) for group in labels]) if labels else torch.zeros(0)
        certainty = rollouts.extras.get("self_certainty")
        if certainty is None:
            raise RuntimeError("rlif-multireward: self-certainty needs the sampling forward pass (observe_forward)")
        return {"cluster": cluster.float(), "certainty": certainty.float().clone()}

    def compute_advantages(self, rollouts):
        cfg = self.config
        comps = rollouts.reward_components
        extra = self.context.extra_reward_channels
        # A user channel holds w * f; |w| * z(w * f) = w * z(f), the weighted z-score GDPO gives f.
        return gdpo_advantages([comps["cluster"], comps["certainty"]] + [comps[name] for name, _ in extra],
                               [cfg.cluster_weight, cfg.certainty_weight] + [abs(w) for _, w in extra],
                               rollouts.group_size, cfg.adv_eps, cfg.batch_norm)

    # -- diagnostics
    def step_metrics(self, rollouts):
        comps = rollouts.reward_components
        metrics = {}
        metrics["rlif/certainty_temperature"] = self.certainty_temperature
        for name in ("cluster", "certainty"):
            values = comps[name].float()
            metrics[f"rlif/{name}_mean"] = values.mean().item()
            metrics[f"rlif/{name}_std"] = values.std(unbiased=False).item() if values.numel() > 1 else 0.0
        metrics["rlif/majority_agrees_gold"] = self._majority_agreement(rollouts)
        return metrics

    @staticmethod
    def _majority_agreement(rollouts) -> float:
        """Share of groups whose largest answer cluster is correct.
        DIAGNOSTIC ONLY: this reads the gold-dependent verdicts and is logged, never trained on."""
        labels = rollouts.extras.get("answer_class")
        if not labels or not rollouts.verdicts:
            return 0.0
        agree = 0
        for rows in rollouts.groups():
            group = labels[rows]
            sizes = class_sizes(group)
            if not sizes:
                continue  # no answer at all: the majority cannot agree with gold
            top = max(sizes, key=lambda k: (sizes[k], -k))  # largest cluster, first seen on ties
            member = rows.start + group.index(top)
            agree += bool(rollouts.verdicts[member].correct)  # gold read here, for the log only
        return agree / max(rollouts.num_groups, 1)
