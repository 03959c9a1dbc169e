"""Outcome-based exploration (Song, Kempe and Munos 2025, "Outcome-based Exploration for LLM
Reasoning", arXiv 2509.06941; no public code). An exploration term that depends only on a
response's final answer is added to the base algorithm's advantages after their group
normalisation (the paper's Eq. 1: (1/n) sum_i [A_i + c * b(x, a_i)], A_i the GRPO advantage):

    ucb       b_i = min(1, sqrt(1 / N(x, a_i)))                     historical exploration
    ucb-mean  b_i - mean of b_j over the group's other responses     (UCB-Mean; none answered: b_i)
    ucb-con   b_i - b0                                                (UCB-Con, b0 = outcome-ucb.baseline)
    batch     -(1/n) * #{j != i in the group: a_j = a_i}             batch exploration (replaces the UCB term)
    A_i  <-   A_i + c * term_i                                         c = outcome-ucb.coef (0.2)

N(x, a) counts the responses to question x with final answer a (canonical key,
benchmarks.answer_extraction) over training. `outcome-ucb.counts` says which: `earlier` (default)
the steps before this one, so that a never-seen answer has N = 0 and the min(1, .) cap gives it
the full bonus; `with-batch` this step's responses counted first, so N >= 1 and k copies of a new
answer get 1/sqrt(k) each (docs/algorithms.md says why `earlier`). One table per question over
all processes: every step each process's (question, answer) pairs are gathered
(AlgorithmContext.gather) and every process adds all of them, so N processes count as one does.
A response without an answer gets no term and is not counted. The table is saved with
checkpoints.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import dataclass

import torch

from algorithms.base import OnBase, register
from benchmarks.answer_extraction import answer_key
from meds_cli.core.fields import at_least, choice, doc

VARIANTS = ["ucb", "ucb-mean", "ucb-con", "batch"]
COUNT_RULES = ["earlier", "with-batch"]


@dataclass
class OutcomeUCBConfig:
    variant: str = choice("ucb", VARIANTS, "exploration term: ucb (historical), ucb-mean, ucb-con (minus "
                                           "outcome-ucb.baseline), batch (penalty for answers repeated in a group)")
    coef: float = doc(0.2, "c, the weight of the exploration term added to the advantages (the paper's 0.2)",
                      at_least(0))
    baseline: float = doc(0.5, "b0 of ucb-con: the term is min(1, 1/sqrt(N)) - b0 (the paper: 0.5 on its harder "
                               "data set, 1 on the easier)")
    counts: str = choice("earlier", COUNT_RULES, "N(question, answer): earlier = the steps before this one (an unseen "
                                                 "answer gets the full bonus); with-batch = this step counted first")


def ucb_bonus(count: int) -> float:
    """min(1, sqrt(1 / count)); an answer never seen (count 0) gets the cap, 1."""
    return 1.0 if count <= 0 else min(1.0, 1.0 / math.sqrt(count))


def exploration_terms(answers: list[str | None], counts: list[int], variant: str, baseline: float) -> list[float]:
    """The exploration term of each response of one group (before the coefficient); `counts` is
    N(x, a_i) of each response under the run's counting rule; 0 for a response without an answer."""
    n = len(answers)
    answered = [a is not None for a in answers]
    if variant == "batch":
        same = Counter(a for a in answers if a is not None)
        return [-(same[a] - 1) / n if a is not None else 0.0 for a in answers]
    bonus = [ucb_bonus(c) if ok else 0.0 for c, ok in zip(counts, answered)]
    if variant == "ucb":
        return bonus
    if variant == "ucb-con":
        return [b - baseline if ok else 0.0 for b, ok in zip(bonus, answered)]
    if variant == "ucb-mean":
        total, m = sum(bonus), sum(answered)
        return [b - (total - b) / (m - 1) if ok and m > 1 else (b if ok else 0.0) for b, ok in zip(bonus, answered)]
    raise ValueError(f"unknown outcome-ucb.variant '{variant}'; accepted: {', '.join(VARIANTS)}")


def merge_counts(table: dict[str, Counter], gathered: list[list[tuple[str, str]]]) -> None:
    """Add every process's (question id, answer) pairs of this step to `table`, in process order
    (each process adds the same pairs: the tables stay equal)."""
    for pairs in gathered:
        for question, answer in pairs:
            table.setdefault(question, Counter())[answer] += 1


@register("outcome-ucb", "outcome-based exploration: a bonus for final answers rarely seen for a question (or a "
                         "penalty for answers repeated in a group) added to the advantages; on GRPO (default) or DAPO")
class OutcomeUCB(OnBase):
    config_class = OutcomeUCBConfig
    bases = ("grpo", "dapo")
    default_base = "grpo"  # the paper's base; DAPO's dynamic sampling would hide the all-wrong groups

    @classmethod
    def key_settings(cls, own):
        settings = {"variant": own.variant, "coef": own.coef}
        if own.variant == "ucb-con":
            settings["baseline"] = own.baseline
        if own.variant != "batch":  # batch exploration reads no counts
            settings["counts"] = own.counts
        return settings

    def __init__(self, config, context, base):
        super().__init__(config, context, base)
        self.counts: dict[str, Counter] = {}  # question id -> answer key -> times sampled, over all processes
        if getattr(base.config, "dynamic_sampling", False):
            warnings.warn(f"outcome-ucb on {base.name}: dynamic sampling drops the groups of equal correctness before "
                          "the bonus (the all-wrong questions the paper explores on), and their answers are never "
                          "counted; algo.base=grpo is the paper's setting", UserWarning, stacklevel=3)

    def compute_advantages(self, rollouts):
        advantages = self.base.compute_advantages(rollouts).float()
        cfg = self.config
        groups = [(problem.id, [answer_key(rollouts.verdicts[i].extracted) for i in range(rows.start, rows.stop)])
                  for problem, rows in zip(rollouts.problems, rollouts.groups())]
        seen_before = [[self.counts.get(q, {}).get(a, 0) if a is not None else 0 for a in answers]
                       for q, answers in groups]
        mine = [(q, a) for q, answers in groups for a in answers if a is not None]
        merge_counts(self.counts, self.context.gather(mine))
        terms = []
        for (q, answers), before in zip(groups, seen_before):
            counts = before if cfg.counts == "earlier" else [self.counts.get(q, {}).get(a, 0) if a is not None else 0
                                                             for a in answers]
            terms.extend(exploration_terms(answers, counts, cfg.variant, cfg.baseline))
        term = cfg.coef * torch.tensor(terms, dtype=advantages.dtype)
        never_seen = sum(1 for (_, answers), before in zip(groups, seen_before)
                         for a, c in zip(answers, before) if a is not None and c == 0)
        self._metrics = {"outcome-ucb/bonus_mean": term.mean().item(),
                         "outcome-ucb/never_seen_share": never_seen / max(rollouts.size, 1),
                         "outcome-ucb/distinct_answers_so_far": sum(len(self.counts.get(q, ())) for q, _ in groups)
                         / max(len(groups), 1)}
        return advantages + term

    def state_dict(self):
        return {**super().state_dict(), "counts": {k: dict(v) for k, v in self.counts.items()}}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.counts = {k: Counter(v) for k, v in state.get("counts", {}).items()}
