"""Per-class k-means partition of Zarr-backed dask arrays.

The rules of docs/algorithm.md#kmeans-partition are the core's
(:func:`kahm_dask.partition.n_branches`, minimum cluster size, S ← S − 1 until every cluster is
large enough; docs/decisions.md#decision-pipeline-partition). A class whose k-means fits one
task is partitioned there by the estimator's own code (principal coordinates, k-means++), so
the pipeline and :class:`~kahm_dask.KAHMClassifier` give the same partition for the same rows
and seed. A larger class gets its top ``kmeans_dims`` principal coordinates out of core
(:func:`principal_coordinates`, a randomized SVD) and the same k-means on them in one task.
Only a class whose coordinates do not fit one task either (or any large class when
``kmeans_dims`` is None) is clustered out of core on all features: k-means|| initial centres
(:func:`scalable_kmeans_init`, with the weighted
re-clustering step that dask-ml's own k-means|| leaves out), then
``dask_ml.cluster.KMeans(init=centres)`` for the Lloyd iterations. ``oversampling_factor``
defaults to 2·K (dask-ml's default of 2 finds too few candidate centres for large K).
dask-ml's ``inertia_`` is not used.

Cost: dask-ml does not persist its input, so every k-means|| round and Lloyd iteration
re-reads the class's rows. The pipeline therefore clusters the class-grouped copy
(:mod:`kahm_dask.pipeline.training.layout`), where a class is one contiguous slice of its own chunks,
and holds a class in worker memory during its k-means when it fits the given budget.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import dask
import dask.array as da
import numpy as np
from dask_ml.cluster import KMeans
from sklearn.cluster import kmeans_plusplus
from sklearn.metrics import pairwise_distances_argmin_min
from threadpoolctl import threadpool_limits

from kahm_dask._random import child_seed_sequence
from kahm_dask.partition import (
    KMEANS_DIMS,
    cap_cluster_rows,
    default_min_cluster_size,
    kmeans_partition,
    n_branches,
    partition_with_min_size,
)

__all__ = ["scalable_kmeans_init", "partition_class", "partition_classes", "partition_in_task", "principal_coordinates",
           "fits_one_task", "IN_TASK_FACTOR", "POWER_ITERATIONS"]

log = logging.getLogger("kahm_dask")

_EMPTY = np.empty((0,))  # map_blocks meta: no call on an empty block to infer it


def _nearest_sq_distance(x: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Squared distance (m,) from each row of the block ``x`` (m, p) to its nearest row of
    ``C`` (k, p), in float64."""
    return pairwise_distances_argmin_min(np.asarray(x, dtype=np.float64), C)[1] ** 2


def _nearest_index(x: np.ndarray, C: np.ndarray) -> np.ndarray:
    return pairwise_distances_argmin_min(np.asarray(x, dtype=np.float64), C)[0]


def _uniform_block(x: np.ndarray, seed: np.random.SeedSequence, block_info=None) -> np.ndarray:
    """U(0, 1) draws (m,) for the rows of block i from ``child(seed, i)``: the same draws for
    every scheduler and worker count."""
    i = block_info[0]["chunk-location"][0]
    return np.random.default_rng(child_seed_sequence(seed, i)).random(x.shape[0])


