"""EDAS: Error Diversity Advantage Shaping (Liu et al. 2026, "Leveraging Error Diversity in
Group Rollouts for Reinforcement Learning"; seed 003, docs/algorithms.md "EDAS").

A post-hoc change of the group advantages of a base algorithm (GRPO or DAPO, `--base`); only
wrong responses change. The wrong responses W of a group (N_w = |W|) are partitioned into error
classes: for math, equal final answers (grader equality, `algorithms.answer_groups`; responses
with no answer are one class of their own); for code, the outcome of the sandboxed run
(exception type, WrongAnswer, Timeout, no_program). With K classes, p_k = |C_k| / N_w,
I_i = -ln p_k(i), H = -sum p_k ln p_k and S = mean over W of |A_i|:
    Delta_i = 0                                  if N_w <= 1  (too few errors to compare)
            = -beta * S                          if K == 1    (one repeated error: push away)
            = alpha * S * (I_i - H) / ln N_w     if K > 1     (zero-sum over W)
so a dominant error is penalised more and a rare one less. The clip (`edas.clip`) keeps every
wrong response's advantage on its side of zero:
  kappa (default; the authors' rule, their README's "Method at a glance"):
    A_i <- A_i + sgn(Delta_i) * min(|Delta_i|, |A_i| / kappa), in both directions, no
    absorption (kappa_clip). `magnitude` is its former name, still accepted.
  sign (a variant, this project's reading of the paper's text): a change may move A_i towards
    zero only as far as A_i / kappa; away from zero it is not limited. Where it binds with K > 1,
    the other wrong responses absorb what it held back, one equal shift each, so the wrong subset
    still sums to zero (sign_keeping_clip).
The two agree with binary rewards and alpha, beta <= 0.5 (no change then reaches |A| / 2); they
differ at larger alpha or beta and with partial credit.
`all_wrong_penalty` p > 0: a group whose responses are all wrong with one error class, and to
which the base gave no advantage (S = 0, e.g. GRPO), gets A_i = -p; its groups are then kept by
DAPO's dynamic-sampling filter (keep_groups). alpha, beta and p are off for the first
`warmup_start` steps, then ramp up linearly over `warmup_steps` (warmup_factor), as the
authors' warm-up scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Sequence

import torch

from algorithms.answer_groups import EQUIVALENCE_MODES, answer_classes
from algorithms.base import OnBase, correct_mask, mean_where, register
from meds_cli.core.fields import at_least, choice, doc, greater_than
from meds_cli.core.records import MATH_OUTCOMES  # any other verdict outcome is a code run's class
from meds_cli.core.rollouts import group_slices

NO_ANSWER_CLASS = "no_answer"
# kappa: the authors' clip; magnitude: its name before issue 54, kept so older configs and run folders load
CLIP_MODES = ["kappa", "sign", "magnitude"]


@dataclass
class EDASConfig:
    alpha: float = doc(0.2, "strength of the redistribution between error classes (K > 1)", at_least(0))
    beta: float = doc(0.2, "extra penalty, in units of S, when every error is the same (K = 1)", at_least(0))
    kappa: float = doc(2.0, "clip margin: a change is at most |A| / kappa (kappa clip), or moves A towards zero at "
                            "most to A / kappa (sign clip)", greater_than(1, "else the clip can flip a sign"))
    clip: str = choice("kappa", CLIP_MODES, "kappa: every change at most |A| / kappa, both directions (the authors' "
                       "code); sign: only changes towards zero are limited, the rest of the wrong responses absorb "
                       "what is held back (a variant); magnitude: the former name of kappa")
    all_wrong_penalty: float = doc(0.0, "advantage -p for an all-wrong group with one error class that the base gives "
                                        "no advantage; DAPO then keeps such groups (0: off, the paper)", at_least(0))
    warmup_start: int = doc(0, "training steps with no shaping at all before the warm-up ramp begins (0: none)",
                            at_least(0))
    warmup_steps: int = doc(0, "linear warm-up of alpha, beta and all_wrong_penalty over this many training steps "
                               "after warmup_start (0: full strength at once)", at_least(0))
    equivalence: str = choice("grader", EQUIVALENCE_MODES, "math error classes: canonical key then grader, or key only")


# ---------------------------------------------------------------- the formulas


def error_entropy_terms(labels: Sequence[Hashable]) -> tuple[list[float], float]:
    """(I_i = -ln p_k(i) for every error, H = -sum_k p_k ln p_k) of a list of error-class labels."""
    n = len(labels)
    counts: dict[Hashable, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    surprisal = [-math.log(counts[label] / n) for label in labels]
    entropy = -sum((c / n) * math.log(c / n) for c in counts.values())
    return surprisal, entropy


def diversity_delta(labels: Sequence[Hashable], abs_advantages: Sequence[float], alpha: float,
                    beta: float) -> tuple[list[float], str]:
    """Delta_i for the wrong responses of one group and which case applied ('none', 'single', 'diverse')."""
    n = len(labels)
    if n <= 1:
        return [0.0] * n, "none"
    scale = sum(abs_advantages) / n  # S
    surprisal, entropy = error_entropy_terms(labels)
    if len(set(labels)) == 1:
        return [-beta * scale] * n, "single"
    return [alpha * scale * (i - entropy) / math.log(n) for i in surprisal], "diverse"


def kappa_clip(advantages: torch.Tensor, delta: torch.Tensor, kappa: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`edas.clip: kappa`, the authors' rule: (A + sgn(Delta) * min(|Delta|, |A| / kappa), bool mask
    of the Deltas the clip shortened). It limits changes away from zero too, and does not keep the
    wrong subset's sum where it binds."""
    limit = advantages.abs() / kappa
    clipped = delta.abs() > limit
    return advantages + torch.sign(delta) * torch.minimum(delta.abs(), limit), clipped


