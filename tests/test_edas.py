"""EDAS (algorithms/edas.py): each formula with hand-computed numbers, the hooks on hand-built
batches, a short training run of the tiny model, and one real step of SmolLM2 (slow)."""

import math
import random
from pathlib import Path

import pytest
import torch

from algorithms.edas import (
    diversity_delta,
    edas_advantages,
    error_classes,
    error_entropy_terms,
    sign_keeping_clip,
    warmup_factor,
)
from meds_cli.core.errors import UserError
from meds_cli.core.records import Problem, Verdict
from meds_cli.core.rollouts import Rollouts
from meds_cli.engine.training.algorithm_setup import build_algorithm
from tests.conftest import needs_embedded, tiny_config

LN2 = math.log(2)


def batch(verdicts: list[Verdict], group_size: int) -> Rollouts:
    """A hand-built batch: only the verdicts matter to EDAS (responses of 3 tokens each)."""
    size = len(verdicts)
    return Rollouts(
        problems=[Problem(id=f"p{g}", question="q", answer="1") for g in range(size // group_size)],
        group_size=group_size, input_ids=torch.zeros(size, 5, dtype=torch.long),
        attention_mask=torch.ones(size, 5, dtype=torch.long), prompt_width=2,
        response_ids=torch.zeros(size, 3, dtype=torch.long), response_mask=torch.ones(size, 3),
        response_texts=[""] * size, truncated=torch.zeros(size, dtype=torch.bool), verdicts=verdicts,
    )


def right(answer="1"):
    return Verdict(True, answer, "correct")


def wrong(answer):
    return Verdict(False, answer, "wrong" if answer is not None else "no_answer")


def edas(*overrides):
    return build_algorithm(tiny_config("algo.name=edas", "edas.equivalence=key", *overrides))


# ---------------------------------------------------------------- the formulas


def test_surprisal_and_entropy():
    # labels a a b c: p = 1/2, 1/4, 1/4; I = ln2, ln2, ln4, ln4; H = 1/2 ln2 + 2 * 1/4 ln4 = 1.5 ln2
    surprisal, entropy = error_entropy_terms(["a", "a", "b", "c"])
    assert surprisal == pytest.approx([LN2, LN2, 2 * LN2, 2 * LN2])
    assert entropy == pytest.approx(1.5 * LN2)


def test_case_few_errors_gives_zero():
    # N_w <= 1: nothing to compare
    assert diversity_delta([], [], 0.2, 0.2) == ([], "none")
    assert diversity_delta(["a"], [0.7], 0.2, 0.2) == ([0.0], "none")


def test_case_single_class_shifts_by_minus_beta_s():
    # K = 1, |A| = 0.5, 0.5, 0.5 -> S = 0.5; Delta = -0.2 * 0.5 = -0.1 each
    delta, case = diversity_delta(["x", "x", "x"], [0.5, 0.5, 0.5], 0.2, 0.2)
    assert case == "single" and delta == pytest.approx([-0.1, -0.1, -0.1])


def test_case_diverse_redistributes():
    # labels a a b c, |A| = 1 each -> S = 1; ln N_w = ln4 = 2 ln2
    # Delta_a = 0.2 * 1 * (ln2 - 1.5 ln2) / (2 ln2) = 0.2 * (-0.25) = -0.05
    # Delta_b = Delta_c = 0.2 * (2 ln2 - 1.5 ln2) / (2 ln2) = +0.05: the rare errors are penalised less
    delta, case = diversity_delta(["a", "a", "b", "c"], [1, 1, 1, 1], 0.2, 0.2)
    assert case == "diverse" and delta == pytest.approx([-0.05, -0.05, 0.05, 0.05])
    # labels a a a b, |A| = 2 each -> S = 2: I_a = -ln(3/4) = 0.287682, I_b = ln4 = 1.386294,
    # H = 0.75 * 0.287682 + 0.25 * 1.386294 = 0.562335;
    # Delta_a = 0.2 * 2 * (0.287682 - 0.562335) / 1.386294 = -0.079248, Delta_b = 0.4 * 0.823959 / 1.386294 = 0.237744
    delta, _ = diversity_delta(["a", "a", "a", "b"], [2, 2, 2, 2], 0.2, 0.2)
    assert delta == pytest.approx([-0.079248, -0.079248, -0.079248, 0.237744], abs=1e-6)


def test_diverse_deltas_are_zero_sum_before_clipping():
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(2, 16)
        labels = [rng.randint(0, rng.randint(1, 5)) for _ in range(n)]
        if len(set(labels)) < 2:
            continue
        delta, case = diversity_delta(labels, [rng.random() for _ in range(n)], 0.3, 0.2)
        assert case == "diverse" and sum(delta) == pytest.approx(0.0, abs=1e-9)


def test_sign_keeping_clip_by_hand():
    # A = -1, Delta = -0.3: |Delta| < |A|/2 = 0.5 -> -1.3, not clipped
    # A = -0.1, Delta = +0.3: limit 0.05 -> -0.05, clipped (a rare error is never rewarded)
    # A = -0.4, Delta = -0.5: limit 0.2 -> -0.6, clipped
    # A = 0 (a group with no spread): limit 0 -> unchanged
    new, clipped = sign_keeping_clip(torch.tensor([-1.0, -0.1, -0.4, 0.0]), torch.tensor([-0.3, 0.3, -0.5, 0.2]), 2.0)
    assert new.tolist() == pytest.approx([-1.3, -0.05, -0.6, 0.0])
    assert clipped.tolist() == [False, True, True, True]


def test_sign_never_flips():
    gen = torch.Generator().manual_seed(0)
    for kappa in (1.01, 2.0, 5.0):
        adv = torch.randn(1000, generator=gen) * 2
        delta = torch.randn(1000, generator=gen) * 10  # far larger than the advantages
        new, _ = sign_keeping_clip(adv, delta, kappa)
        assert torch.equal(torch.sign(new), torch.sign(adv))


def test_edas_advantages_touch_only_wrong_rows():
    # one group of 6: A given; rows 2..5 wrong with classes a a b c and |A| = 1 -> Deltas -0.05 -0.05 +0.05 +0.05
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0, -1.0])
    is_wrong = torch.tensor([False, False, True, True, True, True])
    new, facts = edas_advantages(adv, is_wrong, [None, None, "a", "a", "b", "c"], 6, 0.2, 0.2, 2.0)
    assert new.tolist() == pytest.approx([1.0, 1.0, -1.05, -1.05, -0.95, -0.95])
    assert facts["cases"] == ["diverse"] and facts["classes"] == [3]