def scalable_kmeans_init(
    Xc: da.Array,
    n_clusters: int,
    seed: np.random.SeedSequence,
    *,
    oversampling_factor: float,
    rounds: int,
) -> np.ndarray:
    """k-means|| initial centres (n_clusters, p) for the rows of ``Xc`` (N, p), float64
    (Bahmani et al. 2012, Algorithm 2, with the weighted re-clustering of its steps 7–8).

    1. C ← one row drawn uniformly; ψ = φ_X(C) = Σ_x d²(x, C).
    2. ``rounds`` times: keep every row x independently with probability
       min(1, ℓ·d²(x, C) / φ_X(C)) (ℓ = ``oversampling_factor``), C ← C ∪ kept rows.
    3. w_c = number of rows whose nearest candidate is c.
    4. The centres: k-means++ seeding on the candidates weighted by w
       (``sklearn.cluster.kmeans_plusplus``), so every centre is one data row.

    dask-ml's own k-means|| re-clusters the candidates *without* weights and returns means of
    different numbers of candidates. In high dimension the distance from a row to a mean of k
    rows of its mode is ≈ σ²p(1 + 1/k), so the centre averaging the most candidates takes the
    whole mode in the first Lloyd step and the others keep a handful of rows (measured on the
    4096-feature synthetic data: clusters of 1, 5, 4, 243, 1 and 5788 rows for S = 6); the
    minimum-cluster-size rule (docs/algorithm.md#kmeans-partition) then re-ran k-means once per
    decrement of S. Centres that are all single rows start Lloyd's iterations on an equal
    footing.

    Cost: 2 + rounds passes over ``Xc`` plus the reads of the kept rows. Randomness: the first
    row from ``child(seed, 0)``, round r's draws from ``child(seed, 1, r)`` per row block, the
    seeding from ``child(seed, 2)``.
    """
    N = Xc.shape[0]
    Xc = Xc.rechunk({1: -1})
    first = int(np.random.default_rng(child_seed_sequence(seed, 0)).integers(N))
    C = np.asarray(Xc[first : first + 1].compute(), dtype=np.float64)
    d2 = Xc.map_blocks(_nearest_sq_distance, C, drop_axis=1, dtype=np.float64, meta=_EMPTY).compute()
    for r in range(rounds):
        phi = float(d2.sum())
        if phi == 0.0:
            break
        draws = Xc.map_blocks(_uniform_block, child_seed_sequence(seed, 1, r), drop_axis=1,
                              dtype=np.float64, meta=_EMPTY).compute()
        kept = np.flatnonzero(oversampling_factor * d2 / phi > draws)
        if kept.size == 0:
            continue
        new = np.asarray(Xc[kept].compute(), dtype=np.float64)
        C = np.vstack([C, new])
        nearest_new = Xc.map_blocks(_nearest_sq_distance, new, drop_axis=1, dtype=np.float64, meta=_EMPTY)
        d2 = np.minimum(d2, nearest_new.compute())
    weights = np.bincount(
        Xc.map_blocks(_nearest_index, C, drop_axis=1, dtype=np.int64, meta=_EMPTY.astype(np.int64)).compute(),
        minlength=C.shape[0],
    ).astype(np.float64)
    if C.shape[0] <= n_clusters:
        extra = np.random.default_rng(child_seed_sequence(seed, 3)).choice(N, n_clusters, replace=False)
        return np.asarray(Xc[np.sort(extra)].compute(), dtype=np.float64)
    rs = int(child_seed_sequence(seed, 2).generate_state(1)[0] % (2**31 - 1))
    centres, _ = kmeans_plusplus(C, n_clusters, sample_weight=weights, random_state=rs)
    return centres


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

    The clustering step: k-means|| initial centres (:func:`scalable_kmeans_init`), then dask-ml's
    Lloyd iterations (``dask_ml.cluster.KMeans(init=centres)``), inside the core's
    minimum-cluster-size rule (:func:`~kahm_dask.partition.partition_with_min_size`: S ← S − 1
    until every cluster has at least ``min_cluster_size`` rows, attempt ``a`` seeded by
    ``child(seed, a)``, all zeros when S = 1; docs/algorithm.md#kmeans-partition).
    """

    def step(S: int, attempt_seed: np.random.SeedSequence) -> np.ndarray:
        centres = scalable_kmeans_init(
            Xc, S, attempt_seed, oversampling_factor=oversampling_factor or 2 * S, rounds=init_max_iter
        )
        km = KMeans(n_clusters=S, init=centres, max_iter=max_iter, n_init=1)
        km.fit(Xc)
        return km.labels_.compute() if hasattr(km.labels_, "compute") else km.labels_

    return partition_with_min_size(
        Xc.shape[0], n_clusters, step, min_cluster_size=min_cluster_size, seed=seed, logger=log
    )


#: Working memory of an in-task k-means in units of the class's float64 rows: the rows, their
#: centred copy for the principal coordinates, and slack for the projected rows and k-means.
IN_TASK_FACTOR = 3


def fits_one_task(n_rows: int, width: int, task_bytes: int) -> bool:
    """Whether a k-means of ``n_rows`` rows of ``width`` features runs in one task:
    ``IN_TASK_FACTOR`` × their float64 bytes ≤ ``task_bytes``."""
    return IN_TASK_FACTOR * n_rows * 8 * width <= task_bytes

#: Power iterations of the randomized SVD behind :func:`principal_coordinates` (Halko et al.
#: 2011, Algorithm 4.3: the error of the range falls as (σ_{k+1}/σ_k)^(2q+1)), and its
#: oversampling (10, their and dask's default).
POWER_ITERATIONS = 2


def principal_coordinates(Xc: da.Array, n_dims: int, seed: np.random.SeedSequence) -> da.Array:
    """The rows of one class (dask array (N_c, p), p > ``n_dims``) in their top ``n_dims``
    principal coordinates, a dask array (N_c, n_dims) float64 whose inputs are already computed
    on the workers (a task that takes it gets it from there, not through the client).

    ``U_k Σ_k`` of a randomized thin SVD of the centred rows ``Xc − x̄``
    (``dask.array.linalg.svd_compressed``: :data:`POWER_ITERATIONS` power iterations, 10 extra
    samples, each intermediate computed before the next pass, so the rows are re-read, never
    held). This is :func:`kahm_dask.partition.kmeans_space` (``(Y − ȳ) V`` with V the top
    eigenvectors of the centred Gram matrix) up to a rotation and the randomized range's
    error: exact when the centred rows have rank ≤ ``n_dims``. It costs 2q + 3 passes over the
    rows (the mean, then 2q + 2 for the SVD) of at most 2·N_c·p·(n_dims + 10) flops each,
    against a Lloyd pass per k-means iteration of 2·N_c·p·S on all p features. ``seed`` fixes
    the random test matrix (not private: it shapes the k-means only).
    """
    X = Xc.astype(np.float64)
    mean = X.mean(axis=0).compute()
    u, sigma, _ = da.linalg.svd_compressed(
        X - mean, n_dims, n_power_iter=POWER_ITERATIONS, seed=int(seed.generate_state(1)[0]), compute=True
    )
    return u * sigma


def partition_in_task(
    Xc: np.ndarray, n_clusters: int, min_cluster_size: int, seed: np.random.SeedSequence,
    n_init: int, kmeans_dims: int | None,
) -> np.ndarray:
    """The estimator's k-means partition (:func:`~kahm_dask.partition.kmeans_partition`) of one
    class's rows (N_c, p), run inside one task with one BLAS/OpenMP thread."""
    with threadpool_limits(limits=1):
        return kmeans_partition(
            np.asarray(Xc, dtype=np.float64), n_clusters, min_cluster_size=min_cluster_size,
            random_state=seed, n_init=n_init, kmeans_dims=kmeans_dims,
        )


def partition_classes(
    X_by_class: da.Array,
    class_bounds: Sequence[tuple[int, int, int]],
    *,
    n_components: int,
    block_size: int,
    s_rule: str,
    min_cluster_size: int | None,
    seed: np.random.SeedSequence,
    n_init: int = 1,
    kmeans_dims: int | None = KMEANS_DIMS,
    task_bytes: int = 0,
    oversampling_factor: float | None = None,
    init_max_iter: int = 5,
    max_iter: int = 100,
    persist_bytes: int = 0,
    max_concurrent_classes: int = 4,
    max_cluster_rows: int | None = None,
) -> np.ndarray:
    """Within-class cluster labels for every row of the class-grouped copy ``X_by_class``
    (dask array (N, p), class code c in rows [start, stop) for each ``(c, start, stop)`` of
    ``class_bounds``; :func:`~kahm_dask.pipeline.training.layout.class_layout`).

    Returns (N,) int64 labels in the copy's row order; class code c uses the seed
    ``child(seed, c)`` and its rows get labels 0..S_c − 1. A class whose k-means fits one
    task (``IN_TASK_FACTOR`` × its float64 rows ≤ ``task_bytes``) is partitioned in one task
    by the estimator's own rule (:func:`~kahm_dask.partition.kmeans_partition` with ``n_init``
    and ``kmeans_dims``: the same labels as :class:`~kahm_dask.KAHMClassifier` for the same
    rows and seed). A larger class, when ``kmeans_dims`` < p and three times its (N_c,
    kmeans_dims) float64 coordinates fit ``task_bytes``, gets the same k-means in one task on
    its :func:`principal_coordinates`. Any other class is partitioned out of core by
    :func:`partition_class` (k-means‖ + dask-ml). A class of either of the last two kinds whose
    rows take at most ``persist_bytes`` is held in worker memory while its SVD passes or Lloyd
    iterations run (read once from the store instead of once per pass; the same labels), and
    such classes run concurrently only as far as their held rows fit ``persist_bytes`` together.
    With ``max_cluster_rows``, a cluster larger than that is split
    (:func:`~kahm_dask.partition.cap_cluster_rows`), which bounds the memory of every training
    task.
    """
    labels = np.zeros(X_by_class.shape[0], dtype=np.int64)
    mcs = min_cluster_size or default_min_cluster_size(n_components)
    p = X_by_class.shape[1]
    row_bytes = X_by_class.dtype.itemsize * p
    jobs = [(c, a, b, n_branches(b - a, block_size, s_rule)) for c, a, b in class_bounds]
    jobs = [job for job in jobs if job[3] > 1]
    in_task = [job for job in jobs if fits_one_task(job[2] - job[1], p, task_bytes)]
    projected = ([job for job in jobs if job not in in_task and fits_one_task(job[2] - job[1], kmeans_dims, task_bytes)]
                 if kmeans_dims is not None and p > kmeans_dims else [])
    out_of_core = [job for job in jobs if job not in in_task and job not in projected]
    if in_task:
        tasks = [
            dask.delayed(partition_in_task, pure=True)(X_by_class[a:b], S, mcs, child_seed_sequence(seed, c),
                                                        n_init, kmeans_dims)
            for c, a, b, S in in_task
        ]
        for (_, a, b, _), part in zip(in_task, dask.compute(*tasks), strict=True):
            labels[a:b] = part

    def held(Xc: da.Array) -> da.Array:
        """The class's rows, persisted in worker memory when they take at most ``persist_bytes``:
        the passes of its SVD or Lloyd iterations then read memory, not Zarr."""
        return Xc.persist() if Xc.nbytes <= persist_bytes else Xc

    def concurrency(classes: list[tuple[int, int, int, int]]) -> int:
        """Classes fitted at once: ``max_concurrent_classes``, or as many as their held rows fit
        ``persist_bytes`` together."""
        sizes = [(b - a) * row_bytes for _, a, b, _ in classes if (b - a) * row_bytes <= persist_bytes]
        limit = max_concurrent_classes if not sizes else persist_bytes // max(sizes)
        return max(1, min(len(classes), limit, max_concurrent_classes))

    def project_class(job: tuple[int, int, int, int]) -> None:
        c, a, b, S = job
        class_seed = child_seed_sequence(seed, c)
        Z = principal_coordinates(held(X_by_class[a:b]), kmeans_dims, class_seed)
        labels[a:b] = dask.delayed(partition_in_task, pure=True)(Z, S, mcs, class_seed, n_init, None).compute()

    def one_class(job: tuple[int, int, int, int]) -> None:
        c, a, b, S = job
        labels[a:b] = partition_class(
            held(X_by_class[a:b]),
            S,
            min_cluster_size=mcs,
            seed=child_seed_sequence(seed, c),
            oversampling_factor=oversampling_factor,
            init_max_iter=init_max_iter,
            max_iter=max_iter,
        )

    # Classes are independent: fitting them concurrently overlaps the per-pass scheduling
    # latency (each SVD pass and Lloyd step is a small graph). Results do not depend on order.
    with ThreadPoolExecutor(max_workers=concurrency(projected)) as pool:
        list(pool.map(project_class, projected))
    with ThreadPoolExecutor(max_workers=concurrency(out_of_core)) as pool:
        list(pool.map(one_class, out_of_core))
    for _, a, b in class_bounds:
        labels[a:b] = cap_cluster_rows(labels[a:b], max_cluster_rows)
    return labels