def sign_bounds(advantages: Sequence[float], kappa: float) -> list[tuple[float, float]]:
    """(lowest, highest) shaped advantage each wrong response may take under the sign clip: a
    change may bring A towards zero no closer than A / kappa, and is free away from zero. A = 0
    counts as the negative side (a wrong response is never moved above zero)."""
    return [(-math.inf, a / kappa) if a <= 0 else (a / kappa, math.inf) for a in advantages]


def equal_shift_to_total(values: Sequence[float], bounds: Sequence[tuple[float, float]], total: float) -> float:
    """The shift s with sum_i clamp(values_i + s, bounds_i) = total: each free value moves by the same
    s and the others sit at their bound. The sum is piecewise linear and non-decreasing in s, so
    s is found exactly on the segment between two consecutive breakpoints (where a value meets
    a bound) that contains the total."""

    def clamped_sum(shift: float) -> float:
        return sum(min(max(v + shift, low), high) for v, (low, high) in zip(values, bounds))

    points = sorted(b - v for v, pair in zip(values, bounds) for b in pair if math.isfinite(b))
    sums = [clamped_sum(p) for p in points]
    if total <= sums[0]:  # before the first breakpoint only the values unbounded below move
        slope = sum(math.isinf(low) for low, _ in bounds)
        return points[0] - (sums[0] - total) / slope if slope else points[0]
    if total >= sums[-1]:  # after the last one only the values unbounded above move
        slope = sum(math.isinf(high) for _, high in bounds)
        return points[-1] + (total - sums[-1]) / slope if slope else points[-1]
    for p, q, at_p, at_q in zip(points, points[1:], sums, sums[1:]):
        if at_p <= total <= at_q:
            return p if at_q == at_p else p + (q - p) * (total - at_p) / (at_q - at_p)
    raise AssertionError("unreachable: the clamped sum is continuous and non-decreasing")


