"""GRPO and DAPO formulas on small tensors; expected values computed by hand in the comments."""

import math

import pytest
import torch

from algorithms.advantages import group_advantages, zero_spread_groups
from algorithms.dapo import overlong_penalty
from algorithms.policy_loss import agg_loss, clipped_surrogate, k3_kl


def test_group_advantages_mirror_verl_grpo_outcome_advantage():
    """Mirrors verl core_algos.compute_grpo_outcome_advantage (norm_adv_by_std_in_grpo=True)."""
    # group [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.577350; A = +-0.5 / 0.577350 = +-0.866025
    # group [1, 0]: mean 0.5, std sqrt(0.5 / 1) = 0.707107; A = +-0.707107
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4)
    assert adv.tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)
    adv2 = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2)
    assert adv2.tolist() == pytest.approx([0.707106, -0.707106, -0.707106, 0.707106], abs=1e-5)


def test_group_advantages_scale_none_and_batch():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    # none (Dr. GRPO): r - group mean; group 2 mean 0.75
    assert group_advantages(rewards, 4, "none").tolist() == pytest.approx(
        [0.5, -0.5, -0.5, 0.5, 0.25, 0.25, 0.25, -0.75])
    # batch: divide by the std of all 8 rewards: mean 5/8, sum sq dev = 5 * 0.375^2 + 3 * 0.625^2 = 1.875,
    # var = 1.875 / 7 = 0.267857, std = 0.517549
    expected = [v / 0.517549 for v in [0.5, -0.5, -0.5, 0.5, 0.25, 0.25, 0.25, -0.75]]
    assert group_advantages(rewards, 4, "batch").tolist() == pytest.approx(expected, abs=1e-5)


def test_group_advantages_edge_cases():
    # all rewards equal: centred rewards are 0, so every advantage is 0 (no NaN from std 0)
    assert group_advantages(torch.tensor([1.0, 1.0, 1.0]), 3).tolist() == [0.0, 0.0, 0.0]
    # a group of one: verl uses mean 0 and std 1, so A = r / (1 + eps)
    assert group_advantages(torch.tensor([1.0, 0.0]), 1).tolist() == pytest.approx([1 / (1 + 1e-6), 0.0])
    # empty batch after filtering
    assert group_advantages(torch.tensor([]), 4).numel() == 0
    assert zero_spread_groups(torch.tensor([1.0, 1.0, 0.0, 1.0]), 2).tolist() == [True, False]


def test_clipped_surrogate_mirrors_verl_compute_policy_loss_vanilla():
    """Mirrors verl core_algos.compute_policy_loss_vanilla (clip_ratio_low/high, clip_ratio_c)."""
    ratios = torch.tensor([[1.5, 0.5, 5.0, 0.5]])
    old = torch.zeros(1, 4)
    logp = torch.log(ratios)
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    mask = torch.ones(1, 4)
    loss, stats = clipped_surrogate(logp, old, adv, mask, 0.2, 0.2, clip_ratio_c=3.0)
    # tok0 A=+1 r=1.5: max(-1.5, -1.2) = -1.2 (clip high)
    # tok1 A=-1 r=0.5: max(0.5, 0.8) = 0.8 (clip low)
    # tok2 A=-1 r=5:   max(5, 1.2) = 5, dual clip min(5, 3) = 3
    # tok3 A=+1 r=0.5: max(-0.5, -0.8) = -0.5 (unclipped)
    assert loss.tolist()[0] == pytest.approx([-1.2, 0.8, 3.0, -0.5], abs=1e-6)
    assert stats["clip_high"].item() == pytest.approx(0.25)
    assert stats["clip_low"].item() == pytest.approx(0.25)
    assert stats["clip_dual"].item() == pytest.approx(0.25)
    # no dual clip: token 2 keeps 5
    loss_nodual, _ = clipped_surrogate(logp, old, adv, mask, 0.2, 0.2, None)
    assert loss_nodual[0, 2].item() == pytest.approx(5.0)


def test_clip_higher_bounds():
    # DAPO eps_high 0.28: A=+1, r=1.5 -> max(-1.5, -1.28) = -1.28
    loss, _ = clipped_surrogate(torch.log(torch.tensor([[1.5]])), torch.zeros(1, 1), torch.tensor([1.0]),
                                torch.ones(1, 1), 0.2, 0.28)
    assert loss.item() == pytest.approx(-1.28)


def test_on_policy_ratio_is_one_and_gradient_is_minus_advantage():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, stats = clipped_surrogate(logp, logp.detach(), torch.tensor([0.5]), torch.ones(1, 2))
    assert stats["ratio_mean"].item() == 1.0
    loss.sum().backward()
    # d(-A * exp(logp - old))/dlogp = -A * ratio = -0.5
    assert logp.grad.tolist() == [[-0.5, -0.5]]


def test_agg_loss_modes_mirror_verl_agg_loss():
    """Mirrors verl core_algos.agg_loss; seq-mean-token-sum-norm includes verl's micro/mini scaling (see docstring)."""
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(10 / 4)  # (1+2+3+4) / 4 tokens
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm", norm_length=5).item() == pytest.approx(10 / (5 * 2))
    # global normalisers: the same micro-batch inside a mini-batch of 8 tokens / 4 sequences
    assert agg_loss(loss, mask, "token-mean", total_tokens=8).item() == pytest.approx(10 / 8)
    assert agg_loss(loss, mask, "seq-mean-token-mean", total_seqs=4).item() == pytest.approx(6 / 4)
    with pytest.raises(ValueError):
        agg_loss(loss, mask, "mean")


def test_agg_loss_all_tokens_masked_is_zero_not_nan():
    loss = torch.ones(2, 3)
    mask = torch.zeros(2, 3)
    for mode in ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]:
        assert agg_loss(loss, mask, mode).item() == 0.0


def test_k3_kl():
    # logp = log 0.5, ref = log 0.25: d = ref - logp = -ln 2; exp(d) - d - 1 = 0.5 + 0.693147 - 1 = 0.193147
    kl = k3_kl(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)]))
    assert kl.item() == pytest.approx(0.193147, abs=1e-6)
    assert k3_kl(torch.tensor([-1.0]), torch.tensor([-1.0])).item() == 0.0


def test_overlong_penalty():
    # L_max 100, buffer 20, factor 1: expected length 80; L=70 -> 0; L=90 -> -(10/20) = -0.5; L=100 -> -1
    lengths = torch.tensor([70, 80, 90, 100])
    assert overlong_penalty(lengths, 100, 20, 1.0).tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0])
    assert overlong_penalty(lengths, 100, 0, 1.0).tolist() == [0.0] * 4
