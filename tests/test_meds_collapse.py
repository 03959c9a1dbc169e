"""MEDS on the failure it exists to punish, and the reference code's choices (issue 13).

- A collapsed error mode (every wrong answer the same) is one cluster, not all noise: a positive
  penalty that grows with the memory; two separated modes are penalised by their sizes.
- `knn` counts a noise vote as the reference code does (the noise members of memory).
- `unboxed: skip`: a response without a boxed answer is neither clustered, penalised nor remembered.
Expected penalties are min(alpha * ln(|C| + 1), beta), computed by hand in the comments.
"""

import numpy as np
import pytest
import torch

from algorithms.meds import CLUSTER_SIZE, LABEL, PENALTY
from algorithms.meds_memory import NOISE, ClusterSettings, assign_clusters, hdbscan_labels, merge_duplicates
from tests.test_meds_shaping import batch, meds, remember

DIRECTION = np.array([3.0, 1.0, 2.0])


def near_identical(rng, count, direction=DIRECTION, scale=1e-5):
    """`count` features of one repeated wrong response: the same direction up to numerical noise."""
    return (direction + scale * rng.standard_normal((count, 3))).tolist()


def run_steps(algo, steps, rng, wrong_per_step=4, correct_per_step=4):
    """Steps of one prompt: `wrong_per_step` near-identical wrong responses and correct ones
    elsewhere; returns the penalties and |C| of the wrong responses of each step."""
    penalties, sizes = [], []
    for step in range(1, steps + 1):
        correct = [[0.0, 0.0, 1.0]] * correct_per_step
        r = batch(near_identical(rng, wrong_per_step) + correct,
                  [False] * wrong_per_step + [True] * correct_per_step, wrong_per_step + correct_per_step)
        algo.shape_rewards(r)
        algo.on_step_end(r, step)
        penalties.append(r.extras[PENALTY][:wrong_per_step].tolist())
        sizes.append(r.extras[CLUSTER_SIZE][:wrong_per_step].tolist())
    return penalties, sizes


def test_collapsed_error_mode_gets_a_growing_penalty():
    # 16 near-identical wrong responses over 4 steps, 4 a step, with the default rule; beta 1
    # leaves the growth uncapped: |C| = 4, 8, 12, 16 (memory + batch) ->
    # 0.1 ln 5 = 0.1609438, 0.1 ln 9 = 0.2197225, 0.1 ln 13 = 0.2564949, 0.1 ln 17 = 0.2833213
    penalties, sizes = run_steps(meds("meds.beta=1"), 4, np.random.default_rng(0))
    assert sizes == [[4] * 4, [8] * 4, [12] * 4, [16] * 4]
    expected = [0.1609438, 0.2197225, 0.2564949, 0.2833213]
    for step, value in enumerate(expected):
        assert penalties[step] == pytest.approx([value] * 4, abs=1e-6)
    # the defaults (beta 0.2): positive from the first step, then at the cap: 0.1 ln 9 > 0.2
    penalties, _ = run_steps(meds(), 4, np.random.default_rng(0))
    assert [p[0] for p in penalties] == pytest.approx([0.1609438, 0.2, 0.2, 0.2], abs=1e-6)


def test_without_the_rule_the_collapse_goes_unpunished():
    # What the reference's plain HDBSCAN does with the same responses (the bug of issue 13):
    # exact duplicates are all noise; numerical noise scatters them into arbitrary small clusters.
    exact = run_steps(meds("meds.one_mode=noise", "meds.duplicate_distance=0"), 4, np.random.default_rng(0))[1]
    assert exact != [[4] * 4, [8] * 4, [12] * 4, [16] * 4]
    identical = [[3.0, 1.0, 2.0]] * 4
    fit = assign_clusters(np.zeros((0, 3)), np.array([]), np.array(identical), ClusterSettings(one_mode=False))
    assert fit.sizes.tolist() == [0, 0, 0, 0] and fit.labels.tolist() == [NOISE] * 4
    fit = assign_clusters(np.zeros((0, 3)), np.array([]), np.array(identical), ClusterSettings())
    assert fit.sizes.tolist() == [4, 4, 4, 4] and fit.clusters == 1