def test_warmup_factor():
    # linear over 4 steps: 1/4, 2/4, ..., then 1; no warm-up: 1
    assert [warmup_factor(s, 4) for s in (1, 2, 4, 9)] == [0.25, 0.5, 1.0, 1.0]
    assert warmup_factor(1, 0) == 1.0


# ---------------------------------------------------------------- error classes


def test_math_error_classes_use_grader_equality_and_no_answer_class():
    verdicts = [right(), wrong("1/2"), wrong("0.5"), wrong("3"), wrong(None), wrong(None)]
    labels = error_classes(verdicts, "grader", 6)  # numbers: settled by value, no worker needed
    assert labels[0] is None
    assert labels[1] == labels[2] != labels[3]
    assert labels[4] == labels[5] == "no_answer"


def test_code_error_classes_are_outcomes():
    verdicts = [Verdict(True, "x", "passed"), Verdict(False, "x", "WrongAnswer"), Verdict(False, "y", "TypeError"),
                Verdict(False, "z", "WrongAnswer"), Verdict(False, "w", "Timeout")]
    labels = error_classes(verdicts, "grader", 5)
    assert labels[0] is None
    assert labels[1] == labels[3] == ("outcome", "WrongAnswer")
    assert len({labels[1], labels[2], labels[4]}) == 3


# ---------------------------------------------------------------- the hooks


def test_edas_on_grpo_by_hand():
    a = edas("algo.base=grpo")
    r = batch([right(), right(), wrong("5"), wrong("5"), wrong("5"), wrong("7")], 6)
    r.reward_components = a.reward_components(r)
    r.rewards = sum(r.reward_components.values())
    # GRPO: rewards 1 1 0 0 0 0, mean 1/3, unbiased std sqrt((2 (2/3)^2 + 4 (1/3)^2) / 5) = 0.516398
    # A_right = 0.666667 / 0.516398 = 1.290994, A_wrong = -0.645497 = -S
    # classes 5 5 5 7: Delta = S * (-0.039624, ..., +0.118872) = -0.025577 (x3), +0.076732
    # limit |A|/2 = 0.322749: no clip -> -0.671074 (x3), -0.568766
    adv = a.compute_advantages(r)
    assert adv.tolist() == pytest.approx([1.290994, 1.290994, -0.671074, -0.671074, -0.671074, -0.568766], abs=1e-5)
    metrics = a.step_metrics(r)
    assert metrics["edas/classes_mean"] == 2 and metrics["edas/case_diverse_share"] == 1.0
    assert metrics["edas/delta_abs_mean"] == pytest.approx((3 * 0.025577 + 0.076732) / 4, abs=1e-5)
    assert metrics["edas/clipped_share"] == 0.0


