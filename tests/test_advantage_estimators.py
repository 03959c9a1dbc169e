"""Advantage estimators (algorithms/advantages.py): hand-computed values, the registry, and the
`adv_estimator` key of an algorithm's section."""

from types import SimpleNamespace

import pytest
import torch

from algorithms.advantages import (
    ADV_ESTIMATORS,
    group_advantages,
    group_baseline_whitened_advantages,
    leave_one_out_advantages,
    token_weighted_whiten,
)
from meds_cli.core.errors import UserError
from meds_cli.engine.training.algorithm_setup import build_algorithm
from tests.config_errors import assert_refused_in_one_line
from tests.conftest import tiny_config
from tests.rollout_factory import make_rollouts

ONES = torch.ones(4)


def test_rloo_subtracts_the_mean_of_the_other_responses():
    # r = [1, 0, 0, 1]: response 0's others are (0, 0, 1), mean 1/3 -> 2/3; response 1's (1, 0, 1) -> -2/3
    adv = leave_one_out_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4)
    assert adv.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    # two groups of two: [3, 1] -> [3 - 1, 1 - 3]; [2, 2] -> [0, 0]
    assert leave_one_out_advantages(torch.tensor([3.0, 1.0, 2.0, 2.0]), 2).tolist() == [2.0, -2.0, 0.0, 0.0]


def test_rloo_edge_cases():
    assert leave_one_out_advantages(torch.tensor([5.0, -1.0]), 1).tolist() == [5.0, -1.0]  # no other response
    assert leave_one_out_advantages(torch.tensor([]), 4).numel() == 0


def test_reinforce_plus_plus_baseline_equal_lengths():
    # centred by group: [0.5, -0.5, 0, 0]; batch mean 0, unbiased variance 0.5 / 3 = 1/6
    adv = group_baseline_whitened_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 2, ONES)
    assert adv.tolist() == pytest.approx([0.5 / (1 / 6) ** 0.5, -0.5 / (1 / 6) ** 0.5, 0.0, 0.0], abs=1e-6)


def test_reinforce_plus_plus_baseline_weighs_responses_by_their_tokens():
    # centred [0.5, -0.5, 0, 0] with 3, 1, 1, 1 tokens: token mean (1.5 - 0.5) / 6 = 1/6;
    # deviations 1/3, -2/3, -1/6, -1/6; variance (3/9 + 4/9 + 1/36 + 1/36) / (6 - 1) = 1/6
    adv = group_baseline_whitened_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 2, torch.tensor([3, 1, 1, 1]))
    s = (1 / 6) ** 0.5
    assert adv.tolist() == pytest.approx([(1 / 3) / s, (-2 / 3) / s, (-1 / 6) / s, (-1 / 6) / s], abs=1e-6)


def test_token_weighted_whiten_equals_whitening_every_token():
    # the reference: repeat each response's value once per token and whiten the flat tokens
    torch.manual_seed(0)
    values, counts = torch.randn(6), torch.tensor([1, 7, 3, 2, 5, 4])
    tokens = values.repeat_interleave(counts)
    reference = (values - tokens.mean()) / torch.sqrt(tokens.var(unbiased=True) + 1e-8)
    assert torch.allclose(token_weighted_whiten(values, counts), reference, atol=1e-6)


def test_reinforce_plus_plus_baseline_group_of_one_has_no_baseline():
    # no group mean is subtracted: [1, 0] whitened: mean 1/2, variance 1/2 -> +-0.707107
    adv = group_baseline_whitened_advantages(torch.tensor([1.0, 0.0]), 1, torch.ones(2))
    assert adv.tolist() == pytest.approx([0.707107, -0.707107], abs=1e-5)


def test_reinforce_plus_plus_whitens_the_rewards_without_a_group_baseline():
    # [1, 0, 0, 0], one token each: mean 1/4, unbiased variance (9/16 + 3/16) / 3 = 1/4, std 1/2
    estimate = ADV_ESTIMATORS.get("reinforce_plus_plus")
    adv = estimate(torch.tensor([1.0, 0.0, 0.0, 0.0]), 2, ONES, None)
    assert adv.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-6)
    assert estimate(torch.tensor([]), 2, torch.tensor([]), None).numel() == 0


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_the_grpo_estimator_is_group_advantages_with_the_sections_scale(scale):
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    config = SimpleNamespace(scale_rewards=scale, adv_eps=1e-6)
    got = ADV_ESTIMATORS.get("grpo")(rewards, 4, torch.ones(8), config)
    assert torch.equal(got, group_advantages(rewards, 4, scale, 1e-6))


def test_registry_holds_verls_names_and_refuses_unknown_ones():
    assert {"grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"} <= set(ADV_ESTIMATORS.names())
    with pytest.raises(UserError, match="unknown advantage estimator 'rlo'.*did you mean 'rloo'"):
        ADV_ESTIMATORS.get("rlo")


def test_adv_estimator_key_chooses_the_estimator_of_grpo_and_dapo():
    rollouts = make_rollouts([True, False, False, False], 4, lengths=[4, 1, 2, 3])
    for name in ("grpo", "dapo"):
        algorithm = build_algorithm(tiny_config(f"algo.name={name}", f"{name}.adv_estimator=rloo"))
        rollouts.rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
        # response 0's others are all 0 -> 1; each other response's are (1, 0, 0) -> -1/3
        assert algorithm.compute_advantages(rollouts).tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    algorithm = build_algorithm(tiny_config("algo.name=grpo", "grpo.adv_estimator=reinforce_plus_plus_baseline"))
    expected = group_baseline_whitened_advantages(rollouts.rewards, 4, torch.tensor([4, 1, 2, 3]))
    assert torch.equal(algorithm.compute_advantages(rollouts), expected)


def test_a_shaping_method_uses_its_bases_estimator():
    algorithm = build_algorithm(tiny_config("algo.name=edas", "algo.base=grpo", "grpo.adv_estimator=rloo"))
    assert algorithm.base.config.adv_estimator == "rloo"


@pytest.mark.parametrize("overrides, words", [
    (["grpo.adv_estimator=rlo"], ["grpo.adv_estimator", "rloo", "reinforce_plus_plus_baseline"]),
    (["grpo.adv_estimator=rloo", "grpo.scale_rewards=batch"], ["grpo.scale_rewards=batch", "adv_estimator=grpo only"]),
    (["rlif-multireward.adv_estimator=rloo"], ["rlif-multireward.adv_estimator", "accepted: grpo"]),
])
def test_bad_estimator_settings_are_one_line(overrides, words):
    assert_refused_in_one_line(overrides, words)
