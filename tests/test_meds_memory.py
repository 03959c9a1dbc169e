"""MEDS memory, clustering and penalty (algorithms/meds_memory.py), hand-computed; the eigen ratio and
L2 normalisation are tested in tests/test_diversity.py."""

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from algorithms.meds_memory import (
    NOISE,
    Bank,
    ClusterSettings,
    Memory,
    assign_clusters,
    cluster_penalty,
    hdbscan_labels,
    knn_vote,
    member_counts,
    shape_rewards_with_penalty,
    snippet,
)


def test_cluster_penalty_hand_computed():
    # alpha 0.1, beta 0.2:
    # |C| = 0  -> 0.1 * ln 1  = 0
    # |C| = 1  -> 0.1 * ln 2  = 0.0693147
    # |C| = 3  -> 0.1 * ln 4  = 0.1386294
    # |C| = 10 -> 0.1 * ln 11 = 0.2397895 > beta -> 0.2
    got = cluster_penalty(torch.tensor([0, 1, 3, 10]), 0.1, 0.2)
    assert got.tolist() == pytest.approx([0.0, 0.0693147, 0.1386294, 0.2], abs=1e-6)


def test_shaping_wrong_and_both():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    correct = torch.tensor([True, False, False, True])
    penalty = torch.tensor([0.1, 0.0693147, 0.2, 0.1386294])
    # wrong: r - p on wrong rows only: [1, 0 - 0.0693147, 0 - 0.2, 1]
    assert shape_rewards_with_penalty(rewards, correct, penalty, "wrong").tolist() == pytest.approx(
        [1.0, -0.0693147, -0.2, 1.0], abs=1e-6)
    # both: correct rows r / (1 + p): 1 / 1.1 = 0.9090909, 1 / 1.1386294 = 0.8782489
    assert shape_rewards_with_penalty(rewards, correct, penalty, "both").tolist() == pytest.approx(
        [0.9090909, -0.0693147, -0.2, 0.8782489], abs=1e-6)
    with pytest.raises(ValueError):
        shape_rewards_with_penalty(rewards, correct, penalty, "right")


def test_member_counts_and_noise_rules():
    labels = np.array([0, 0, 1, NOISE, 0, 1])
    # cluster 0 has 3 members, cluster 1 has 2; the noise point counts 0 or 1
    assert member_counts(labels, "zero").tolist() == [3, 3, 2, 0, 3, 2]
    assert member_counts(labels, "singleton").tolist() == [3, 3, 2, 1, 3, 2]


def test_hdbscan_small_sets_are_noise():
    assert hdbscan_labels(np.zeros((0, 3))).tolist() == []
    assert hdbscan_labels(np.ones((1, 3))).tolist() == [NOISE]
    # min_samples 3 needs at least 4 points for core distances
    assert hdbscan_labels(np.eye(3), min_cluster_size=2, min_samples=3).tolist() == [NOISE] * 3


def planted(seed=0, per=10, dims=14, spread=0.01):
    """Three clusters along three different directions (HDBSCAN sees directions: rows are
    normalised), each point scaled by a random norm to show that magnitude does not matter."""
    rng = np.random.default_rng(seed)
    centres = np.eye(dims)[[0, 5, 9]] + 0.2
    points, truth = [], []
    for k, c in enumerate(centres):
        for _ in range(per):
            points.append((c + rng.normal(0, spread, dims)) * rng.uniform(0.5, 20))
            truth.append(k)
    return np.array(points), np.array(truth)


def test_hdbscan_recovers_planted_clusters():
    points, truth = planted()
    labels = hdbscan_labels(points)
    assert NOISE not in labels.tolist()
    assert adjusted_rand_score(truth, labels) == 1.0