def test_two_separated_modes_are_penalised_by_their_sizes():
    rng = np.random.default_rng(1)
    algo = meds("meds.beta=1")
    a, b = near_identical(rng, 12), near_identical(rng, 4, direction=np.array([-1.0, 2.0, 0.5]))
    r = batch(a + b + [[0.0, 0.0, 1.0]] * 4, [False] * 16 + [True] * 4, 20)
    algo.shape_rewards(r)
    # |C| 12 and 4: 0.1 ln 13 = 0.2564949 and 0.1 ln 5 = 0.1609438; the correct rows are not shaped
    assert r.extras[CLUSTER_SIZE].tolist() == [12] * 12 + [4] * 4 + [0] * 4
    assert r.extras[PENALTY].tolist() == pytest.approx([0.2564949] * 12 + [0.1609438] * 4 + [0.0] * 4, abs=1e-6)
    assert algo._metrics["meds/clusters_per_prompt"] == 2 and algo._metrics["meds/noise_share"] == 0.0


def test_one_mode_and_duplicates_leave_structured_sets_alone():
    # planted clusters with a lone point: the fit finds clusters, so neither rule changes a label
    rng = np.random.default_rng(2)
    centres = np.eye(6)[[0, 2, 4]] + 0.3
    points = np.vstack([c + 0.05 * rng.standard_normal((6, 6)) for c in centres] + [-np.ones((1, 6))])
    plain = hdbscan_labels(points)
    assert NOISE in plain.tolist() and len(set(plain.tolist())) == 4
    assert hdbscan_labels(points, one_mode=True, duplicate_distance=1e-3).tolist() == plain.tolist()
    assert merge_duplicates(points, 1e-3) is points  # no two rows that close: the same array
    # two rows within the distance become the first of them; a chain links its members
    rows = np.array([[0.0, 0.0], [0.0, 5e-4], [0.0, 9e-4], [1.0, 0.0]])
    assert merge_duplicates(rows, 5e-4).tolist() == [[0.0, 0.0]] * 3 + [[1.0, 0.0]]


def test_a_lone_mode_keeps_its_outliers_as_noise():
    # 6 identical wrong answers and 2 other ones, nearer to the 6 (chord 0.63 and 0.96) than to
    # each other (1.41): they join the mode one at a time, no split of two parts of >= 2 points,
    # so the plain fit is all noise; the one-mode refit clusters the 6, the two stay noise
    points = np.vstack([np.tile(DIRECTION, (6, 1)), [[1.0, 0.0, 0.0]], [[0.0, 0.0, 1.0]]])
    assert hdbscan_labels(points).tolist() == [NOISE] * 8
    labels = hdbscan_labels(points, one_mode=True)
    assert labels[:6].tolist() == [0] * 6 and labels[6:].tolist() == [NOISE, NOISE]
    # three different answers: the closest pair (chord 0.33; the third is 1.4 away) is the densest
    # level of the one mode, a cluster of 2, as HDBSCAN would cluster that pair inside a larger set
    three = np.array([[1.0, 0.0, 0.0], [0.9, 0.3, 0.0], [0.0, 0.0, 1.0]])
    assert hdbscan_labels(three).tolist() == [NOISE] * 3
    assert hdbscan_labels(three, one_mode=True).tolist() == [0, 0, NOISE]


# ---------------------------------------------------------------- knn, as the reference code


