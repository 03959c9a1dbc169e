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
    equal_shift_to_total,
    error_classes,
    error_entropy_terms,
    kappa_clip,
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


def test_kappa_clip_by_hand():
    # edas.clip: kappa (the authors' rule, the default), |change| <= |A| / kappa in both directions:
    # A = -1, Delta = -0.3: |Delta| < |A|/2 = 0.5 -> -1.3, not clipped
    # A = -0.1, Delta = +0.3: limit 0.05 -> -0.05, clipped (a rare error is never rewarded)
    # A = -0.4, Delta = -0.5: limit 0.2 -> -0.6, clipped
    # A = 0 (a group with no spread): limit 0 -> unchanged
    new, clipped = kappa_clip(torch.tensor([-1.0, -0.1, -0.4, 0.0]), torch.tensor([-0.3, 0.3, -0.5, 0.2]), 2.0)
    assert new.tolist() == pytest.approx([-1.3, -0.05, -0.6, 0.0])
    assert clipped.tolist() == [False, True, True, True]


def test_sign_clip_binds_only_towards_zero():
    # edas.clip: sign, no absorption (K = 1), kappa 2: a response may come towards zero only to A / 2
    # A = -1, Delta = -0.3 -> -1.3 (away from zero: free)
    # A = -0.1, Delta = +0.3 -> +0.2 would reward a wrong answer: held at -0.1 / 2 = -0.05
    # A = -0.4, Delta = -0.5 -> -0.9 (the magnitude clip gave -0.6)
    # A = 0, Delta = +0.2: held at 0; A = 0, Delta = -0.2 -> -0.2
    # A = +0.4 (a wrong response with partial credit), Delta = -0.4 -> 0: held at +0.2
    adv = torch.tensor([-1.0, -0.1, -0.4, 0.0, 0.0, 0.4])
    new, held = sign_keeping_clip(adv, torch.tensor([-0.3, 0.3, -0.5, 0.2, -0.2, -0.4]), 2.0, zero_sum=False)
    assert new.tolist() == pytest.approx([-1.3, -0.05, -0.9, 0.0, -0.2, 0.2])
    assert held.tolist() == [False, True, False, True, False, True]


def test_equal_shift_to_total_by_hand():
    # values 0, 1, 2 with upper bounds 0.5, 0.5, none: g(s) = min(s, .5) + min(1 + s, .5) + (2 + s).
    # Breakpoints -0.5 and 0.5; g(-0.5) = -0.5 + 0.5 + 1.5 = 1.5 > 1, so s < -0.5 where all three
    # move: s = -0.5 - (1.5 - 1) / 3 = -2/3, and g(-2/3) = -2/3 + 1/3 + 4/3 = 1.
    bounds = [(-math.inf, 0.5), (-math.inf, 0.5), (-math.inf, math.inf)]
    assert equal_shift_to_total([0.0, 1.0, 2.0], bounds, 1.0) == pytest.approx(-2 / 3)
    # total 3: between the breakpoints the second is held at 0.5 and the others move (slope 2):
    # s = -0.5 + (3 - 1.5) / 2 = 0.25; g(0.25) = 0.25 + 0.5 + 2.25 = 3
    assert equal_shift_to_total([0.0, 1.0, 2.0], bounds, 3.0) == pytest.approx(0.25)