def sign_keeping_clip(advantages: torch.Tensor, delta: torch.Tensor, kappa: float,
                      zero_sum: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`edas.clip: sign` on the wrong responses of one group: (shaped advantages, bool mask of the
    responses held at their bound). A + Delta, except that no response goes past A / kappa
    towards zero (sign_bounds). With `zero_sum` (the K > 1 redistribution) and a bound reached,
    the responses not at a bound all shift by one amount that restores sum(shaped) = sum(A)
    (equal_shift_to_total); a solution always exists, since A itself lies within every bound."""
    base = advantages.double().tolist()
    target = (advantages.double() + delta.double()).tolist()
    bounds = sign_bounds(base, kappa)
    if all(low <= t <= high for t, (low, high) in zip(target, bounds)):
        return advantages + delta, torch.zeros_like(advantages, dtype=torch.bool)
    shift = equal_shift_to_total(target, bounds, sum(base)) if zero_sum else 0.0
    shaped = [min(max(t + shift, low), high) for t, (low, high) in zip(target, bounds)]
    held = [t + shift != s for t, s in zip(target, shaped)]
    return (torch.tensor(shaped, dtype=torch.float64).to(advantages.dtype),
            torch.tensor(held, dtype=torch.bool))


def is_broken_record(labels: Sequence[Hashable], group_size: int) -> bool:
    """Every response of a group (of size `group_size`, at least 2) wrong, all in one error class: the
    summary's "broken record", which `all_wrong_penalty` penalises."""
    return group_size > 1 and len(labels) == group_size and len(set(labels)) == 1


def edas_advantages(advantages: torch.Tensor, wrong: torch.Tensor, classes: Sequence[Hashable | None], group_size: int,
                    alpha: float, beta: float, kappa: float, clip: str = "kappa",
                    all_wrong_penalty: float = 0.0) -> tuple[torch.Tensor, dict]:
    """Shaped advantages [B] from base advantages [B], wrong [B] bool and an error class per
    response (read only where wrong), group by group; and the per-group facts for diagnostics."""
    shaped = advantages.clone().float()
    delta_all = torch.zeros_like(shaped)
    clipped_all = torch.zeros_like(shaped, dtype=torch.bool)
    in_scope = torch.zeros_like(shaped, dtype=torch.bool)  # wrong responses of groups with N_w > 1
    cases, class_counts = [], []
    for group in group_slices(advantages.numel(), group_size):
        rows = [i for i in range(group.start, group.stop) if bool(wrong[i])]
        labels = [classes[i] for i in rows]
        class_counts.append(len(set(labels)))
        abs_advantages = [abs(float(advantages[i])) for i in rows]
        delta, case = diversity_delta(labels, abs_advantages, alpha, beta)
        index = torch.tensor(rows, dtype=torch.long)
        if all_wrong_penalty > 0 and is_broken_record(labels, group.stop - group.start) and not any(abs_advantages):
            # the base gave this group nothing (S = 0, so -beta * S = 0): the penalty is its advantage
            case = "all_wrong"
            delta = [-all_wrong_penalty] * len(rows)
            new, clipped = shaped[index] + torch.tensor(delta), torch.zeros(len(rows), dtype=torch.bool)
        elif case == "none":
            cases.append(case)
            continue
        elif clip in ("kappa", "magnitude"):
            new, clipped = kappa_clip(shaped[index], torch.tensor(delta, dtype=shaped.dtype), kappa)
        else:
            new, clipped = sign_keeping_clip(shaped[index], torch.tensor(delta, dtype=shaped.dtype), kappa,
                                             zero_sum=case == "diverse")
        cases.append(case)
        shaped[index] = new
        delta_all[index] = torch.tensor(delta, dtype=shaped.dtype)
        clipped_all[index] = clipped
        in_scope[index] = True
    return shaped, {"cases": cases, "classes": class_counts, "delta": delta_all, "clipped": clipped_all,
                    "in_scope": in_scope}


def warmup_factor(step: int, warmup_steps: int, warmup_start: int = 0) -> float:
    """Share of alpha, beta and all_wrong_penalty in force at training step `step` (1-based): 0
    through step `warmup_start` (the delay), then (step - warmup_start) / warmup_steps capped at 1
    (1 at once when warmup_steps is 0)."""
    if step <= warmup_start:
        return 0.0
    if warmup_steps <= 0:
        return 1.0
    return min(1.0, (step - warmup_start) / warmup_steps)


# ---------------------------------------------------------------- error classes


def error_classes(verdicts, equivalence: str, group_size: int) -> list[Hashable | None]:
    """An error-class label per response; correct responses get None.

    Code verdicts (an outcome outside the math set) are classed by outcome; math verdicts by
    their final answer, with every answerless response in the one 'no_answer' class (failing to
    answer at all is one failure mode, and repeating it is the collapse EDAS pushes against).
    """
    labels: list[Hashable | None] = [None] * len(verdicts)
    math_groups: list[list[str | None]] = []
    math_rows: list[list[int]] = []
    for group in group_slices(len(verdicts), group_size):
        answers, rows = [], []
        for i in range(group.start, group.stop):
            v = verdicts[i]
            if v.correct:
                continue
            if v.outcome not in MATH_OUTCOMES:
                labels[i] = ("outcome", v.outcome)
            elif v.extracted is None or not str(v.extracted).strip():
                labels[i] = NO_ANSWER_CLASS
            else:
                answers.append(str(v.extracted))
                rows.append(i)
        math_groups.append(answers)
        math_rows.append(rows)
    for rows, group_labels in zip(math_rows, answer_classes(math_groups, equivalence)):
        for i, label in zip(rows, group_labels):
            labels[i] = ("answer", label)
    return labels


# ---------------------------------------------------------------- the algorithm


@register("edas", "EDAS: reshape wrong responses' advantages by error diversity, on GRPO or DAPO (--base)")
class EDAS(OnBase):
    config_class = EDASConfig

    def __init__(self, config, context, base):
        super().__init__(config, context, base)
        self.steps_done = 0
        self._last: dict = {}

    def compute_advantages(self, rollouts):
        advantages = self.base.compute_advantages(rollouts)
        if advantages.dim() != 1:
            raise ValueError("EDAS shapes sequence-level advantages [B]; the base returned per-token ones")
        cfg = self.config
        scale = warmup_factor(self.steps_done + 1, cfg.warmup_steps, cfg.warmup_start)
        wrong = ~correct_mask(rollouts)
        classes = error_classes(rollouts.verdicts, cfg.equivalence, rollouts.group_size)
        shaped, facts = edas_advantages(advantages, wrong, classes, rollouts.group_size,
                                        cfg.alpha * scale, cfg.beta * scale, cfg.kappa, cfg.clip,
                                        cfg.all_wrong_penalty * scale)
        self._last = {**facts, "scale": scale}
        return shaped

    def keep_groups(self, rollouts):
        """The base's groups; with `all_wrong_penalty` also every broken-record group, which DAPO's
        dynamic sampling would drop (no spread) before the penalty could reach it."""
        keep = self.base.keep_groups(rollouts)
        if self.config.all_wrong_penalty <= 0:
            return keep
        classes = error_classes(rollouts.verdicts, self.config.equivalence, rollouts.group_size)
        broken = [is_broken_record([c for c in classes[rows] if c is not None], rows.stop - rows.start)
                  for rows in group_slices(len(classes), rollouts.group_size)]
        return keep | torch.tensor(broken, dtype=torch.bool)

    def on_step_end(self, rollouts, step):
        super().on_step_end(rollouts, step)
        self.steps_done = step

    def step_metrics(self, rollouts):
        metrics = dict(super().step_metrics(rollouts))
        facts = self._last
        if not facts:
            return metrics
        cases, classes = facts["cases"], facts["classes"]
        n = max(len(cases), 1)
        with_errors = [k for k in classes if k > 0]
        shaped = facts["in_scope"]
        metrics.update({
            "edas/classes_mean": sum(with_errors) / len(with_errors) if with_errors else 0.0,
            "edas/case_few_share": cases.count("none") / n,
            "edas/case_single_share": cases.count("single") / n,
            "edas/case_diverse_share": cases.count("diverse") / n,
            "edas/case_all_wrong_share": cases.count("all_wrong") / n,
            "edas/delta_abs_mean": mean_where(facts["delta"].abs(), shaped),
            "edas/clipped_share": mean_where(facts["clipped"].float(), shaped),
            "edas/warmup_factor": facts["scale"],
        })
        return metrics

    def state_dict(self):
        return {**super().state_dict(), "steps_done": self.steps_done}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.steps_done = state.get("steps_done", 0)
