"""MEDS clustering of a step's prompts in worker processes (`meds.cluster_workers`).

At the paper's scale a step clusters 512 prompts, each an HDBSCAN fit over up to a few hundred
remembered responses plus 16 new ones: seconds on one core, while the prompts are independent.
`assign_all` and `labels_all` run those fits over a pool of worker processes and return the
results in the order of the jobs. The pool (loky, as vendored by joblib: fresh interpreters that,
unlike multiprocessing's spawn and forkserver, never re-run the caller's __main__, and no fork of
a trainer holding threads or a GPU) is started at the first step that needs it and kept for the
rest of the run, without an idle timeout: a step of the paper's setting spends minutes
generating between two clusterings, and a restart costs each worker an import of this package.
Workers run one thread each (the prompts are the parallelism). Every fit is a deterministic
function of its points (the random control's shuffle included, meds_clusterers.ShuffledLabels),
so the parallel results equal the serial ones exactly; small steps (fewer jobs than `min_jobs`)
stay serial, where a pool would cost more than it saves.
"""

from __future__ import annotations

import warnings
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from algorithms.meds_memory import Assignment, ClusterSettings, assign_clusters
from meds_cli.core.cpu_budget import worker_count

MIN_JOBS = 32  # below this a step is clustered in the training process itself
MAX_AUTO_WORKERS = 8  # a step of the paper's size takes seconds serially: more workers would mostly idle
CHUNKS_PER_WORKER = 4  # jobs go to workers in this many interleaved chunks each: balance vs. overhead


def resolve_workers(requested: int) -> int:
    """`meds.cluster_workers`: requested > 0 as given; 0 = this process's share of the usable
    cores (meds_cli/core/cpu_budget.py: affinity mask / LOCAL_WORLD_SIZE), at most
    MAX_AUTO_WORKERS (each worker holds about 300 MB: numpy, scipy, scikit-learn, hdbscan, torch)."""
    return requested if requested > 0 else worker_count(cap=MAX_AUTO_WORKERS)


def _assign_chunk(jobs: list, settings: ClusterSettings) -> list[Assignment]:
    return [assign_clusters(memory, labels, batch, settings) for memory, labels, batch in jobs]


def _labels_chunk(point_sets: list, settings: ClusterSettings) -> list[np.ndarray]:
    return [settings.labels(points) for points in point_sets]


_POOLS: dict[int, object] = {}
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def _pool(workers: int):
    pool = _POOLS.get(workers)
    if pool is None:
        from joblib.externals.loky import ProcessPoolExecutor

        pool = _POOLS[workers] = ProcessPoolExecutor(workers, timeout=None, env=ONE_THREAD)
    return pool


def _one_thread(function, items: list, settings: ClusterSettings) -> list:
    """function(items, settings) here, with BLAS and OpenMP on one thread as in the workers: the
    same arithmetic (so the same labels) whichever path runs, and no threads spinning on tiny
    matrices (sklearn's k-means is many times slower with them on a busy machine)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return function(items, settings)


def _map_chunks(function, items: list, settings: ClusterSettings, workers: int, min_jobs: int) -> list:
    """function(chunk, settings) over interleaved chunks of `items`, results back in item order."""
    workers = min(workers, len(items))
    if workers <= 1 or len(items) < min_jobs:
        return _one_thread(function, items, settings)
    count = min(len(items), workers * CHUNKS_PER_WORKER)
    # Interleaved (item i -> chunk i % count): neighbouring prompts often have similar memory sizes.
    chunks = [items[c::count] for c in range(count)]
    try:
        done = list(_pool(workers).map(function, chunks, [settings] * count))
    except BrokenProcessPool:  # a worker died (killed, out of memory): finish this step here
        _POOLS.pop(workers, None)
        warnings.warn("MEDS clustering workers died; this step is clustered in the training process", stacklevel=2)
        return _one_thread(function, items, settings)
    out = [None] * len(items)
    for c, results in enumerate(done):
        out[c::count] = results
    return out


def assign_all(jobs: list[tuple[np.ndarray, np.ndarray, np.ndarray]], settings: ClusterSettings, workers: int = 1,
               min_jobs: int = MIN_JOBS) -> list[Assignment]:
    """assign_clusters(memory, memory_labels, batch, settings) for every job, in order."""
    return _map_chunks(_assign_chunk, list(jobs), settings, workers, min_jobs)


def labels_all(point_sets: list[np.ndarray], settings: ClusterSettings, workers: int = 1,
               min_jobs: int = MIN_JOBS) -> list[np.ndarray]:
    """settings.labels(points) for every point set, in order (the knn mode's refits of memory)."""
    return _map_chunks(_labels_chunk, list(point_sets), settings, workers, min_jobs)
