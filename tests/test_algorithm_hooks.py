"""Every hook of GRPO and DAPO on hand-built batches, with hand-computed expectations."""

import pytest
import torch

from algorithms import ALGORITHMS
from meds_cli.engine.training.algorithm_setup import build_algorithm
from meds_cli.core.errors import UserError
from tests.conftest import tiny_config
from tests.rollout_factory import make_rollouts


def algo(name, *overrides):
    return build_algorithm(tiny_config(f"algo.name={name}", *overrides))


def scored(algorithm, rollouts):
    rollouts.reward_components = algorithm.reward_components(rollouts)
    rollouts.rewards = sum(rollouts.reward_components.values())
    return rollouts


def test_registered_names():
    for name in ["grpo", "dapo"]:
        assert name in ALGORITHMS


def test_unknown_algorithm_names_the_nearest():
    with pytest.raises(UserError, match="did you mean 'dapo'"):
        algo("dapp")


def test_grpo_rewards_follow_reward_config():
    a = algo("grpo", "reward.wrong=-1")
    r = scored(a, make_rollouts([True, False, False, True], 2))
    assert r.rewards.tolist() == [1.0, -1.0, -1.0, 1.0]
    assert a.keep_groups(r).tolist() == [True, True]
    assert a.generation_rounds() == 1


def test_grpo_advantages_and_loss_agg():
    a = algo("grpo")
    r = scored(a, make_rollouts([True, False, True, True], 2))
    # group 1 [1, 0] -> +-0.707107; group 2 [1, 1] -> 0, 0
    assert a.compute_advantages(r).tolist() == pytest.approx([0.707107, -0.707107, 0.0, 0.0], abs=1e-5)
    assert a.loss_agg == "seq-mean-token-mean"
    assert not a.uses_reference
    assert algo("grpo", "grpo.kl_coef=0.1").uses_reference


def test_grpo_kl_term_is_added_per_token():
    a = algo("grpo", "grpo.kl_coef=0.5")
    logp = torch.zeros(1, 2)
    ref = torch.log(torch.tensor([[0.5, 1.0]]))
    loss, stats = a.token_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), ref)
    # A = 0: surrogate 0; kl(tok0) = exp(-ln2) + ln2 - 1 = 0.193147; kl(tok1) = 0
    assert loss.tolist()[0] == pytest.approx([0.5 * 0.193147, 0.0], abs=1e-6)
    assert stats["kl"].item() == pytest.approx(0.193147 / 2, abs=1e-6)


def test_dapo_defaults():
    a = algo("dapo")
    assert a.config.clip_low == 0.2 and a.config.clip_high == 0.28
    assert a.loss_agg == "token-mean"
    assert not a.uses_reference  # no KL term, even if kl_coef were set
    assert algo("dapo", "dapo.kl_coef=0.3").uses_reference is False
    assert a.generation_rounds() == 3


def test_dapo_dynamic_sampling_drops_equal_groups():
    a = algo("dapo")
    r = scored(a, make_rollouts([True, True, False, True, False, False], 2))
    assert a.keep_groups(r).tolist() == [False, True, False]
    kept = r.select_groups(a.keep_groups(r))
    assert kept.num_groups == 1 and kept.rewards.tolist() == [0.0, 1.0]


def test_dapo_all_groups_dropped_gives_empty_batch():
    a = algo("dapo")
    r = scored(a, make_rollouts([True, True, False, False], 2))
    kept = r.select_groups(a.keep_groups(r))
    assert kept.size == 0 and kept.num_groups == 0
    assert a.compute_advantages(kept).numel() == 0


def test_dapo_group_of_one_is_always_dropped():
    a = algo("dapo")  # keep_groups reads the group size off the rollouts (the config needs at least 2)
    r = scored(a, make_rollouts([True, False], 1))
    assert a.keep_groups(r).tolist() == [False, False]


def test_dapo_overlong_component_and_truncation_mask():
    a = algo("dapo", "rollout.max_new_tokens=10", "dapo.overlong_buffer=4", "dapo.mask_truncated=true")
    r = scored(a, make_rollouts([True, False], 2, lengths=[5, 10], truncated=[False, True], width=10))
    # expected length 10 - 4 = 6: L=5 -> 0; L=10 -> -(10 - 6) / 4 = -1
    assert r.reward_components["overlong"].tolist() == [0.0, -1.0]
    assert r.rewards.tolist() == [1.0, -1.0]
    mask = a.loss_mask(r)
    assert mask[0].sum().item() == 5 and mask[1].sum().item() == 0


