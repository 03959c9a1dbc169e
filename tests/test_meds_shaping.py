"""MEDS hooks on hand-built batches: composition, shaping with hand-computed numbers, memory."""

import numpy as np
import pytest
import torch

from algorithms import ALGORITHMS
from algorithms.dapo import DAPO
from algorithms.grpo import GRPO
from algorithms.meds import CLUSTER_SIZE, FEATURES, PENALTY
from algorithms.meds_memory import Bank
from meds_cli.core.errors import UserError
from meds_cli.core.records import Problem, Verdict
from meds_cli.core.rollouts import Rollouts
from meds_cli.engine.config import load_config
from meds_cli.engine.training.algorithm_setup import build_algorithm
from tests.conftest import tiny_config

A, B, LONE = [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [-1.0, -1.0, 0.0]


def meds(*overrides):
    return build_algorithm(tiny_config("algo.name=meds", *overrides))


def batch(features, correct, group_size, answers=None):
    """A Rollouts with given features and verdicts (rewards 1 / 0), no model involved."""
    size = len(correct)
    answers = answers or [str(i) for i in range(size)]
    r = Rollouts(
        problems=[Problem(id=f"p{g}", question="q", answer="1") for g in range(size // group_size)],
        group_size=group_size, input_ids=torch.zeros(size, 3, dtype=torch.long),
        attention_mask=torch.ones(size, 3, dtype=torch.long), prompt_width=1,
        response_ids=torch.zeros(size, 2, dtype=torch.long), response_mask=torch.ones(size, 2),
        response_texts=[f"response {i}" for i in range(size)], truncated=torch.zeros(size, dtype=torch.bool),
        verdicts=[Verdict(c, a, "correct" if c else "wrong") for c, a in zip(correct, answers)],
    )
    r.extras = {FEATURES: torch.tensor(features), "meds_anchor": ["last"] * size}
    r.reward_components = {"correctness": torch.tensor([1.0 if c else 0.0 for c in correct])}
    r.rewards = r.reward_components["correctness"].clone()
    return r


def remember(algo, pid, kind, rows, labels=()):
    bank = Bank.empty(3)
    bank.extend(torch.tensor(rows), [None] * len(rows), [""] * len(rows), 0, list(labels) or None, limit=1000)
    algo.memory.put(pid, kind, bank)


def test_registered_composes_and_defaults():
    assert "meds" in ALGORITHMS
    assert load_config().algo.name == "meds"  # the default algorithm
    algo = meds()
    assert isinstance(algo.base, DAPO) and algo.forward_needs(4, records_lens=False).hidden_states
    assert algo.config_sections == ["meds", "dapo"]
    assert algo.loss_agg == "token-mean" and algo.generation_rounds() == 3  # DAPO's hooks pass through
    assert isinstance(meds("algo.base=grpo").base, GRPO)
    cfg = algo.config
    assert (cfg.alpha, cfg.beta, cfg.noise, cfg.assign, cfg.target, cfg.final_norm, cfg.layers) == (
        0.1, 0.2, "zero", "refit", "wrong", False, "last_half")
    with pytest.raises(UserError, match="meds.layers"):
        meds("meds.layers=middle")
    with pytest.raises(UserError, match="meds.memory_size must be at least 0, got -1"):
        meds("meds.memory_size=-1")
    assert (cfg.one_mode, cfg.unboxed, cfg.memory_size) == ("cluster", "last_token", 128)


@pytest.mark.parametrize("key, value", [("alpha", "-0.1"), ("beta", "-1"), ("alpha", "nan")])
def test_penalty_constants_must_be_non_negative(key, value):
    # a negative slope or cap would reward a repeated error instead of penalising it
    with pytest.raises(UserError, match=rf"meds.{key} must be a number >= 0 .*got {value}"):
        meds(f"meds.{key}={value}")
    meds(f"meds.{key}=0")  # zero is accepted: no penalty


def test_refit_shaping_hand_computed():
    algo = meds()
    # p0 memory of wrong answers: 4 along A, 2 along B (two clusters)
    remember(algo, "p0", "wrong", [[s * x for x in A] for s in (1, 2, 3, 4)] + [B, [3 * x for x in B]])
    # group p0: rows 0, 1 wrong along A, row 2 wrong along B, row 3 wrong far from both, rows 4, 5 correct
    r = batch([[7 * x for x in A], [0.5 * x for x in A], [2 * x for x in B], LONE, A, B],
              [False, False, False, False, True, True], 6)
    algo.shape_rewards(r)
    # |C|: A = 4 memory + 2 batch = 6, B = 2 + 1 = 3, lone = noise -> 0; correct rows not shaped
    assert r.extras[CLUSTER_SIZE].tolist() == [6, 6, 3, 0, 0, 0]
    # penalty: min(0.1 ln 7, 0.2) = 0.1945910; min(0.1 ln 4, 0.2) = 0.1386294; 0
    expected = [-0.1945910, -0.1945910, -0.1386294, 0.0, 1.0, 1.0]
    assert r.rewards.tolist() == pytest.approx(expected, abs=1e-6)
    assert r.extras[PENALTY].tolist() == pytest.approx([0.1945910, 0.1945910, 0.1386294, 0, 0, 0], abs=1e-6)
    # the base's (DAPO: GRPO group) advantages see the shaped rewards
    adv = algo.compute_advantages(r)
    mean = sum(expected) / 6
    std = float(np.std(expected, ddof=1))
    assert adv.tolist() == pytest.approx([(x - mean) / (std + 1e-6) for x in expected], abs=1e-5)
    metrics = algo._metrics
    assert metrics["meds/clusters_per_prompt"] == 2
    assert metrics["meds/noise_share"] == 0.25  # 1 of 4 wrong responses
    assert metrics["meds/wrong_cluster_size_mean"] == pytest.approx((6 + 6 + 3 + 0) / 4)
    assert metrics["meds/wrong_penalty_mean"] == pytest.approx((2 * 0.1945910 + 0.1386294) / 4, abs=1e-6)


def test_noise_singleton_and_target_both():
    algo = meds("meds.noise=singleton", "meds.target=both")
    remember(algo, "p0", "wrong", [[s * x for x in A] for s in (1, 2, 3, 4)] + [B, [3 * x for x in B]])
    remember(algo, "p0", "correct", [A, [2 * x for x in A], B, [2 * x for x in B]])
    r = batch([LONE, A], [False, True], 2)
    algo.shape_rewards(r)
    # the lone wrong row is noise -> |C| = 1 -> penalty 0.1 ln 2 = 0.0693147; r = 0 - 0.0693147
    # the correct row joins the correct memory's A cluster (2 + 1 = 3) -> penalty 0.1 ln 4 =
    # 0.1386294; r = 1 / 1.1386294 = 0.8782489
    assert r.extras[CLUSTER_SIZE].tolist() == [1, 3]
    assert r.rewards.tolist() == pytest.approx([-0.0693147, 0.8782489], abs=1e-6)


def test_knn_mode_counts_memory_only_and_refits():
    algo = meds("meds.assign=knn")
    remember(algo, "p0", "wrong", [[s * x for x in A] for s in (1, 2, 3, 4)] + [B, [3 * x for x in B]],
             labels=[0, 0, 0, 0, 1, 1])
    r = batch([A, B, A, A], [False, False, True, True], 4)
    algo.shape_rewards(r)
    # A votes label 0: 4 memory members -> 0.1 ln 5 = 0.1609438; B: 2 members -> 0.1 ln 3 = 0.1098612
    assert r.extras[CLUSTER_SIZE].tolist() == [4, 2, 0, 0]
    assert r.rewards.tolist() == pytest.approx([-0.1609438, -0.1098612, 1.0, 1.0], abs=1e-6)
    algo.on_step_end(r, step=1)
    bank = algo.memory.bank("p0", "wrong", 3)
    assert len(bank) == 8 and len(bank.labels) == 8  # refitted over memory + the two new rows


def test_memory_is_bounded_and_split_by_correctness():
    algo = meds("meds.memory_size=3")
    for step in range(1, 4):
        r = batch([A, B, A, B], [False, False, True, True], 4, answers=["7", "8", "1", "2"])
        algo.shape_rewards(r)
        algo.on_step_end(r, step)
    wrong, right = algo.memory.bank("p0", "wrong", 3), algo.memory.bank("p0", "correct", 3)
    # two wrong entries a step, three kept: after step 3 the newest are step 2's B and step 3's A, B
    assert len(wrong) == 3 and wrong.steps == [2, 3, 3] and wrong.answers == ["8", "7", "8"]
    assert len(right) == 3 and right.answers == ["2", "1", "2"]  # correct responses are remembered apart
    assert right.labels == []  # never clustered with target 'wrong'
    state = algo.state_dict()
    again = meds("meds.memory_size=3")
    again.load_state_dict(state)
    assert torch.equal(again.memory.bank("p0", "wrong", 3).features, wrong.features)


def test_layer_count_change_on_resume_is_a_user_error():
    algo = meds()
    remember(algo, "p0", "wrong", [A, B])
    r = batch([[1.0, 0.0], [0.0, 1.0]], [False, True], 2)
    with pytest.raises(UserError, match="meds.layers"):
        algo.shape_rewards(r)
