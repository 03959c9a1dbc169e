"""The diversity diagnostics every algorithm logs per step, under `diversity/` in metrics.jsonl, so
that arms compare on the same numbers (the formulas: algorithms/diversity.py; docs/algorithms.md,
"Diversity diagnostics"):

- diversity/distinct_wrong_per_group: the mean over the step's sampled groups of the distinct
  wrong answers (answers compared by the maj@k key, algorithms/answer_groups.py 'key'; a response
  without an answer adds none; a group without a wrong answer counts 0);
- diversity/one_error_group_share: of the sampled groups with at least two wrong responses that
  have an answer, the share whose wrong answers are all one answer (summed over processes before
  the division; absent in a step where no group has two such responses);
- diversity/entropy: the policy's entropy (at the sampling temperature) averaged over the tokens
  of the responses that trained, as the `entropy` key;
- diversity/eigen_ratio_top1: the mean over the sampled groups of the top-1 eigen ratio of the
  group's logit-lens features at the final answer's first token y* (MEDS's anchor rule
  'project'), at the layers `train.diversity_layers` (last_half by default, no final norm on the
  intermediate layers: MEDS's default features), L2-normalised as MEDS clusters them.

The probe costs no forward pass: the `hf` engine records those logit-lens values while it samples
(engine/rollout/lens_probe.py, as MEDS reads its features), for every algorithm; where MEDS asks
for the same layers, the one probe serves both. An engine that records none (vLLM, an engine in
another process) or an algorithm that records other layers leaves the eigen ratio out, said once
when the run starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from algorithms.answer_groups import answer_classes
from algorithms.diversity import (
    distinct_wrong_answers,
    masked_token_mean,
    mean_group_eigen_ratio,
    one_repeated_error,
)
from algorithms.meds_feature_builders import lens_at_answers
from algorithms.meds_features import resolve_layers
from meds_cli.core.forward import LensProbe
from meds_cli.core.rollouts import Rollouts

ANCHOR_RULE = "project"  # how y* is found: MEDS's default (algorithms/meds_features.py ANCHOR_RULES)
LAYERS_KEY = "train.diversity_layers"


def group_answer_labels(rollouts: Rollouts) -> list[list[int | None]]:
    """Per group, the answer class of each response (None: no answer), classes by the maj@k key."""
    return answer_classes([[v.extracted for v in rollouts.verdicts[rows]] for rows in rollouts.groups()], "key")


def diversity_probe(spec, num_layers: int, records_lens: bool,
                    asked: LensProbe | None) -> tuple[LensProbe | None, str | None]:
    """(the logit-lens probe the engine records for diversity/eigen_ratio_top1, or None; where None
    although `spec` asked for one, the line that says why). `asked`: the algorithm's own probe."""
    if spec == "none":
        return None, None
    if not records_lens:
        return None, ("diversity/eigen_ratio_top1: not measured: this rollout engine records no logit-lens "
                      "values while it samples (the hf engine in the training process does, without rollout.tools)")
    probe = LensProbe(tuple(resolve_layers(spec, num_layers, LAYERS_KEY)), final_norm=False)
    if asked is not None and asked != probe:
        return None, (f"diversity/eigen_ratio_top1: not measured: the algorithm records logit-lens layers "
                      f"{list(asked.layers)} (final_norm {asked.final_norm}), {LAYERS_KEY} names "
                      f"{list(probe.layers)}; set {LAYERS_KEY} to the algorithm's layers so both read one probe")
    return probe, None


def diversity_metrics(sampled: Rollouts, trained: Rollouts | None, tokenizer=None,
                      total: Callable[[float], float] = lambda count: count) -> dict[str, float]:
    """The step's `diversity/` metrics (module docstring). `sampled`: every group sampled this step
    (graded); `trained`: the groups that trained, their entropy filled (None: no update);
    `tokenizer`: given where the engine recorded the diversity probe's values in sampled.sampler_lens;
    `total`: a count summed over processes (Collectives.sum: every process calls it once a step)."""
    labels = group_answer_labels(sampled)
    correct = [[v.correct for v in sampled.verdicts[rows]] for rows in sampled.groups()]
    out = {"diversity/distinct_wrong_per_group":
           sum(map(distinct_wrong_answers, labels, correct)) / max(1, len(labels))}
    judged = [j for j in map(one_repeated_error, labels, correct) if j is not None]
    ones, erring = total(float(sum(judged))), total(float(len(judged)))
    if erring > 0:
        out["diversity/one_error_group_share"] = ones / erring
    if trained is not None and trained.entropy is not None:
        out["diversity/entropy"] = masked_token_mean(trained.entropy, trained.response_mask)
    if tokenizer is not None and sampled.sampler_lens is not None:
        features, _, _ = lens_at_answers(sampled, tokenizer, ANCHOR_RULE)
        ratio = mean_group_eigen_ratio(features, sampled.groups())
        if ratio is not None:
            out["diversity/eigen_ratio_top1"] = ratio
    return out


@dataclass
class DiversityMetrics:
    """What the loop needs to log the diagnostics each step (built by engine/trainer_parts.py)."""

    tokenizer: object
    probe: LensProbe | None  # the layers the engine records for the eigen ratio; None: not measured
    total: Callable[[float], float]  # Collectives.sum

    def step_metrics(self, sampled: Rollouts, trained: Rollouts | None) -> dict[str, float]:
        return diversity_metrics(sampled, trained, self.tokenizer if self.probe is not None else None, self.total)
