"""MEDS clusterers: the choices of `meds.clusterer`, for ablations of step 3 (docs/algorithms.md MEDS).

The paper clusters each prompt's logic features with HDBSCAN (min_cluster_size 2, min_samples 1);
an ablation asks whether that choice matters. Every clusterer here maps the rows of a [n, D]
feature array to labels, -1 marking noise (a point that belongs to no cluster and, with
`meds.noise: zero`, gets no penalty), and sees the features L2-normalised, as HDBSCAN does:
- hdbscan: algorithms.meds_memory.hdbscan_labels, the paper's choice (the default);
- kmeans / agglomerative (Ward linkage): `meds.n_clusters` clusters, or with 0 the k in
  2..`meds.max_clusters` of the best silhouette score. They have no notion of noise, so a cluster
  smaller than `meds.min_cluster_size` counts as noise: a lone response is then treated as HDBSCAN
  treats it, instead of paying the penalty of a cluster of one;
- dbscan: radius `meds.dbscan_eps` on the normalised features (Euclidean = chord distance, 0..2),
  a core point needs `meds.min_cluster_size` points within it (itself included).
Sets too small to cluster (fewer than max(2, min_cluster_size) points) are all noise, as in
hdbscan_labels.

The random control (`meds.features: random`, algorithms/meds_feature_builders.py) wraps the
configured clusterer in `ShuffledLabels`: the same number of clusters, the same sizes and the same
number of noise points, but which response sits in which cluster is random; it isolates the value
of the features from the value of having clusters of that shape at all.

`cluster_settings` is the one function that turns a `meds:` section into ClusterSettings.
"""

from __future__ import annotations

import hashlib
import warnings
from functools import partial
from typing import Callable

import numpy as np

from algorithms.diversity import l2_normalize
from algorithms.meds_memory import NOISE, ClusterSettings, hdbscan_labels
from meds_cli.core.registry import Registry

Labeller = Callable[[np.ndarray], np.ndarray]
CLUSTERERS: Registry = Registry("MEDS clusterer")


def _too_small(points: np.ndarray, min_cluster_size: int) -> bool:
    return len(points) < max(2, min_cluster_size)


def small_clusters_as_noise(labels: np.ndarray, min_cluster_size: int) -> np.ndarray:
    """Labels with every cluster of fewer than `min_cluster_size` members set to noise (-1)."""
    labels = np.asarray(labels, dtype=np.int64).copy()
    values, counts = np.unique(labels[labels != NOISE], return_counts=True)
    for value, count in zip(values.tolist(), counts.tolist()):
        if count < min_cluster_size:
            labels[labels == value] = NOISE
    return labels


def best_k_by_silhouette(points: np.ndarray, fit: Callable[[np.ndarray, int], np.ndarray],
                         max_clusters: int) -> np.ndarray:
    """Labels of the k in 2..min(max_clusters, n - 1) with the highest silhouette score (ties: the
    smaller k). Identical points, or fewer than three, make one cluster."""
    from sklearn.metrics import silhouette_score

    n = len(points)
    distinct = len(np.unique(np.round(points, 12), axis=0))
    if n < 3 or distinct < 2:
        return np.zeros(n, dtype=np.int64)
    best, best_score = None, -np.inf
    for k in range(2, min(max_clusters, n - 1, distinct) + 1):
        labels = fit(points, k)
        if len(set(labels.tolist())) < 2:
            continue
        score = silhouette_score(points, labels)
        if score > best_score + 1e-12:
            best, best_score = labels, score
    return best if best is not None else np.zeros(n, dtype=np.int64)


def _kmeans(points: np.ndarray, k: int) -> np.ndarray:
    from sklearn.cluster import KMeans

    return KMeans(n_clusters=k, n_init=4, random_state=0).fit_predict(points).astype(np.int64)


def _agglomerative(points: np.ndarray, k: int) -> np.ndarray:
    from sklearn.cluster import AgglomerativeClustering

    return AgglomerativeClustering(n_clusters=k, linkage="ward").fit_predict(points).astype(np.int64)


