"""Per-step metrics every algorithm logs."""

import pytest
import torch

from meds_cli.engine.training.metrics import advantage_metrics, distinct_answers, rollout_metrics
from tests.rollout_factory import make_rollouts


def test_distinct_answers_and_wrong_answers_per_group():
    # group 1: answers 0.5, \frac{1}{2} (one answer), 3 (correct), none -> 2 distinct, 1 distinct wrong, 1 correct
    # group 2: 7, 8, 9, 7, all wrong -> 3 distinct, 3 distinct wrong, 0 correct
    batch = make_rollouts([False, False, True, False, False, False, False, False], 4,
                          answers=["0.5", "\\frac{1}{2}", "3", None, "7", "8", "9", "7"])
    assert distinct_answers(batch) == pytest.approx(2.5)
    assert distinct_answers(batch, correct=False) == pytest.approx(2.0)
    assert distinct_answers(batch, correct=True) == pytest.approx(0.5)
    batch.rewards = torch.zeros(8)
    assert rollout_metrics(batch)["distinct_correct_answers_per_group"] == pytest.approx(0.5)


def test_rollout_metrics():
    batch = make_rollouts([True, False, False, False], 2, lengths=[2, 4, 3, 4], truncated=[False, True, False, False])
    batch.reward_components = {"correctness": torch.tensor([1.0, 0.0, 0.0, 0.0])}
    batch.rewards = batch.reward_components["correctness"]
    m = rollout_metrics(batch)
    assert m["accuracy"] == 0.25 and m["reward/correctness"] == 0.25
    assert m["response_length_mean"] == pytest.approx(13 / 4) and m["response_length_max"] == 4
    assert m["truncated_share"] == 0.25
    assert m["zero_spread_group_share"] == 0.5  # group 2 is all wrong


def test_advantage_metrics():
    # positives 1.5 and 0.5 -> mean 1; negatives -0.5, -1.5 -> mean -1; two of six are 0
    m = advantage_metrics(torch.tensor([1.5, -0.5, 0.0, 0.5, -1.5, 0.0]))
    assert m == {"advantage/positive_mean": 1.0, "advantage/negative_mean": -1.0,
                 "advantage/zero_share": pytest.approx(2 / 6)}
    assert advantage_metrics(torch.zeros(2, 3)) == {}  # per-token advantages: not summarised here
