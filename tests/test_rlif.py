"""Multi-reward RLIF (algorithms/rlif_multireward.py): each formula with hand-computed numbers,
the hooks on a hand-built batch, proof that training reads no gold answer, a short training run
of the tiny model, and one real step of SmolLM2 (slow)."""

import math
import warnings
from pathlib import Path

import pytest
import torch

from algorithms.policy_loss import kl_cov_loss, kl_cov_select
from algorithms.rlif_multireward import cluster_vote_rewards, gdpo_advantages, read_answer, self_certainty
from meds_cli.core.errors import UserError
from meds_cli.core.forward import ForwardView
from meds_cli.core.records import Problem, Verdict
from meds_cli.core.rollouts import Rollouts
from meds_cli.engine.training.algorithm_setup import build_algorithm
from tests.conftest import needs_embedded, tiny_config

LN2, LN3 = math.log(2), math.log(3)


def rlif(*overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_algorithm(tiny_config("algo.name=rlif-multireward", *overrides))


# ---------------------------------------------------------------- the formulas


def test_self_certainty_on_known_logits():
    # token [0, 0]: logsumexp = ln2, mean = 0 -> ln2 = 0.693147 (uniform: KL(U||p) = 0, + log V = ln2)
    # token [ln3, 0]: logsumexp = ln4, mean = ln3 / 2 -> 1.386294 - 0.549306 = 0.836988
    logits = torch.tensor([[[0.0, 0.0], [LN3, 0.0]], [[0.0, 0.0], [LN3, 0.0]]])
    values = self_certainty(logits, torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    # row 0: mean of both = 0.765068; row 1: the second token is padding -> 0.693147
    assert values.tolist() == pytest.approx([0.765068, 0.693147], abs=1e-6)
    # the identity of algorithms.md: KL(U || p) + log V
    p = torch.softmax(torch.tensor([LN3, 0.0]), -1)
    kl_uniform = (0.5 * torch.log(0.5 / p)).sum().item()
    assert kl_uniform + LN2 == pytest.approx(0.836988, abs=1e-6)


def test_self_certainty_at_a_temperature_by_hand():
    # One token, logits z = [2, 0, 0] (V = 3); self-certainty at T is logsumexp(z / T) - mean(z / T):
    # T = 1:   ln(e^2 + 2) - 2/3 = ln 9.389056 - 0.666667 = 2.239545 - 0.666667 = 1.572878
    # T = 2:   ln(e + 2) - 1/3   = ln 4.718282 - 0.333333 = 1.551445 - 0.333333 = 1.218111
    # T = 0.5: ln(e^4 + 2) - 4/3 = ln 56.598150 - 1.333333 = 4.035976 - 1.333333 = 2.702643
    logits = torch.tensor([[[2.0, 0.0, 0.0]]])
    mask = torch.ones(1, 1)
    assert self_certainty(logits, mask).item() == pytest.approx(1.572878, abs=1e-6)
    assert self_certainty(logits, mask, 2.0).item() == pytest.approx(1.218111, abs=1e-6)
    assert self_certainty(logits, mask, 0.5).item() == pytest.approx(2.702643, abs=1e-6)
    # T = 2 is KL(U || softmax(z / 2)) + ln 3: p = (e, 1, 1) / (e + 2) = 0.576117, 0.211942, 0.211942;
    # (1/3) (ln(0.333333 / 0.576117) + 2 ln(0.333333 / 0.211942)) = (1/3)(-0.547168 + 0.905665) = 0.119499,
    # + ln 3 = 1.098612 -> 1.218111
    p = torch.softmax(torch.tensor([1.0, 0.0, 0.0]), -1)
    assert (((1 / 3) * torch.log((1 / 3) / p)).sum() + math.log(3)).item() == pytest.approx(1.218111, abs=1e-6)


def test_certainty_temperature_follows_the_sampler_by_default():
    # rollout.temperature 0.5 and certainty_temperature unset (0): the channel is taken at 0.5, so a
    # row whose one token has logits [2, 0, 0] scores 2.702643 (above); set to 1 it scores 1.572878.
    r = arithmetic_batch(["\\boxed{6}", "\\boxed{6}", "\\boxed{7}", "no idea"])
    r.response_mask = torch.tensor([[1.0, 0.0]] * 4)
    logits = torch.zeros(4, 2, 3)
    logits[:, 0, 0] = 2.0
    for overrides, expected in [(["rollout.temperature=0.5"], 2.702643),
                                (["rollout.temperature=0.5", "rlif-multireward.certainty_temperature=1"], 1.572878),
                                (["rollout.temperature=2"], 1.218111)]:
        a = rlif("task.name=arithmetic", "train.ppo_epochs=2", *overrides)
        a.observe_forward(r, ForwardView(rows=slice(0, 4), logits=logits, hidden_states=None, model=None))
        assert r.extras.pop("self_certainty").tolist() == pytest.approx([expected] * 4, abs=1e-6)
    with pytest.raises(UserError, match="certainty_temperature"):
        rlif("rlif-multireward.certainty_temperature=-1")


def test_cluster_vote_rewards():
    # G = 4, clusters {0, 1}, {2}, no answer -> 2/4, 2/4, 1/4, 0
    assert cluster_vote_rewards([0, 0, 1, None], 4).tolist() == [0.5, 0.5, 0.25, 0.0]


def test_gdpo_normalizes_each_channel_in_its_group():
    # group 1: cluster [1, 0] -> z = +-0.5 / 0.707107 = +-0.707107; certainty [3, 1] -> +-1 / 1.414214 = +-0.707107
    # group 2: cluster [0.5, 0.5] -> z = 0 (no spread); certainty [1, 2] -> -0.707107, +0.707107
    # weights (1, 2): A = 0.707107 + 1.414214 = 2.121320, -2.121320, -1.414214, 1.414214
    cluster = torch.tensor([1.0, 0.0, 0.5, 0.5])
    certainty = torch.tensor([3.0, 1.0, 1.0, 2.0])
    adv = gdpo_advantages([cluster, certainty], [1.0, 2.0], 2)
    assert adv.tolist() == pytest.approx([2.121320, -2.121320, -1.414214, 1.414214], abs=1e-5)
    # the scale of a channel does not matter (x1000 certainty: the same z-scores)
    assert gdpo_advantages([cluster, certainty * 1000], [1.0, 2.0], 2).tolist() == pytest.approx(adv.tolist(), abs=1e-5)
    # batch re-normalization: mean 0, unbiased std sqrt((2 * 4.5 + 2 * 2) / 3) = 2.081666
    # -> 1.019049, -1.019049, -0.679366, 0.679366
    renorm = gdpo_advantages([cluster, certainty], [1.0, 2.0], 2, batch_norm=True)
    assert renorm.tolist() == pytest.approx([1.019049, -1.019049, -0.679366, 0.679366], abs=1e-5)


def _kl_cov_case():
    # row 0: A = +1, logp -1 -2 -3 (3 valid); row 1: A = -1, logp -1 -2 (2 valid)
    adv = torch.tensor([1.0, -1.0])
    logp = torch.tensor([[-1.0, -2.0, -3.0, 0.0], [-1.0, -2.0, -3.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    return adv, logp, mask


def test_kl_cov_selection_by_hand():
    # over the 5 valid tokens: mean A = (3 - 2) / 5 = 0.2, mean logp = -9 / 5 = -1.8
    # cov: row 0: 0.8 * 0.8 = 0.64, 0.8 * -0.2 = -0.16, 0.8 * -1.2 = -0.96
    #      row 1: -1.2 * 0.8 = -0.96, -1.2 * -0.2 = 0.24
    adv, logp, mask = _kl_cov_case()
    # ratio 0.0002: floor(5 * 0.0002) = 0 -> at least one token: the top one, (0, 0)
    assert kl_cov_select(adv, logp, mask, 0.0002).nonzero().tolist() == [[0, 0]]
    # ratio 0.4: floor(2.0) = 2 tokens: (0, 0) with 0.64 and (1, 1) with 0.24
    assert kl_cov_select(adv, logp, mask, 0.4).nonzero().tolist() == [[0, 0], [1, 1]]
    # padding never selected, even at ratio 1; nothing valid -> nothing selected
    assert kl_cov_select(adv, logp, mask, 1.0).sum() == 5
    assert kl_cov_select(adv, logp, torch.zeros_like(mask), 0.5).sum() == 0


def test_kl_cov_loss_by_hand():
    adv, logp, mask = _kl_cov_case()
    old = logp.clone()
    old[0, 0] = -1.5  # token (0, 0): ratio = e^0.5 = 1.648721
    loss, stats = kl_cov_loss(logp, old, adv, mask, 0.0002, 1.0)
    # (0, 0) is selected: -A * ratio + 1 * |logp - old| = -1.648721 + 0.5 = -1.148721
    # (the clipped surrogate would give max(-1.648721, -1.2) = -1.2)
    # the rest, ratio 1: -A = -1 on row 0, +1 on row 1
    assert loss[0, :3].tolist() == pytest.approx([-1.148721, -1.0, -1.0], abs=1e-6)
    assert loss[1, :2].tolist() == pytest.approx([1.0, 1.0])
    assert stats["kl_cov_share"].item() == pytest.approx(1 / 5)


def test_kl_cov_penalty_is_inert_on_policy():
    # ratio == 1: |logp - old_logp| = 0 and its gradient too, so the loss and its gradient equal
    # the plain surrogate's (hence the warning for ppo_epochs = 1 with one mini-batch)
    adv, logp, mask = _kl_cov_case()
    a = logp.clone().requires_grad_()
    b = logp.clone().requires_grad_()
    with_cov, _ = kl_cov_loss(a, logp, adv, mask, 1.0, 1.0)
    plain, _ = kl_cov_loss(b, logp, adv, mask, 0.0, 1.0)
    (with_cov * mask).sum().backward()
    (plain * mask).sum().backward()
    assert torch.equal(a.grad, b.grad)


def test_warns_when_kl_cov_cannot_act():
    with pytest.warns(UserWarning, match="KL-Cov penalty"):
        build_algorithm(tiny_config("algo.name=rlif-multireward"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_algorithm(tiny_config("algo.name=rlif-multireward", "train.ppo_epochs=2"))
        build_algorithm(tiny_config("algo.name=rlif-multireward", "train.mini_batch_size=64"))


def test_read_answer_modes():
    assert read_answer("so \\boxed{12}", "boxed") == "12"
    assert read_answer("it is 12, then 13.", "boxed_or_last_integer") == "13"
    assert read_answer("it is 12", "boxed") is None
    assert read_answer("7=", "first_char") == "7" and read_answer("", "first_char") is None
    assert rlif().extraction == "first_char"  # auto on the copy task
    assert rlif("task.name=arithmetic").extraction == "boxed_or_last_integer"


# ---------------------------------------------------------------- the hooks


def arithmetic_batch(texts, gold="6"):
    size = len(texts)
    return Rollouts(
        problems=[Problem(id="p0", question="What is 2 * 3?", answer=gold)], group_size=size,
        input_ids=torch.zeros(size, 4, dtype=torch.long), attention_mask=torch.ones(size, 4, dtype=torch.long),
        prompt_width=2, response_ids=torch.zeros(size, 2, dtype=torch.long),
        response_mask=torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]),
        response_texts=texts, truncated=torch.zeros(size, dtype=torch.bool),
    )


def test_rewards_from_texts_and_the_sampling_pass_only():
    a = rlif("task.name=arithmetic", "train.ppo_epochs=2")
    r = arithmetic_batch(["\\boxed{6}", "I think 6", "\\boxed{7}", "no idea"])
    # logits: all tokens [0, 0] (ln2) except row 1, token 1: [ln3, 0] (0.836988)
    logits = torch.zeros(4, 2, 2)
    logits[1, 1] = torch.tensor([LN3, 0.0])
    a.observe_forward(r, ForwardView(rows=slice(0, 2), logits=logits[:2], hidden_states=None, model=None))
    a.observe_forward(r, ForwardView(rows=slice(2, 4), logits=logits[2:], hidden_states=None, model=None))
    comps = a.reward_components(r)  # r.verdicts is empty: rewards never need the grader
    # answers 6, 6, 7, none -> 2/4, 2/4, 1/4, 0
    assert comps["cluster"].tolist() == [0.5, 0.5, 0.25, 0.0]
    assert comps["certainty"].tolist() == pytest.approx([LN2, (LN2 + 0.836988) / 2, LN2, LN2], abs=1e-6)
    r.reward_components = comps
    r.rewards = sum(comps.values())
    adv = a.compute_advantages(r)
    expected = gdpo_advantages([comps["cluster"], comps["certainty"]], [1.0, 1.0], 4)
    assert torch.allclose(adv, expected)
    # diagnostics: the majority cluster (answer 6) is correct per the verdicts
    r.verdicts = [Verdict(True, "6", "correct"), Verdict(True, "6", "correct"), Verdict(False, "7", "wrong"),
                  Verdict(False, None, "no_answer")]
    metrics = a.step_metrics(r)
    assert metrics["rlif/majority_agrees_gold"] == 1.0
    assert metrics["rlif/cluster_mean"] == pytest.approx(0.3125)


# ---------------------------------------------------------------- training


def _run(tmp_path, steps, *overrides, garbage_gold=False):
    from meds_cli.engine.trainer import Trainer

    cfg = tiny_config("algo.name=rlif-multireward", "model.lora.enabled=false", "optim.lr=0.003",
                      f"train.steps={steps}", "train.ppo_epochs=2", *overrides, output_dir=tmp_path)
    trainer = Trainer(cfg, tmp_path)
    if garbage_gold:
        for problem in trainer.task.train + trainer.task.held_out:
            problem.answer = "garbage"
    seen = []
    original = trainer.algorithm.on_step_end

    def record(batch, step):
        seen.append({"rewards": batch.rewards.clone(), "advantages": batch.advantages.clone(),
                     **{k: v.clone() for k, v in batch.reward_components.items()}})
        original(batch, step)

    trainer.algorithm.on_step_end = record
    rows = [trainer.train_step() for _ in range(steps)]
    weights = {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters()}
    return rows, seen, weights


def test_training_reads_no_gold_answer(tmp_path):
    # two steps of the default tiny batch (8 x 16), two PPO epochs so that KL-Cov acts
    rows, seen, weights = _run(tmp_path / "gold", 2, "rlif-multireward.kl_cov_ratio=0.02")
    rows_g, seen_g, weights_g = _run(tmp_path / "garbage", 2, "rlif-multireward.kl_cov_ratio=0.02", garbage_gold=True)
    assert len(seen) == len(seen_g) == 2
    for a, b in zip(seen, seen_g):
        for key in a:
            assert torch.equal(a[key], b[key]), key
    for name in weights:
        assert torch.equal(weights[name], weights_g[name]), name
    assert [r["loss"] for r in rows] == [r["loss"] for r in rows_g]
    # ... while the diagnostics do read gold: nothing is ever right against 'garbage'
    assert all(r["accuracy"] == 0 and r["rlif/majority_agrees_gold"] == 0 for r in rows_g)
    assert any(r["accuracy"] > 0 for r in rows)
    assert all(r["kl_cov_share"] > 0 for r in rows)


def test_tiny_model_trains_stably_with_rlif(tmp_path):
    rows, seen, weights = _run(tmp_path, 12)
    for r in rows:
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])
        assert 0.0 <= r["rlif/cluster_mean"] <= 1.0 and math.isfinite(r["rlif/certainty_mean"])
    assert all(torch.isfinite(s["advantages"]).all() for s in seen)
    assert all(torch.isfinite(w).all() for w in weights.values())
    # no gold in training: consensus (the cluster reward) rises on the copy task
    assert sum(r["rlif/cluster_mean"] for r in rows[-3:]) >= sum(r["rlif/cluster_mean"] for r in rows[:3])


@pytest.mark.slow
@needs_embedded
def test_one_real_step_on_smollm2(tmp_path):
    from meds_cli.engine.trainer import Trainer

    cfg = tiny_config("model.name=smollm2-135m", "task.name=arithmetic", "algo.name=rlif-multireward",
                      "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=32",
                      "rollout.hf.generation_batch_size=8", "train.micro_batch_size=4", "train.steps=1",
                      "train.ppo_epochs=2", output_dir=tmp_path)
    row = Trainer(cfg, tmp_path).train_step()
    assert math.isfinite(row["loss"]) and math.isfinite(row["rlif/certainty_mean"])
    assert row["kl_cov_share"] > 0


def test_example_config_loads():
    from meds_cli.engine.config import load_config

    cfg = load_config([str(Path(__file__).resolve().parent.parent / "configs" / "rlif_smollm2.yaml")])
    assert cfg.algo.name == "rlif-multireward" and cfg.section("rlif-multireward").kl_cov_ratio == 0.02
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # two PPO epochs: KL-Cov acts, no warning
        build_algorithm(cfg)
