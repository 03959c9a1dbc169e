"""Outcome-based exploration (Song, Kempe and Munos 2025, "Outcome-based Exploration for LLM
Reasoning", arXiv 2509.06941). No public code is known; the paper's own equations could not be
read where this was written, so the forms below follow its abstract and method summary (an
exploration bonus that depends only on the final answer: a UCB-style bonus for answers rarely
seen for a prompt over training, "historical exploration", and a penalty for answers repeated
within the batch, "batch exploration") with the standard count-based UCB bonus; docs/algorithms.md
says which choices are ours.

For prompt x and a response with final answer a (canonical key, benchmarks.answer_extraction):
    N(x, a)  = responses to x with answer a in every training step so far, this one included
    bonus    = ucb_coef * min(1, 1 / sqrt(N(x, a)))                  (historical)
    penalty  = batch_coef * #{j != i in the group: a_j = a} / (G - 1)  (batch)
    r_i     <- r_i + bonus - penalty
A response without an answer gets neither. MEDS's closest control: MEDS clusters layer-wise
features of wrong answers, this counts the answers themselves. With several processes each
keeps the counts of the prompts it sampled.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch

from algorithms.base import OnBase, register
from benchmarks.answer_extraction import answer_key
from meds_cli.core.fields import at_least, doc


@dataclass
class OutcomeUCBConfig:
    ucb_coef: float = doc(0.1, "historical exploration: weight of min(1, 1/sqrt(N(prompt, answer)))", at_least(0))
    batch_coef: float = doc(0.1, "batch exploration: weight of the share of the group's other responses with the "
                                 "same answer", at_least(0))


def ucb_bonus(count: int, coef: float) -> float:
    """coef * min(1, 1 / sqrt(count)) for an answer seen `count` >= 1 times."""
    return coef * min(1.0, 1.0 / math.sqrt(count))


def repetition_penalties(answers: list[str | None], coef: float) -> list[float]:
    """coef * (other responses of the group with the same answer) / (G - 1), 0 without an answer."""
    n = len(answers)
    if n < 2:
        return [0.0] * n
    counts = Counter(a for a in answers if a is not None)
    return [0.0 if a is None else coef * (counts[a] - 1) / (n - 1) for a in answers]


@register("outcome-ucb", "outcome-based exploration: UCB bonus for answers rarely seen for a prompt, penalty for "
                         "answers repeated in a group; on GRPO or DAPO (--base)")
class OutcomeUCB(OnBase):
    config_class = OutcomeUCBConfig
    bases = ("grpo", "dapo")
    shapes_rewards = True

    def __init__(self, config, context, base):
        super().__init__(config, context, base)
        self.counts: dict[str, Counter] = {}  # prompt id -> answer key -> times seen

    def shape_rewards(self, rollouts):
        self.base.shape_rewards(rollouts)
        cfg = self.config
        bonus = torch.zeros(rollouts.size)
        penalty = torch.zeros(rollouts.size)
        distinct = []
        for problem, rows in zip(rollouts.problems, rollouts.groups()):
            answers = [answer_key(rollouts.verdicts[i].extracted) for i in range(rows.start, rows.stop)]
            seen = self.counts.setdefault(problem.id, Counter())
            seen.update(a for a in answers if a is not None)
            bonus[rows] = torch.tensor([0.0 if a is None else ucb_bonus(seen[a], cfg.ucb_coef) for a in answers])
            penalty[rows] = torch.tensor(repetition_penalties(answers, cfg.batch_coef))
            distinct.append(len({a for a in answers if a is not None}))
        rollouts.rewards = rollouts.rewards.float() + bonus - penalty
        self._metrics = {"outcome-ucb/bonus_mean": bonus.mean().item(),
                         "outcome-ucb/penalty_mean": penalty.mean().item(),
                         "outcome-ucb/reweighted": float(((bonus - penalty) != 0).sum()),
                         "outcome-ucb/distinct_answers_mean": sum(distinct) / max(len(distinct), 1)}

    def state_dict(self):
        return {**super().state_dict(), "counts": {k: dict(v) for k, v in self.counts.items()}}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.counts = {k: Counter(v) for k, v in state.get("counts", {}).items()}
