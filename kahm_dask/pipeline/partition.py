"""Per-class k-means partition with dask-ml on Zarr-backed dask arrays (ALGORITHM.md §6).

The §6 rules are the core's (:func:`kahm_dask.partition.n_branches`, minimum cluster size,
S ← S − 1 until every cluster is large enough). The clustering itself is
``dask_ml.cluster.KMeans(init="k-means||")`` so that it scales to data larger than memory;
``oversampling_factor`` defaults to 2·K (the default of 2 finds too few candidate centres for
large K, ARCHITECTURE.md). dask-ml's ``inertia_`` is not used.

Cost note: dask-ml does not persist its input, so every Lloyd iteration re-reads the class's
rows from Zarr; since a class's rows are spread over every chunk of the store, each iteration
of each class reads the whole store. That is the bottleneck of larger-than-memory runs today
(docs/design.md, "Known limits").
"""

from __future__ import annotations

import logging
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
    X: da.Array,
    y_codes: np.ndarray,
    n_classes: int,
    *,
    n_components: int,
    block_size: int,
    s_rule: str,
    min_cluster_size: int | None,
    seed: np.random.SeedSequence,
    oversampling_factor: float | None = None,
    init_max_iter: int = 5,
    max_iter: int = 100,
    max_concurrent_classes: int = 4,
) -> np.ndarray:
    """Within-class cluster labels (N,) for every row of ``X`` (dask array (N, p)).

    Class code c uses the seed ``child(seed, c)``; rows of class c get labels 0..S_c − 1.
    """
    labels = np.zeros(X.shape[0], dtype=np.int64)
    mcs = min_cluster_size or default_min_cluster_size(n_components)

    def one_class(c: int) -> tuple[np.ndarray, np.ndarray | None]:
        rows = np.flatnonzero(y_codes == c)
        S = n_branches(rows.size, block_size, s_rule)
        if S == 1:
            return rows, None
        return rows, partition_class(
            X[rows],
            S,
            min_cluster_size=mcs,
            seed=child_seed_sequence(seed, c),
            oversampling_factor=oversampling_factor,
            init_max_iter=init_max_iter,
            max_iter=max_iter,
        )

    # Classes are independent: fitting them concurrently overlaps dask-ml's per-iteration
    # scheduling latency (each Lloyd step is a small graph). Results do not depend on order.
    with ThreadPoolExecutor(max_workers=max(1, min(n_classes, max_concurrent_classes))) as pool:
        for rows, class_labels in pool.map(one_class, range(n_classes)):
            if class_labels is not None:
                labels[rows] = class_labels
    return labels
