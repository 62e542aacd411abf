"""Per-class k-means partition with dask-ml on Zarr-backed dask arrays (ALGORITHM.md §6).

The §6 rules are the core's (:func:`kahm_dask.partition.n_branches`, minimum cluster size,
S ← S − 1 until every cluster is large enough). The clustering itself is
``dask_ml.cluster.KMeans(init="k-means||")`` so that it scales to data larger than memory;
``oversampling_factor`` defaults to 2·K (the default of 2 finds too few candidate centres for
large K, ARCHITECTURE.md). dask-ml's ``inertia_`` is not used.

Cost: dask-ml does not persist its input, so every k-means|| round and Lloyd iteration
re-reads the class's rows. The pipeline therefore clusters the class-grouped copy
(:mod:`kahm_dask.pipeline.layout`), where a class is one contiguous slice of its own chunks,
and holds a class in worker memory during its k-means when it fits the given budget.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import dask.array as da
import numpy as np
from dask_ml.cluster import KMeans

from kahm_dask._random import child_seed_sequence
from kahm_dask.partition import default_min_cluster_size, n_branches

__all__ = ["partition_class", "partition_classes"]

log = logging.getLogger("kahm_dask")


def partition_class(
    Xc: da.Array,
    n_clusters: int,
    *,
    min_cluster_size: int,
    seed: np.random.SeedSequence,
    oversampling_factor: float | None = None,
    init_max_iter: int = 5,
    max_iter: int = 100,
) -> np.ndarray:
    """Cluster the rows of one class (a dask array (N_c, p)) → (N_c,) int64 labels.

    Attempt ``a`` uses the seed ``child(seed, a)``. Returns all zeros when S = 1.
    """
    N = Xc.shape[0]
    S, attempt = min(int(n_clusters), N), 0
    while S > 1:
        rs = int(child_seed_sequence(seed, attempt).generate_state(1)[0] % (2**31 - 1))
        km = KMeans(
            n_clusters=S,
            init="k-means||",
            oversampling_factor=oversampling_factor or 2 * S,
            init_max_iter=init_max_iter,
            max_iter=max_iter,
            random_state=rs,
        )
        km.fit(Xc)
        labels = np.asarray(km.labels_.compute() if hasattr(km.labels_, "compute") else km.labels_, dtype=np.int64)
        sizes = np.bincount(labels, minlength=S)
        if sizes.min() >= min_cluster_size:
            log.info("k-means: %d rows into %d clusters (attempt %d)", N, S, attempt + 1)
            return labels
        log.info("k-means: a cluster of %d rows < %d; retrying with S = %d", sizes.min(), min_cluster_size, S - 1)
        S -= 1
        attempt += 1
    return np.zeros(N, dtype=np.int64)


def partition_classes(
    X_by_class: da.Array,
    class_bounds: Sequence[tuple[int, int, int]],
    *,
    n_components: int,
    block_size: int,
    s_rule: str,
    min_cluster_size: int | None,
    seed: np.random.SeedSequence,
    oversampling_factor: float | None = None,
    init_max_iter: int = 5,
    max_iter: int = 100,
    persist_bytes: int = 0,
    max_concurrent_classes: int = 4,
) -> np.ndarray:
    """Within-class cluster labels for every row of the class-grouped copy ``X_by_class``
    (dask array (N, p), class code c in rows [start, stop) for each ``(c, start, stop)`` of
    ``class_bounds``; :func:`~kahm_dask.pipeline.layout.class_layout`).

    Returns (N,) int64 labels in the copy's row order; class code c uses the seed
    ``child(seed, c)`` and its rows get labels 0..S_c − 1. A class whose rows take at most
    ``persist_bytes`` is held in (worker) memory while its k-means runs, so the Lloyd
    iterations do not re-read it from Zarr; classes run concurrently only as far as their
    held rows fit ``persist_bytes`` together.
    """
    labels = np.zeros(X_by_class.shape[0], dtype=np.int64)
    mcs = min_cluster_size or default_min_cluster_size(n_components)
    row_bytes = X_by_class.dtype.itemsize * X_by_class.shape[1]
    jobs = [(c, a, b, n_branches(b - a, block_size, s_rule)) for c, a, b in class_bounds]
    jobs = [job for job in jobs if job[3] > 1]
    held = [(b - a) * row_bytes for _, a, b, _ in jobs if (b - a) * row_bytes <= persist_bytes]
    concurrency = max_concurrent_classes if not held else persist_bytes // max(held)

    def one_class(job: tuple[int, int, int, int]) -> None:
        c, a, b, S = job
        Xc = X_by_class[a:b]
        if Xc.nbytes <= persist_bytes:
            Xc = Xc.persist()
        labels[a:b] = partition_class(
            Xc,
            S,
            min_cluster_size=mcs,
            seed=child_seed_sequence(seed, c),
            oversampling_factor=oversampling_factor,
            init_max_iter=init_max_iter,
            max_iter=max_iter,
        )

    # Classes are independent: fitting them concurrently overlaps dask-ml's per-iteration
    # scheduling latency (each Lloyd step is a small graph). Results do not depend on order.
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), concurrency, max_concurrent_classes))) as pool:
        list(pool.map(one_class, jobs))
    return labels