def test_sign_clip_keeps_the_wrong_subset_zero_sum_when_it_binds():
    # One group, all four wrong: classes b a a a, A = -0.1 (the rare b), -1, -1, -1, alpha 0.2, kappa 2.
    # S = (0.1 + 3) / 4 = 0.775; I_a = ln(4/3), I_b = ln 4, H = 0.75 I_a + 0.25 I_b;
    # I_a - H = 0.25 ln(1/3) = -0.274653, I_b - H = 0.75 ln 3 = 0.823959; ln N_w = ln 4 = 1.386294.
    # Delta_a = 0.2 * 0.775 * -0.274653 / 1.386294 = -0.030709, Delta_b = 0.155 * 0.823959 / 1.386294 = +0.092126
    # (3 * 0.030709 = 0.092126: zero-sum).
    # sign: b would go to -0.1 + 0.092126 = -0.007874, past its bound -0.1 / 2 = -0.05: held at -0.05;
    # the a's absorb the rest so the sum stays -3.1: each a = (-3.1 + 0.05) / 3 = -1.016667.
    # kappa: b -> -0.05 (limit 0.05), a -> -1.0307085 each: sum -0.05 - 3.0921255 = -3.1421255, not zero-sum.
    adv = torch.tensor([-0.1, -1.0, -1.0, -1.0])
    wrong_rows = torch.ones(4, dtype=torch.bool)
    labels = ["b", "a", "a", "a"]
    sign, facts = edas_advantages(adv, wrong_rows, labels, 4, 0.2, 0.2, 2.0, "sign")
    assert sign.tolist() == pytest.approx([-0.05, -1.016667, -1.016667, -1.016667], abs=1e-6)
    assert sign.sum().item() == pytest.approx(-3.1, abs=1e-6)
    assert facts["clipped"].tolist() == [True, False, False, False]
    kappa, _ = edas_advantages(adv, wrong_rows, labels, 4, 0.2, 0.2, 2.0, "kappa")
    assert kappa.tolist() == pytest.approx([-0.05, -1.030709, -1.030709, -1.030709], abs=1e-6)
    assert kappa.sum().item() == pytest.approx(-3.1421255, abs=1e-6)


def test_sign_clip_properties_on_random_groups():
    # Whatever the advantages (either sign: partial credit or another baseline) and Deltas: no sign
    # flips and no bound is passed; K > 1 keeps the wrong subset's sum; nothing held -> the formula.
    rng = random.Random(1)
    for _ in range(300):
        n = rng.randint(2, 10)
        labels = [rng.randint(0, 3) for _ in range(n)]
        adv = torch.tensor([rng.uniform(-2, 2) * (rng.random() > 0.05) for _ in range(n)], dtype=torch.float64)
        kappa = rng.choice([1.01, 2.0, 5.0])
        delta, case = diversity_delta(labels, adv.abs().tolist(), rng.uniform(0, 3), rng.uniform(0, 3))
        if case == "none":
            continue
        new, held = sign_keeping_clip(adv, torch.tensor(delta, dtype=torch.float64), kappa, zero_sum=case == "diverse")
        negative = adv <= 0
        assert (new[negative] <= adv[negative] / kappa + 1e-12).all()
        assert (new[~negative] >= adv[~negative] / kappa - 1e-12).all()
        if case == "diverse":
            assert new.sum().item() == pytest.approx(adv.sum().item(), abs=1e-9)
        if not held.any():
            assert new.tolist() == pytest.approx((adv + torch.tensor(delta, dtype=torch.float64)).tolist())


def test_kappa_clip_never_flips_a_sign():
    gen = torch.Generator().manual_seed(0)
    for kappa in (1.01, 2.0, 5.0):
        adv = torch.randn(1000, generator=gen) * 2
        delta = torch.randn(1000, generator=gen) * 10  # far larger than the advantages
        new, _ = kappa_clip(adv, delta, kappa)
        assert torch.equal(torch.sign(new), torch.sign(adv))