def knn_memory():
    """Memory labels from a previous fit (hand-built): 3 members of cluster 0 along x, 2 noise
    points along y and -y."""
    features = [[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [1.0, 0.05, 0.0], [0.0, 1.0, 0.0], [0.0, -1.0, 0.0]]
    return features, [0, 0, 0, NOISE, NOISE]


@pytest.mark.parametrize("noise, expected", [("count", [3, 2]), ("zero", [3, 0]), ("singleton", [3, 1])])
def test_knn_noise_vote_counts_like_the_reference(noise, expected):
    features, labels = knn_memory()
    # k = 1. Query [1, 0.02, 0]: nearest row 0 (cos 0.9998) -> label 0 -> 3 members.
    # Query [0.1, 1, 0] (norm 1.005): cos with row 3 = 1 / 1.005 = 0.995, row 1 = 0.19 / (0.9055 *
    # 1.005) = 0.209, row 2 = 0.15 / (1.00125 * 1.005) = 0.149 -> row 3, noise. The reference
    # gives a noise vote |C| = the noise members of memory (2); 'zero' gives 0, 'singleton' 1.
    fit = assign_clusters(np.array(features), np.array(labels), np.array([[1.0, 0.02, 0.0], [0.1, 1.0, 0.0]]),
                          ClusterSettings(assign="knn", knn_k=1, noise=noise))
    assert fit.labels.tolist() == [0, NOISE] and fit.sizes.tolist() == expected


def test_knn_three_neighbour_noise_vote_through_the_algorithm():
    algo = meds("meds.assign=knn", "meds.noise=count")
    features, labels = knn_memory()
    features += [[0.0, 0.9, 0.1], [0.1, -0.9, 0.0]]
    remember(algo, "p0", "wrong", features, labels + [NOISE, NOISE])  # 4 noise members now
    # wrong row [0, 1, 0.05] (norm 1.00125): cos with row 3 = 0.99875, row 5 ([0, 0.9, 0.1], norm
    # 0.9055) = 0.905 / 0.90663 = 0.9982, row 1 = 0.1 / 0.90663 = 0.1103, the rest lower -> votes
    # -1, -1, 0 -> noise -> |C| = the 4 noise members (rows 3-6) -> 0.1 ln 5 = 0.1609438
    # wrong row [1, 0, 0]: rows 0 (1.0), 2 (0.99875), 1 (0.9939) -> 0 -> |C| 3 -> 0.1 ln 4 = 0.1386294
    r = batch([[0.0, 1.0, 0.05], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], [False, False, True], 3)
    algo.shape_rewards(r)
    assert r.extras[LABEL].tolist()[:2] == [NOISE, 0]
    assert r.extras[CLUSTER_SIZE].tolist() == [4, 3, 0]
    assert r.rewards.tolist() == pytest.approx([-0.1609438, -0.1386294, 1.0], abs=1e-6)


def test_knn_collapsed_memory_is_penalised_through_noise_counts():
    # The reference's own answer to the collapse: its plain HDBSCAN leaves identical errors all
    # noise, and a noise vote counts every noise member. Step 1: no labels yet -> |C| 0; the
    # memory refit (plain, one_mode noise) labels the 4 duplicates noise; step 2: every vote is
    # noise -> |C| = 4 -> 0.1 ln 5 = 0.1609438.
    algo = meds("meds.assign=knn", "meds.noise=count", "meds.one_mode=noise", "meds.duplicate_distance=0")
    identical = [[3.0, 1.0, 2.0]] * 4
    first = batch(identical + [[0.0, 0.0, 1.0]], [False] * 4 + [True], 5)
    algo.shape_rewards(first)
    algo.on_step_end(first, 1)
    assert first.extras[CLUSTER_SIZE].tolist() == [0] * 5
    assert algo.memory.bank("p0", "wrong", 3).labels == [NOISE] * 4
    second = batch(identical + [[0.0, 0.0, 1.0]], [False] * 4 + [True], 5)
    algo.shape_rewards(second)
    assert second.extras[CLUSTER_SIZE].tolist() == [4] * 4 + [0]
    assert second.extras[PENALTY][:4].tolist() == pytest.approx([0.1609438] * 4, abs=1e-6)


# ---------------------------------------------------------------- responses without \boxed{


def boxed_batch(kinds):
    r = batch([[1.0, 0.0, 0.0]] * len(kinds), [False] * len(kinds), len(kinds))
    r.extras["meds_anchor"] = list(kinds)
    return r


def test_unboxed_responses_are_skipped_like_the_reference():
    kinds = ["boxed", "last", "boxed", "truncated", "boxed"]
    algo = meds("meds.unboxed=skip")
    r = boxed_batch(kinds)
    algo.shape_rewards(r)
    # the three boxed rows are identical: one cluster of 3 -> 0.1 ln 4 = 0.1386294; the others
    # get no feature: |C| 0, no penalty, reward untouched
    assert r.extras[CLUSTER_SIZE].tolist() == [3, 0, 3, 0, 3]
    assert r.rewards.tolist() == pytest.approx([-0.1386294, 0.0, -0.1386294, 0.0, -0.1386294], abs=1e-6)
    algo.on_step_end(r, 1)
    assert len(algo.memory.bank("p0", "wrong", 3)) == 3  # never remembered either
    # the default anchors them on their last token and clusters all five: |C| 5 -> 0.1 ln 6
    default = meds()
    r = boxed_batch(kinds)
    default.shape_rewards(r)
    assert r.extras[CLUSTER_SIZE].tolist() == [5] * 5
    assert r.extras[PENALTY].tolist() == pytest.approx([0.1791759] * 5, abs=1e-6)


def test_unboxed_skip_reads_the_text_for_features_without_anchors():
    from algorithms.meds_feature_builders import answered_rows

    texts = ["so \\boxed{42}", "no box here", "cut off \\boxed{", "open \\boxed{4"]
    assert answered_rows(texts, None).tolist() == [True, False, False, True]
    assert answered_rows(texts, ["boxed", "last", "truncated", "last"]).tolist() == [True, False, False, False]
    assert torch.is_tensor(answered_rows([], None))


# ---------------------------------------------------------------- the two presets


def test_reference_and_paper_presets_build():
    from pathlib import Path

    from algorithms.meds_features import resolve_layers
    from meds_cli.engine.config import load_config
    from meds_cli.engine.training.algorithm_setup import build_algorithm

    configs = Path(__file__).resolve().parent.parent / "configs"
    reference = build_algorithm(load_config([str(configs / "meds_reference.yaml")]))
    cfg = reference.config
    assert (cfg.assign, cfg.knn_k, cfg.noise, cfg.one_mode, cfg.duplicate_distance, cfg.unboxed) == (
        "knn", 3, "count", "noise", 0.0, "skip")
    assert (cfg.memory_size, cfg.layers, cfg.alpha, cfg.beta, cfg.target, cfg.final_norm) == (
        0, "last:14", 0.1, 0.2, "wrong", False)
    assert reference.base.name == "dapo" and reference.settings.one_mode is False
    paper = build_algorithm(load_config([str(configs / "meds_paper.yaml")]))
    assert (paper.config.assign, paper.config.noise, paper.config.one_mode, paper.config.unboxed) == (
        "refit", "zero", "cluster", "last_token")
    # on the 28-layer Qwen2.5-Math models both read the same 14 layers
    assert resolve_layers(cfg.layers, 28) == resolve_layers(paper.config.layers, 28) == list(range(15, 29))
    # the two presets differ only in their meds section
    ref_run = load_config([str(configs / "meds_reference.yaml")])
    paper_run = load_config([str(configs / "meds_paper.yaml")])
    assert ref_run.rollout == paper_run.rollout and ref_run.optim == paper_run.optim
    assert ref_run.section("dapo") == paper_run.section("dapo")


def test_reference_preset_penalises_like_the_reference_formula():
    # the reference's 0.1 * min(log(|C| + 1), 2) for |C| = 0, 1, 3, 10: 0, 0.1 ln 2 = 0.0693147,
    # 0.1 ln 4 = 0.1386294, and ln 11 = 2.398 > 2 -> 0.2: the same as min(0.1 log(|C| + 1), 0.2)
    from algorithms.meds_memory import cluster_penalty

    sizes = torch.tensor([0, 1, 3, 10])
    reference = 0.1 * torch.clamp(torch.log(sizes.double() + 1), max=2.0)
    assert cluster_penalty(sizes, 0.1, 0.2).tolist() == pytest.approx(reference.tolist(), abs=1e-7)
    # beta != 2 alpha generalises it: slope 0.05, cap 0.3 -> 0.05 ln 11 = 0.1198948 (under the cap)
    assert cluster_penalty(torch.tensor([10]), 0.05, 0.3).tolist() == pytest.approx([0.1198948], abs=1e-6)
