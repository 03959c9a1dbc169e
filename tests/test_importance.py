"""Truncated importance sampling and the sampler/trainer mismatch metrics, by hand."""

import math

import pytest
import torch

from meds_cli.engine.training.importance import decoupled_weights, is_correction_weights, mismatch_metrics, tis_weights


def test_tis_weights_are_the_capped_probability_ratio():
    trainer = torch.tensor([[-1.0, -2.0, -0.5]])
    sampler = torch.tensor([[-1.5, -1.0, -0.5]])
    # ratios e^0.5 = 1.6487, e^-1 = 0.3679, e^0 = 1
    assert tis_weights(trainer, sampler, cap=2.0).tolist()[0] == pytest.approx([1.6487213, 0.3678794, 1.0], rel=1e-6)
    assert tis_weights(trainer, sampler, cap=1.5).tolist()[0] == pytest.approx([1.5, 0.3678794, 1.0], rel=1e-6)


def test_tis_weights_carry_no_gradient():
    trainer = torch.tensor([-1.0, -2.0], requires_grad=True)
    assert not tis_weights(trainer, torch.tensor([-1.0, -1.0]), 2.0).requires_grad


def test_correction_none_or_without_sampler_logprobs_is_no_factor():
    t = torch.zeros(2, 3)
    assert is_correction_weights("none", t, t, 2.0) is None
    assert is_correction_weights("tis", t, None, 2.0) is None
    assert torch.equal(is_correction_weights("tis", t, t - math.log(2), 1.5), torch.full((2, 3), 1.5))


def test_decoupled_weights_are_the_ratio_and_zero_above_the_cap():
    trainer = torch.tensor([[-1.0, -2.0, -0.5, -0.2]])
    sampler = torch.tensor([[-1.5, -1.0, -0.5, -1.2]])
    # ratios e^0.5 = 1.6487, e^-1 = 0.3679, e^0 = 1, e^1 = 2.7183: under cap 2 the last is left out
    # (AReaL's behav_imp_weight_cap), where TIS would keep it at 2
    assert decoupled_weights(trainer, sampler, cap=2.0).tolist()[0] == pytest.approx(
        [1.6487213, 0.3678794, 1.0, 0.0], rel=1e-6)
    assert decoupled_weights(trainer, sampler, cap=1.5).tolist()[0] == pytest.approx(
        [0.0, 0.3678794, 1.0, 0.0], rel=1e-6)
    assert tis_weights(trainer, sampler, cap=2.0).tolist()[0][3] == pytest.approx(2.0)
    assert not decoupled_weights(trainer.requires_grad_(), sampler, 2.0).requires_grad
    by_mode = is_correction_weights("decoupled", trainer, sampler, 2.0)
    assert torch.equal(by_mode, decoupled_weights(trainer, sampler, 2.0))
    assert is_correction_weights("decoupled", trainer, None, 2.0) is None


def test_the_decoupled_loss_by_hand_clips_against_the_proximal_policy():
    """GRPO's token loss with decoupled weights: the ratio and the clip against pi_old (proximal),
    the behaviour weight pi_old / pi_sampler outside the clip, as AReaL's eq. 5."""
    from meds_cli.engine.training.algorithm_setup import build_algorithm
    from tests.conftest import tiny_config

    algo = build_algorithm(tiny_config("algo.name=grpo", "grpo.kl_coef=0", "grpo.clip_high=0.2"))
    old = torch.tensor([[-1.0, -1.0]])
    logp = old + torch.tensor([[0.5, -0.1]])  # ratios e^0.5 = 1.6487 (clipped at 1.2 for A > 0), e^-0.1
    sampler = torch.tensor([[-1.2, -0.0]])  # behaviour weights e^0.2 = 1.2214, e^-1 = 0.3679
    advantages = torch.tensor([1.0])
    weights = is_correction_weights("decoupled", old, sampler, 2.0)
    loss, _ = algo.token_loss(logp, old, advantages, torch.ones(1, 2), None, weights)
    expected = [-min(math.exp(0.5), 1.2) * math.exp(0.2), -math.exp(-0.1) * math.exp(-1.0)]
    assert loss.tolist()[0] == pytest.approx(expected, rel=1e-6)