def test_paper_numbers_single_class_uniform_shift():
    # The worked numbers (seed 003, the K = 1 regime: "a uniform negative shift (-beta * S)"
    # on every wrong response). A = [1.2, -0.1, -0.9, -0.8], wrong = [F, T, T, T], one error class,
    # defaults beta 0.2, kappa 2: S = (0.1 + 0.9 + 0.8) / 3 = 0.6, Delta = -0.2 * 0.6 = -0.12 each:
    # -0.22, -1.02, -0.92. The correct response (1.2) is untouched. A negative shift on a negative
    # advantage cannot reverse its sign, so the sign clip never binds; the kappa clip (the authors',
    # the default since issue 54, so `sign` is named here) cuts the second to -0.1 - 0.1 / 2 = -0.15.
    adv = torch.tensor([1.2, -0.1, -0.9, -0.8])
    is_wrong = torch.tensor([False, True, True, True])
    labels = [None, "x", "x", "x"]
    new, facts = edas_advantages(adv, is_wrong, labels, 4, 0.2, 0.2, 2.0, "sign")
    assert new.tolist() == pytest.approx([1.2, -0.22, -1.02, -0.92])
    assert facts["cases"] == ["single"] and not facts["clipped"].any()
    default, _ = edas_advantages(adv, is_wrong, labels, 4, 0.2, 0.2, 2.0)
    assert default.tolist() == pytest.approx([1.2, -0.15, -1.02, -0.92])
    old_name, _ = edas_advantages(adv, is_wrong, labels, 4, 0.2, 0.2, 2.0, "magnitude")
    assert old_name.tolist() == default.tolist()
    # K = 1, beta 1.5, A = -0.5 for both of two wrong responses: S = 0.5, Delta = -1.5 * 0.5 = -0.75
    # -> -1.25 under the sign clip (the kappa clip, the default, stops at -0.5 - 0.5 / 2 = -0.75)
    two = torch.tensor([-0.5, -0.5])
    both = torch.ones(2, dtype=torch.bool)
    assert edas_advantages(two, both, ["x", "x"], 2, 0.2, 1.5, 2.0, "sign")[0].tolist() == pytest.approx(
        [-1.25, -1.25])
    assert edas_advantages(two, both, ["x", "x"], 2, 0.2, 1.5, 2.0)[0].tolist() == pytest.approx([-0.75, -0.75])


def test_all_wrong_penalty_reaches_the_broken_record_only():
    # Two groups of 3 under GRPO: group 0 all wrong with one answer (A = 0, S = 0), group 1 all wrong
    # with two answers (K = 2, also A = 0). p = 0.3: group 0 gets -0.3 each; group 1 keeps 0 (its
    # errors differ, and the Deltas scale with S = 0). p = 0 (the default, the paper): nothing moves.
    adv = torch.zeros(6)
    every = torch.ones(6, dtype=torch.bool)
    labels = ["x", "x", "x", "y", "y", "z"]
    new, facts = edas_advantages(adv, every, labels, 3, 0.2, 0.2, 2.0, all_wrong_penalty=0.3)
    assert new.tolist() == pytest.approx([-0.3, -0.3, -0.3, 0.0, 0.0, 0.0])
    assert facts["cases"] == ["all_wrong", "diverse"]
    assert edas_advantages(adv, every, labels, 3, 0.2, 0.2, 2.0)[0].tolist() == [0.0] * 6


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


def test_warmup_start_delays_the_ramp_by_step():
    # warmup_start 3, warmup_steps 2: steps 1-3 shape nothing, step 4 half, step 5 on full
    assert [warmup_factor(s, 2, 3) for s in range(1, 7)] == [0.0, 0.0, 0.0, 0.5, 1.0, 1.0]
    # a delay with no ramp: full strength from the first step after it
    assert [warmup_factor(s, 0, 2) for s in (1, 2, 3)] == [0.0, 0.0, 1.0]