def test_dapo_all_truncated_masked_loss_is_zero():
    from algorithms.policy_loss import agg_loss

    a = algo("dapo", "dapo.mask_truncated=true")
    r = scored(a, make_rollouts([True, False], 2, truncated=[True, True]))
    mask = a.loss_mask(r)
    loss, _ = a.token_loss(torch.zeros(2, 4), torch.zeros(2, 4), torch.tensor([1.0, -1.0]), mask)
    assert agg_loss(loss, mask, a.loss_agg).item() == 0.0


def test_base_cannot_be_a_shaping_method():
    if "meds" not in ALGORITHMS:
        pytest.skip("meds not registered yet")
    with pytest.raises(UserError, match="accepted bases"):
        build_algorithm(tiny_config("algo.name=meds", "algo.base=meds"))


def test_tis_weights_multiply_the_policy_gradient_term_and_not_the_kl():
    a = algo("grpo", "grpo.kl_coef=0.5")
    logp = torch.zeros(1, 2)
    ref = torch.log(torch.tensor([[0.5, 1.0]]))
    weights = torch.tensor([[0.25, 2.0]])
    loss, _ = a.token_loss(logp, logp, torch.tensor([1.0]), torch.ones(1, 2), ref, weights)
    # ratio 1, A = 1: surrogate -1 per token, times w; k3 (tok0) = exp(-ln2) + ln2 - 1 = 0.193147, unweighted
    assert loss.tolist()[0] == pytest.approx([-0.25 + 0.5 * 0.193147, -2.0], abs=1e-6)


def test_onbase_forwards_every_public_hook_of_algorithm():
    import inspect

    from algorithms.base import Algorithm, OnBase

    hooks = {name for name, value in vars(Algorithm).items()  # methods and properties; not config_class
             if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))}
    assert {"forward_needs", "observe_probe", "token_loss", "shape_rewards"} <= hooks  # the scan finds hooks
    assert sorted(hooks - set(vars(OnBase))) == []


def test_onbase_hands_the_lens_probe_hooks_to_its_base():
    from algorithms.base import OnBase
    from meds_cli.core.forward import ForwardNeeds, LensProbe

    class Recording(type(algo("grpo"))):
        def forward_needs(self, num_layers, records_lens):
            return ForwardNeeds(lens=LensProbe((num_layers,), False))

        def observe_probe(self, rollouts, tokenizer):
            self.seen = (rollouts, tokenizer)

    base = Recording(algo("grpo").config, algo("grpo").context)
    shaping = OnBase(algo("grpo").config, algo("grpo").context, base)
    assert shaping.forward_needs(4, records_lens=True).lens == LensProbe((4,), False)
    shaping.observe_probe("batch", "tokenizer")
    assert base.seen == ("batch", "tokenizer")


def test_forward_needs_merge_keeps_the_earliest_view_and_every_need():
    from meds_cli.core.forward import ForwardNeeds, LensProbe

    probe = LensProbe((1, 4), True)
    assert ForwardNeeds().merged(ForwardNeeds()) == ForwardNeeds()
    assert ForwardNeeds(view="shaping").merged(ForwardNeeds(view="rewards")).view == "rewards"
    assert ForwardNeeds(view="rewards").merged(ForwardNeeds(view="shaping")).view == "rewards"
    assert ForwardNeeds(view=None).merged(ForwardNeeds(view="shaping")).view == "shaping"
    both = ForwardNeeds(hidden_states=True).merged(ForwardNeeds(lens=probe))
    assert both == ForwardNeeds(None, True, probe)
    assert ForwardNeeds(lens=probe).merged(ForwardNeeds(lens=probe)).lens == probe
    with pytest.raises(ValueError, match="two different"):
        ForwardNeeds(lens=probe).merged(ForwardNeeds(lens=LensProbe((2,), True)))
    with pytest.raises(ValueError, match="accepted"):
        ForwardNeeds(view="later")


def test_forward_needs_of_each_algorithm():
    """GRPO and DAPO read nothing beyond the update; RLIF reads the pass at reward time; MEDS reads
    lens values from an engine that records them, else the pass's hidden states at shaping time."""
    from meds_cli.core.forward import ForwardNeeds, LensProbe

    assert algo("grpo").forward_needs(4, records_lens=True) == ForwardNeeds()
    assert algo("dapo").forward_needs(4, records_lens=False) == ForwardNeeds()
    assert algo("rlif-multireward").forward_needs(4, records_lens=True) == ForwardNeeds(view="rewards")
    assert algo("meds").forward_needs(4, records_lens=False) == ForwardNeeds(view="shaping", hidden_states=True)
    needs = algo("meds").forward_needs(4, records_lens=True)
    assert needs.view is None and not needs.hidden_states and isinstance(needs.lens, LensProbe)