def test_mismatch_metrics_by_hand_ignore_masked_tokens():
    trainer = torch.tensor([[-1.0, -2.0, -7.0]])
    sampler = torch.tensor([[-1.5, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding: its huge gap must not count
    m = mismatch_metrics(trainer, sampler, mask, cap=1.5)
    # d = [0.5, -1.0]
    assert m["mismatch/logp_abs_diff"] == pytest.approx(0.75)
    assert m["mismatch/kl_k1"] == pytest.approx((-0.5 + 1.0) / 2)
    k3 = ((math.exp(0.5) - 1 - 0.5) + (math.exp(-1.0) - 1 + 1.0)) / 2  # 0.25830
    assert m["mismatch/kl_k3"] == pytest.approx(k3, rel=1e-6)
    assert m["mismatch/tis_capped"] == pytest.approx(0.5)  # e^0.5 = 1.65 > 1.5; e^-1 is not


def test_mismatch_metrics_of_identical_samplers_are_zero_and_empty_masks_give_nothing():
    logp = torch.tensor([[-0.3, -2.0]])
    m = mismatch_metrics(logp, logp.clone(), torch.ones(1, 2))
    assert m == {"mismatch/logp_abs_diff": 0.0, "mismatch/kl_k1": 0.0, "mismatch/kl_k3": 0.0}
    assert mismatch_metrics(logp, logp, torch.zeros(1, 2)) == {}


def test_truncation_of_sampler_names_the_settings_that_truncate():
    from meds_cli.engine.training.importance import truncation_of_sampler

    assert truncation_of_sampler(1.0, 0) is None
    assert truncation_of_sampler(0.7, 0) == "top_p=0.7 samples from the nucleus only"
    assert truncation_of_sampler(1.0, 2) == "min_new_tokens=2 holds the stop tokens back"
    assert truncation_of_sampler(0.9, 1).count(";") == 1


@pytest.mark.parametrize("mode", ["tis", "decoupled"])
@pytest.mark.parametrize("override, named", [("rollout.top_p=0.7", "top_p=0.7"),
                                             ("rollout.min_new_tokens=2", "min_new_tokens=2")])
def test_a_correction_under_truncated_sampling_is_refused_at_load(override, named, mode):
    from meds_cli.core.errors import UserError
    from tests.conftest import tiny_config

    with pytest.raises(UserError, match=f"rollout.is_correction={mode} .* but rollout.{named}"):
        tiny_config(f"rollout.is_correction={mode}", override)
    assert tiny_config("rollout.is_correction=none", override).rollout.is_correction == "none"


def test_stale_rollouts_train_under_the_decoupled_objective(tmp_path):
    """hf-worker at k = 1: every step after the first trains on one-version-old rollouts, so the
    behaviour weights differ from 1; with a cap no weight reaches, decoupled and TIS weigh alike
    (same weights after 3 steps), and with a cap inside the weights' range they differ (TIS keeps a
    capped token, the decoupled objective leaves it out)."""
    from meds_cli.engine.trainer import Trainer
    from tests.conftest import tiny_config

    def run(mode: str, cap: float, name: str):
        # the copy task's 8 x 16 samples: some right by chance at the first step (about 1 in 53), so
        # every step has a gradient and the weights move
        cfg = tiny_config("rollout.engine=hf-worker", "rollout.max_staleness=1", "train.steps=3", "optim.lr=0.05",
                          f"rollout.is_correction={mode}",
                          f"rollout.tis_cap={cap}", output_dir=tmp_path / name)
        trainer = Trainer(cfg, tmp_path / name)
        try:
            rows = [trainer.train_step() for _ in range(3)]
            return rows, [p.detach().clone() for p in trainer.unwrapped.parameters() if p.requires_grad]
        finally:
            trainer.close()

    rows, tis_wide = run("tis", 1e9, "tis-wide")
    # stale: the sampler's policy is not the trainer's
    assert rows[1]["grad_norm"] > 0 and rows[1]["mismatch/logp_abs_diff"] > 0
    _, decoupled_wide = run("decoupled", 1e9, "decoupled-wide")
    assert all(torch.equal(a, b) for a, b in zip(tis_wide, decoupled_wide))
    capped_rows, tis_capped = run("tis", 1.1, "tis-capped")
    assert capped_rows[1]["mismatch/tis_capped"] > 0
    _, decoupled_capped = run("decoupled", 1.1, "decoupled-capped")
    assert not all(torch.equal(a, b) for a, b in zip(tis_capped, decoupled_capped))
