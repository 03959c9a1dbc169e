"""The policy-loss registry: chosen by config, the KL term added once, and the group layout helper."""

import math

import pytest
import torch

from algorithms.base import GRPOConfig
from algorithms.policy_loss import POLICY_LOSSES, add_kl_penalty, clipped_surrogate, kl_cov_loss
from meds_cli.core.errors import UserError
from meds_cli.core.rollouts import group_slices
from meds_cli.engine.training.algorithm_setup import build_algorithm
from tests.conftest import tiny_config

LOGP = torch.tensor([[-1.0, -0.5, -2.0], [-0.2, -1.5, -0.7]])
OLD = torch.tensor([[-1.2, -0.1, -2.0], [-0.9, -1.0, -0.7]])
ADV = torch.tensor([1.0, -2.0])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


def test_registered_losses_and_config_choice():
    assert POLICY_LOSSES.names() == ["clip-cov", "dual-clip", "kl-cov", "vanilla"]
    assert tiny_config("algo.name=grpo").section("grpo").policy_loss == "vanilla"
    assert tiny_config().section("rlif-multireward").policy_loss == "kl-cov"
    with pytest.raises(UserError, match="accepted: clip-cov, dual-clip, kl-cov, vanilla"):
        tiny_config("grpo.policy_loss=clipped")


def test_registered_losses_are_the_pure_functions():
    cfg = GRPOConfig(clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0)
    loss, _ = POLICY_LOSSES.get("vanilla")(LOGP, OLD, ADV, MASK, cfg)
    assert torch.equal(loss, clipped_surrogate(LOGP, OLD, ADV, MASK, 0.2, 0.28, None)[0])
    dual, _ = POLICY_LOSSES.get("dual-clip")(LOGP, OLD, ADV, MASK, cfg)
    assert torch.equal(dual, clipped_surrogate(LOGP, OLD, ADV, MASK, 0.2, 0.28, 3.0)[0])
    cfg.dual_clip = True
    assert torch.equal(POLICY_LOSSES.get("vanilla")(LOGP, OLD, ADV, MASK, cfg)[0], dual)
    cfg.kl_cov_ratio, cfg.kl_cov_coef = 0.5, 2.0
    cov, stats = POLICY_LOSSES.get("kl-cov")(LOGP, OLD, ADV, MASK, cfg)
    assert torch.equal(cov, kl_cov_loss(LOGP, OLD, ADV, MASK, 0.5, 2.0, 0.2, 0.28, 3.0)[0])
    assert "kl_cov_share" in stats


def test_kl_penalty_hand_computed():
    # ref - logp = ln 2 on every token: k3 = 2 - ln 2 - 1
    logp = torch.zeros(1, 2)
    ref = torch.full((1, 2), math.log(2.0))
    loss, stats = add_kl_penalty(torch.ones(1, 2), {}, logp, ref, torch.tensor([[1.0, 0.0]]), 0.5)
    k3 = 1 - math.log(2.0)
    assert loss[0].tolist() == pytest.approx([1 + 0.5 * k3, 1 + 0.5 * k3])
    assert float(stats["kl"]) == pytest.approx(k3)


def test_algorithm_uses_the_configured_loss_and_one_kl():
    algo = build_algorithm(tiny_config("algo.name=grpo", "grpo.policy_loss=kl-cov", "grpo.kl_coef=0.1",
                                       "grpo.kl_cov_ratio=0.5", "train.ppo_epochs=2"))
    ref = LOGP - 0.3
    loss, stats = algo.token_loss(LOGP, OLD, ADV, MASK, ref)
    expected = kl_cov_loss(LOGP, OLD, ADV, MASK, 0.5, 1.0, 0.2, 0.2, None)[0]
    assert torch.allclose(loss, add_kl_penalty(expected, {}, LOGP, ref, MASK, 0.1)[0])
    assert set(stats) >= {"kl", "kl_cov_share"}
    dapo = build_algorithm(tiny_config("algo.name=dapo", "dapo.kl_coef=0.1"))
    assert not dapo.uses_reference and "kl" not in dapo.token_loss(LOGP, OLD, ADV, MASK, ref)[1]


def test_group_slices_walk_the_layout():
    assert group_slices(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert group_slices(0, 4) == []