def test_edas_single_class_with_warmup_and_resume():
    a = edas("algo.base=grpo", "edas.warmup_steps=2")
    r = batch([right(), wrong("4"), wrong("4"), wrong("4")], 4)
    r.reward_components = a.reward_components(r)
    r.rewards = sum(r.reward_components.values())
    # GRPO: mean 1/4, std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5, A = 1.5, -0.5 -0.5 -0.5; S = 0.5
    # step 1 of a 2-step warm-up: beta = 0.1 -> Delta = -0.05 -> -0.55
    assert a.compute_advantages(r).tolist() == pytest.approx([1.5, -0.55, -0.55, -0.55], abs=1e-5)
    a.on_step_end(r, 1)
    # full beta 0.2 -> Delta = -0.1 -> -0.6
    assert a.compute_advantages(r).tolist() == pytest.approx([1.5, -0.6, -0.6, -0.6], abs=1e-5)
    assert a.step_metrics(r)["edas/case_single_share"] == 1.0
    b = edas("algo.base=grpo", "edas.warmup_steps=2")
    b.load_state_dict(a.state_dict())
    assert b.steps_done == 1


def test_edas_composes_over_dapo_by_default_and_rejects_bad_kappa():
    a = edas()
    assert a.base.name == "dapo" and a.loss_agg == "token-mean"
    assert set(a.config_sections) == {"edas", "dapo"}
    with pytest.raises(UserError, match="kappa"):
        edas("edas.kappa=1.0")


# ---------------------------------------------------------------- training


def train_tiny(tmp_path, steps, *overrides):
    from meds_cli.engine.trainer import Trainer

    # The foundation's learning setting (tests/test_learning.py: 8 prompts x 16, full weights,
    # lr 0.003); GRPO base so every step updates without extra sampling rounds (CPU budget).
    cfg = tiny_config("algo.name=edas", "algo.base=grpo", "grpo.loss_agg=token-mean", "model.lora.enabled=false",
                      "optim.lr=0.003", f"train.steps={steps}", *overrides, output_dir=tmp_path)
    trainer = Trainer(cfg, tmp_path)
    return trainer, [trainer.train_step() for _ in range(steps)]


def test_tiny_model_trains_with_edas_without_diverging(tmp_path):
    trainer, rows = train_tiny(tmp_path, 15)
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    assert all(r["edas/case_diverse_share"] + r["edas/case_single_share"] + r["edas/case_few_share"]
               == pytest.approx(1.0) for r in rows)
    assert any(r["edas/delta_abs_mean"] > 0 for r in rows), "EDAS never shaped anything"
    rewards = [r["reward"] for r in rows]
    # chance is about 1/53; the copy task starts being learnt within these steps at this lr
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5, f"reward did not rise: {rewards}"
    assert all(torch.isfinite(p).all() for p in trainer.unwrapped.parameters())


@pytest.mark.slow
def test_tiny_model_learns_copy_task_with_edas_on_dapo(tmp_path):
    _, rows = train_tiny(tmp_path, 40, "algo.base=dapo")
    rewards = [r["reward"] for r in rows]
    assert sum(rewards[-5:]) / 5 >= 0.4, f"EDAS on DAPO did not learn: {rewards}"


@pytest.mark.slow
@needs_embedded
def test_one_real_step_on_smollm2(tmp_path):
    from meds_cli.engine.trainer import Trainer

    cfg = tiny_config("model.name=smollm2-135m", "task.name=arithmetic", "algo.name=edas", "rollout.prompts_per_step=2",
                      "rollout.group_size=4", "rollout.max_new_tokens=32", "rollout.generation_batch_size=8",
                      "train.micro_batch_size=4", "train.steps=1", "algo.base=grpo", output_dir=tmp_path)
    # GRPO base: the step always updates (DAPO could drop every group of a weak model)
    row = Trainer(cfg, tmp_path).train_step()
    assert math.isfinite(row["loss"]) and "edas/case_few_share" in row


def test_example_config_loads():
    from meds_cli.engine.config import load_config

    cfg = load_config([str(Path(__file__).resolve().parent.parent / "configs" / "edas_smollm2.yaml")])
    assert cfg.algo.name == "edas" and cfg.section("edas").warmup_steps == 2