def test_knn_vote_hand_example():
    memory = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9], [-1.0, 0.0]])
    labels = np.array([0, 0, 1, 1, NOISE])
    # [1, 0.05]: nearest by cosine are rows 0, 1 (label 0) and then row 3 (label 1) -> 0
    # [0.05, 1]: rows 2, 3 (label 1), then row 1 -> 1; [-1, -0.1]: row 4 (noise) first, then
    # rows 2 and 3 tie-break... cosine of [-1,-0.1] with [0,1] = -0.0995, with [0.1,0.9] = -0.2089
    # and with [0.9,0.1] = -0.9997: k = 3 -> rows 4, 2, 3 -> labels -1, 1, 1 -> 1
    got = knn_vote(memory, labels, np.array([[1.0, 0.05], [0.05, 1.0], [-1.0, -0.1]]), k=3)
    assert got.tolist() == [0, 1, 1]
    # an equal vote goes to the smallest label: k = 2 on [0.5, 0.5] sees rows 1 (0) and 3 (1)
    assert knn_vote(memory, labels, np.array([[0.5, 0.5]]), k=2).tolist() == [0]
    assert knn_vote(np.zeros((0, 2)), np.zeros(0), np.ones((2, 2))).tolist() == [NOISE, NOISE]


def blobs():
    """Memory: 4 points along direction A and 2 along B; batch: 2 along A, 1 along B, and one
    point farther from both (cosine -0.707) than A is from B (cosine 0): noise. Norms vary to show
    that only directions count."""
    a, b, lone = np.array([1.0, 0, 0]), np.array([0, 1.0, 0]), np.array([-1.0, -1.0, 0])
    memory = np.vstack([a * s for s in (1, 2, 3, 4)] + [b, b * 3])
    batch = np.vstack([a * 7, a * 0.5, b * 2, lone])
    return memory, batch


def test_refit_counts_memory_and_batch():
    memory, batch = blobs()
    fit = assign_clusters(memory, np.array([]), batch, ClusterSettings())
    # cluster A: 4 memory + 2 batch = 6; cluster B: 2 memory + 1 batch = 3; the lone point is noise
    assert fit.sizes.tolist() == [6, 6, 3, 0]
    assert fit.labels[3] == NOISE and fit.clusters == 2
    assert len(fit.fitted_labels) == len(memory) + len(batch)
    singleton = assign_clusters(memory, np.array([]), batch, ClusterSettings(noise="singleton"))
    assert singleton.sizes.tolist() == [6, 6, 3, 1]


def test_knn_counts_memory_members_only():
    memory, batch = blobs()
    memory_labels = np.array([0, 0, 0, 0, 1, 1])
    fit = assign_clusters(memory, memory_labels, batch, ClusterSettings(assign="knn"))
    # A-rows vote 0 (4 memory members), the B-row votes 1 (2 members); the lone point's 3
    # nearest are equally far from A and B rows -> the oldest rows win, label 0 -> 4
    assert fit.sizes.tolist() == [4, 4, 2, 4]
    assert fit.fitted_labels is None  # the memory is refitted after the batch joins it
    empty = assign_clusters(np.zeros((0, 3)), np.array([]), batch, ClusterSettings(assign="knn"))
    assert empty.sizes.tolist() == [0, 0, 0, 0]


def test_bank_keeps_the_newest_entries():
    bank = Bank.empty(2)
    bank.extend(torch.tensor([[1.0, 0], [2.0, 0]]), ["a", "b"], ["ra", "rb"], 1, [0, 0], limit=3)
    bank.extend(torch.tensor([[3.0, 0], [4.0, 0]]), ["c", None], ["rc", "rd"], 2, [0, 0, 1, 1], limit=3)
    assert bank.features[:, 0].tolist() == [2.0, 3.0, 4.0]
    assert bank.answers == ["b", "c", None] and bank.snippets == ["rb", "rc", "rd"]
    assert bank.steps == [1, 2, 2] and bank.labels == [0, 1, 1]


def test_memory_state_round_trip_is_exact():
    memory = Memory()
    bank = Bank.empty(3)
    bank.extend(torch.randn(4, 3), ["1", "2", "3", None], ["a", "b", "c", "d"], 5, [0, 0, -1, 1], limit=8)
    memory.put("p1", "wrong", bank)
    again = Memory()
    again.load_state_dict(memory.state_dict())
    restored = again.bank("p1", "wrong", 3)
    assert torch.equal(restored.features, bank.features)
    plain = lambda state: {k: v for k, v in state.items() if k != "features"}  # noqa: E731
    assert plain(restored.state()) == plain(bank.state())
    assert len(again.bank("p2", "wrong", 3)) == 0


def test_snippet_is_bounded():
    assert snippet("short", 20) == "short"
    long = "A" * 50 + "B" * 50
    s = snippet(long, 21)
    assert s == "A" * 9 + " … " + "B" * 9 and len(s) <= 21
