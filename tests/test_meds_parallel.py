"""MEDS clustering over worker processes gives exactly the serial results (algorithms/meds_parallel.py)."""

import numpy as np
import pytest
import torch

from algorithms.meds import CLUSTER_SIZE, LABEL
from algorithms.meds_clusterers import cluster_settings
from algorithms.meds_memory import ClusterSettings
from algorithms.meds_parallel import MAX_AUTO_WORKERS, MIN_JOBS, assign_all, labels_all, resolve_workers
from tests.conftest import tiny_config
from tests.test_meds_shaping import batch, meds


def jobs(count, seed=0):
    """(memory, memory labels, batch) per prompt: a few modes, memories of varied sizes."""
    rng = np.random.default_rng(seed)
    out = []
    for p in range(count):
        modes = rng.standard_normal((3, 5)) + 2.0
        memory = modes[rng.integers(0, 3, size=p % 9 * 3)] + 0.05 * rng.standard_normal((p % 9 * 3, 5))
        labels = rng.integers(-1, 3, size=len(memory))
        new = modes[rng.integers(0, 3, size=6)] + 0.05 * rng.standard_normal((6, 5))
        out.append((memory, labels, new))
    return out


def same_assignments(a, b):
    return all(np.array_equal(x.sizes, y.sizes) and np.array_equal(x.labels, y.labels) and x.clusters == y.clusters
               and (x.fitted_labels is None) == (y.fitted_labels is None)
               and (x.fitted_labels is None or np.array_equal(x.fitted_labels, y.fitted_labels)) for x, y in zip(a, b))


@pytest.mark.parametrize("overrides", [[], ["meds.assign=knn", "meds.noise=count"], ["meds.features=random"],
                                       ["meds.clusterer=dbscan"]])
def test_parallel_assignments_equal_serial(overrides):
    settings = cluster_settings(tiny_config("algo.name=meds", *overrides).section("meds"))
    work = jobs(24)
    serial = assign_all(work, settings, workers=1)
    parallel = assign_all(work, settings, workers=2, min_jobs=0)
    assert len(parallel) == len(work) and same_assignments(serial, parallel)
    points = [memory for memory, _, _ in work]
    assert all(np.array_equal(a, b) for a, b in zip(labels_all(points, settings, 1),
                                                    labels_all(points, settings, 2, min_jobs=0)))


def test_algorithm_step_is_the_same_with_two_workers():
    rng = np.random.default_rng(3)
    groups = MIN_JOBS + 4  # enough prompts for the pool to be used
    algos = [meds("meds.cluster_workers=1", "meds.assign=knn"), meds("meds.cluster_workers=2", "meds.assign=knn")]
    for step in (1, 2):
        features = (rng.standard_normal((groups * 4, 3)) + 1.0).tolist()
        correct = [bool(v) for v in rng.integers(0, 2, size=groups * 4)]
        results = []
        for algo in algos:
            r = batch(features, correct, 4)
            algo.shape_rewards(r)
            algo.on_step_end(r, step)
            results.append(r)
        assert torch.equal(results[0].extras[CLUSTER_SIZE], results[1].extras[CLUSTER_SIZE])
        assert torch.equal(results[0].extras[LABEL], results[1].extras[LABEL])
        assert torch.equal(results[0].rewards, results[1].rewards)
    assert algos[0].memory.state_dict().keys() == algos[1].memory.state_dict().keys()
    for pid in algos[0].memory.banks:
        assert algos[0].memory.bank(pid, "wrong", 3).labels == algos[1].memory.bank(pid, "wrong", 3).labels


def test_worker_count(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert resolve_workers(0) == 2 and resolve_workers(3) == 3  # cores shared among a node's 8 ranks
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert resolve_workers(0) == MAX_AUTO_WORKERS == 8 and resolve_workers(12) == 12
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0}, raising=False)
    assert resolve_workers(0) == 1
    # a pool is never used for fewer jobs than MIN_JOBS, or one worker
    assert assign_all([], ClusterSettings(), workers=4) == []
