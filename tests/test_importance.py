"""Truncated importance sampling and the sampler/trainer mismatch metrics, by hand."""

import math

import pytest
import torch

from meds_cli.engine.training.importance import is_correction_weights, mismatch_metrics, tis_weights


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


@pytest.mark.parametrize("override, named", [("rollout.top_p=0.7", "top_p=0.7"),
                                             ("rollout.min_new_tokens=2", "min_new_tokens=2")])
def test_tis_under_truncated_sampling_is_refused_at_load(override, named):
    from meds_cli.core.errors import UserError
    from tests.conftest import tiny_config

    with pytest.raises(UserError, match=f"rollout.is_correction=tis .* but rollout.{named}"):
        tiny_config("rollout.is_correction=tis", override)
    assert tiny_config("rollout.is_correction=none", override).rollout.is_correction == "none"