def test_clips_differ_at_alpha_3_with_binary_rewards():
    # Four wrong responses, all A = -1 (binary rewards: every wrong response has the same A), classes
    # a a a b, alpha 3, kappa 2. S = 1, I_a = ln(4/3) = 0.287682, I_b = ln 4 = 1.386294,
    # H = 0.75 I_a + 0.25 I_b = 0.562335; (I - H) / ln 4 = -0.198120 (a), +0.594361 (b);
    # Delta_a = 3 * -0.198120 = -0.594361, Delta_b = +1.783083.
    # kappa (the authors'): every change at most |A| / 2 = 0.5: a -> -1.5, b -> -0.5 (sum -5, not -4).
    # sign: b (+0.783083) is held at its bound A / 2 = -0.5; the a's absorb the rest to keep the sum -4:
    # each a = (-4 + 0.5) / 3 = -1.166667.
    adv = torch.full((4,), -1.0)
    every = torch.ones(4, dtype=torch.bool)
    labels = ["a", "a", "a", "b"]
    kappa, facts = edas_advantages(adv, every, labels, 4, 3.0, 0.2, 2.0)
    assert kappa.tolist() == pytest.approx([-1.5, -1.5, -1.5, -0.5], abs=1e-6)
    assert facts["clipped"].tolist() == [True, True, True, True]
    assert facts["delta"].tolist() == pytest.approx([-0.594361, -0.594361, -0.594361, 1.783083], abs=1e-6)
    sign, _ = edas_advantages(adv, every, labels, 4, 3.0, 0.2, 2.0, "sign")
    assert sign.tolist() == pytest.approx([-1.166667, -1.166667, -1.166667, -0.5], abs=1e-6)
    # at alpha 0.5 no change reaches |A| / 2 (|I - H| <= ln N_w), and the two agree
    low_kappa, _ = edas_advantages(adv, every, labels, 4, 0.5, 0.2, 2.0)
    low_sign, _ = edas_advantages(adv, every, labels, 4, 0.5, 0.2, 2.0, "sign")
    assert low_kappa.tolist() == pytest.approx(low_sign.tolist())


def test_clips_differ_with_partial_credit():
    # GRPO on rewards 1, 0.4, 0.4, 0 (the two 0.4s wrong with partial credit, one answer; the 0 wrong
    # with the same answer): mean 0.45, unbiased std sqrt(0.51 / 3) = 0.412311, A = 1.333946,
    # -0.121268, -0.121268, -1.091410. K = 1: S = (0.121268 * 2 + 1.091410) / 3 = 0.444649,
    # Delta = -0.2 S = -0.088930 on each wrong response.
    # sign: away from zero is free -> -0.210198, -0.210198, -1.180340.
    # kappa: the small advantages move at most 0.121268 / 2 = 0.060634 -> -0.181902; -1.091410 moves freely.
    adv = torch.tensor([1.333946, -0.121268, -0.121268, -1.091410])
    is_wrong = torch.tensor([False, True, True, True])
    labels = [None, "x", "x", "x"]
    kappa, _ = edas_advantages(adv, is_wrong, labels, 4, 0.2, 0.2, 2.0)
    assert kappa.tolist() == pytest.approx([1.333946, -0.181902, -0.181902, -1.180340], abs=1e-6)
    sign, _ = edas_advantages(adv, is_wrong, labels, 4, 0.2, 0.2, 2.0, "sign")
    assert sign.tolist() == pytest.approx([1.333946, -0.210198, -0.210198, -1.180340], abs=1e-6)


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


def test_edas_warmup_start_shapes_nothing_until_its_step():
    # The batch above (A = 1.5, -0.5 x3, S = 0.5), warmup_start 1, warmup_steps 2: step 1 is the
    # base's advantages, step 2 half of beta (-0.55), step 3 the full beta (-0.6)
    a = edas("algo.base=grpo", "edas.warmup_start=1", "edas.warmup_steps=2")
    r = batch([right(), wrong("4"), wrong("4"), wrong("4")], 4)
    r.reward_components = a.reward_components(r)
    r.rewards = sum(r.reward_components.values())
    expected = {1: -0.5, 2: -0.55, 3: -0.6}
    for step, value in expected.items():
        assert a.compute_advantages(r).tolist() == pytest.approx([1.5] + [value] * 3, abs=1e-5), step
        assert a.step_metrics(r)["edas/warmup_factor"] == {1: 0.0, 2: 0.5, 3: 1.0}[step]
        a.on_step_end(r, step)