def _fixed_or_auto(fit, points: np.ndarray, n_clusters: int, max_clusters: int, min_cluster_size: int) -> np.ndarray:
    if _too_small(points, min_cluster_size):
        return np.full(len(points), NOISE, dtype=np.int64)
    x = l2_normalize(points)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn warns when there are fewer distinct points than k
        if n_clusters > 0:
            labels = fit(x, min(n_clusters, len(x)))
        else:
            labels = best_k_by_silhouette(x, fit, max_clusters)
    return small_clusters_as_noise(labels, min_cluster_size)


def _dbscan(points: np.ndarray, eps: float, min_cluster_size: int) -> np.ndarray:
    if _too_small(points, min_cluster_size):
        return np.full(len(points), NOISE, dtype=np.int64)
    from sklearn.cluster import DBSCAN

    return DBSCAN(eps=eps, min_samples=min_cluster_size).fit_predict(l2_normalize(points)).astype(np.int64)


# Each factory returns a partial of a module-level function: a labeller must pickle, so that the
# prompts of a step can be clustered in worker processes (algorithms/meds_parallel.py).


@CLUSTERERS.register("hdbscan", "HDBSCAN (the paper): density clusters, noise for isolated responses")
def hdbscan_clusterer(config) -> Labeller:
    return partial(hdbscan_labels, min_cluster_size=config.min_cluster_size, min_samples=config.min_samples,
                   allow_single_cluster=config.allow_single_cluster, one_mode=config.one_mode == "cluster",
                   duplicate_distance=config.duplicate_distance)


@CLUSTERERS.register("kmeans", "k-means with meds.n_clusters clusters (0: best silhouette up to meds.max_clusters)")
def kmeans_clusterer(config) -> Labeller:
    return partial(_fixed_or_auto, _kmeans, n_clusters=config.n_clusters, max_clusters=config.max_clusters,
                   min_cluster_size=config.min_cluster_size)


@CLUSTERERS.register("agglomerative", "Ward agglomerative clustering, meds.n_clusters clusters (0: best silhouette)")
def agglomerative_clusterer(config) -> Labeller:
    return partial(_fixed_or_auto, _agglomerative, n_clusters=config.n_clusters, max_clusters=config.max_clusters,
                   min_cluster_size=config.min_cluster_size)


@CLUSTERERS.register("dbscan", "DBSCAN with radius meds.dbscan_eps on the normalised features")
def dbscan_clusterer(config) -> Labeller:
    return partial(_dbscan, eps=config.dbscan_eps, min_cluster_size=config.min_cluster_size)


def points_seed(points: np.ndarray) -> int:
    """A seed that is a function of the points' values (float64 bytes, SHA-256)."""
    data = np.ascontiguousarray(points, dtype=np.float64).tobytes()
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


class ShuffledLabels:
    """The random control: the wrapped clusterer's labels, randomly permuted over the points.

    The permutation is drawn from a generator seeded by the points themselves (`points_seed`), not
    from a global one: the same memory gets the same permutation in training, after a resume, in
    a worker process and in `meds cluster-inspect`, while different memories (every step adds
    responses) get unrelated ones."""

    def __init__(self, inner: Labeller):
        self.inner = inner

    def __call__(self, points: np.ndarray) -> np.ndarray:
        labels = self.inner(points)
        return np.random.default_rng(points_seed(points)).permutation(labels).astype(np.int64)


def cluster_settings(config) -> ClusterSettings:
    """The clustering a `meds:` config section asks for: the one place that reads it, used by
    training (algorithms/meds.py), `meds cluster-inspect` and `meds ablate`'s report, so the three
    cluster a memory the same way. The random control (`meds.features: random`) wraps the
    configured clusterer in ShuffledLabels. The default (hdbscan, logit features) leaves
    ClusterSettings.clusterer unset, so the paper's path runs hdbscan_labels directly."""
    from algorithms.meds_feature_builders import FEATURE_BUILDERS  # feature builders import torch and models

    shuffle = FEATURE_BUILDERS.get(config.features).shuffle_labels
    labeller = None
    if config.clusterer != "hdbscan" or shuffle:
        labeller = CLUSTERERS.get(config.clusterer)(config)
        if shuffle:
            labeller = ShuffledLabels(labeller)
    return ClusterSettings(config.min_cluster_size, config.min_samples, config.allow_single_cluster,
                           config.noise, config.assign, config.knn_k, one_mode=config.one_mode == "cluster",
                           duplicate_distance=config.duplicate_distance, clusterer=labeller)