def test_all_wrong_penalty_keeps_broken_records_through_dapos_filter():
    # DAPO's dynamic sampling drops groups whose correctness does not vary: group 0 (one wrong answer
    # four times), group 1 (two different wrong answers), group 2 (mixed). With the penalty on, the
    # broken record (group 0) is kept and trains on A = -0.5 each; without, only group 2 is kept.
    verdicts = [wrong("4")] * 4 + [wrong("4"), wrong("4"), wrong("5"), wrong("5")] + [right()] + [wrong("3")] * 3
    r = batch(verdicts, 4)
    r.reward_components = edas().reward_components(r)
    assert edas().keep_groups(r).tolist() == [False, False, True]
    a = edas("edas.all_wrong_penalty=0.5")
    assert a.keep_groups(r).tolist() == [True, False, True]
    kept = r.select_groups(a.keep_groups(r))
    kept.reward_components = a.reward_components(kept)
    kept.rewards = sum(kept.reward_components.values())
    # DAPO base (GRPO advantages): group 0 all 0 -> -0.5 (S = 0); group 2: rewards 1 0 0 0, mean 1/4,
    # std 0.5 -> A = 1.5, -0.5 x3; K = 1, S = 0.5 -> Delta = -0.1 -> -0.6
    assert a.compute_advantages(kept).tolist() == pytest.approx([-0.5] * 4 + [1.5, -0.6, -0.6, -0.6], abs=1e-5)
    assert a.step_metrics(kept)["edas/case_all_wrong_share"] == 0.5
    with pytest.raises(UserError, match="all_wrong_penalty"):
        edas("edas.all_wrong_penalty=-1")
    with pytest.raises(UserError, match="clip"):
        edas("edas.clip=both")


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
                      "rollout.group_size=4", "rollout.max_new_tokens=32", "rollout.hf.generation_batch_size=8",
                      "train.micro_batch_size=4", "train.steps=1", "algo.base=grpo", output_dir=tmp_path)
    # GRPO base: the step always updates (DAPO could drop every group of a weak model)
    row = Trainer(cfg, tmp_path).train_step()
    assert math.isfinite(row["loss"]) and "edas/case_few_share" in row


def test_paper_config_loads_with_the_authors_recipe():
    from meds_cli.engine.config import load_config

    cfg = load_config([str(Path(__file__).resolve().parent.parent / "configs" / "edas_paper.yaml")])
    edas_cfg = cfg.section("edas")
    assert cfg.algo.name == "edas" and cfg.algo.base == "dapo"
    assert (edas_cfg.alpha, edas_cfg.beta, edas_cfg.kappa, edas_cfg.clip) == (0.4, 0.3, 2.0, "kappa")
    assert cfg.rollout.group_size == 10 and cfg.rollout.prompts_per_step == 256
    assert cfg.rollout.max_new_tokens == 8192 and cfg.rollout.temperature == 1.0
    assert cfg.optim.lr == 1e-6
    # the recipe's mini-batch of 64 counts prompts (verl's ppo_mini_batch_size); this trainer counts responses
    assert cfg.train.mini_batch_size == 64 * cfg.rollout.group_size
    grpo = load_config([str(Path(__file__).resolve().parent.parent / "configs" / "edas_paper.yaml")],
                       ["algo.base=grpo", "edas.beta=0.2"])
    assert grpo.algo.base == "grpo" and grpo.section("edas").beta == 0.2


def test_example_config_loads():
    from meds_cli.engine.config import load_config

    cfg = load_config([str(Path(__file__).resolve().parent.parent / "configs" / "edas_smollm2.yaml")])
    assert cfg.algo.name == "edas" and cfg.section("edas").warmup_steps == 2
