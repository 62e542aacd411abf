"""k-means partition rules of the wide KAHM (docs/algorithm.md#kmeans-partition).

``S = max(1, round_half_up(N / N_b))`` (or ``ceil``); k-means++ with 10 restarts and a
seeded stream per run; while a cluster has fewer than ``min_cluster_size`` rows, S ← S − 1
and re-cluster, down to S = 1 (:func:`partition_with_min_size`, written once for any clustering
step). The Dask pipeline applies the same rules with its k-means|| and dask-ml step.
Decisions: docs/decisions.md#decision-s-rule, docs/decisions.md#decision-min-cluster-size.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np
from scipy.linalg import eigh
from sklearn.cluster import KMeans

from kahm_dask._random import as_seed_sequence, child_seed_sequence
from kahm_dask.params import PARAMS, check_params

__all__ = [
    "n_branches",
    "default_min_cluster_size",
    "ClusteringStep",
    "partition_with_min_size",
    "kmeans_partition",
    "kmeans_space",
    "KMEANS_DIMS",
    "check_partition",
    "cap_cluster_rows",
]

S_RULES = PARAMS["s_rule"].choices


def n_branches(n_samples: int, block_size: int = 1000, rule: str = "round") -> int:
    """Number of branches S for N samples and block size N_b (eq. 61,
    docs/decisions.md#decision-s-rule)."""
    check_params({"block_size": block_size, "s_rule": rule}, "n_branches")
    if rule == "round":
        S = math.floor(n_samples / block_size + 0.5)
    else:
        S = math.ceil(n_samples / block_size)
    return max(1, int(S))


def default_min_cluster_size(n_components: int) -> int:
    """``max(30, n + 2)`` (docs/decisions.md#decision-min-cluster-size)."""
    return max(30, n_components + 2)


#: One clustering attempt: ``step(S, seed)`` → (N,) integer labels in ``0..S−1`` of the rows
#: being partitioned, for S ≥ 2 clusters and the attempt's seed stream.
ClusteringStep = Callable[[int, np.random.SeedSequence], np.ndarray]


def partition_with_min_size(
    n_rows: int,
    n_clusters: int,
    step: ClusteringStep,
    *,
    min_cluster_size: int,
    seed: np.random.SeedSequence,
    logger: logging.Logger | None = None,
) -> np.ndarray:
    """The minimum-cluster-size rule of docs/algorithm.md#kmeans-partition around any
    clustering ``step``.

    Starts at ``S = min(n_clusters, n_rows)``; attempt ``a = 0, 1, …`` calls
    ``step(S − a, child(seed, a))`` and is accepted when every one of its ``S − a`` clusters has
    at least ``min_cluster_size`` rows; otherwise S ← S − 1. So at most S − 1 calls; when S
    reaches 1 (or starts there) the result is all zeros and ``step`` is not called
    (docs/decisions.md#decision-min-cluster-size). ``logger``, if given, gets one INFO line per
    attempt.

    Returns (n_rows,) int64 labels in ``0..S−1``.
    """
    S, attempt = min(int(n_clusters), n_rows), 0
    while S > 1:
        labels = np.asarray(step(S, child_seed_sequence(seed, attempt)), dtype=np.int64)
        sizes = np.bincount(labels, minlength=S)
        if sizes.min() >= min_cluster_size:
            if logger is not None:
                logger.info("k-means: %d rows into %d clusters (attempt %d)", n_rows, S, attempt + 1)
            return labels
        if logger is not None:
            logger.info(
                "k-means: a cluster of %d rows < %d; retrying with S = %d", sizes.min(), min_cluster_size, S - 1
            )
        S -= 1
        attempt += 1
    return np.zeros(n_rows, dtype=np.int64)


#: Principal coordinates the k-means runs in by default (docs/algorithm.md#kmeans-space).
KMEANS_DIMS = PARAMS["kmeans_dims"].default


def kmeans_space(Y: np.ndarray, n_dims: int | None = KMEANS_DIMS) -> np.ndarray:
    """The rows of ``Y`` (N, p) in their top ``n_dims`` principal coordinates → (N, n_dims), or
    ``Y`` itself when ``n_dims`` is None or ``p ≤ n_dims`` (docs/algorithm.md#kmeans-space).

    ``(Y − ȳ) V`` with V (p, n_dims) the top eigenvectors of ``(Y − ȳ)ᵀ(Y − ȳ)`` (``eigh`` of
    the smaller Gram matrix, only the top ``n_dims`` pairs). Squared distances between rows
    shrink by exactly their part outside the subspace, so k-means here optimises the full
    objective up to the discarded variance, at ``n_dims / p`` of the cost per Lloyd step.

    >>> Y = np.random.default_rng(0).normal(size=(200, 80))
    >>> Z = kmeans_space(Y, 10)
    >>> Z.shape, bool(np.allclose(Z.mean(axis=0), 0))
    ((200, 10), True)
    >>> kmeans_space(Y, 100) is Y
    True
    """
    N, p = Y.shape
    if n_dims is None or p <= n_dims:
        return Y
    Yc = Y - Y.mean(axis=0)
    if p <= N:
        _, V = eigh(Yc.T @ Yc, subset_by_index=[p - n_dims, p - 1], overwrite_a=True, check_finite=False)
        return Yc @ V
    k = min(n_dims, N)
    w, U = eigh(Yc @ Yc.T, subset_by_index=[N - k, N - 1], overwrite_a=True, check_finite=False)
    return U * np.sqrt(np.maximum(w, 0.0))  # = Yc V for the matching right singular vectors


def kmeans_partition(
    Y: np.ndarray,
    n_clusters: int,
    *,
    min_cluster_size: int,
    random_state=None,
    n_init: int = 1,
    kmeans_dims: int | None = KMEANS_DIMS,
    max_iter: int = 10_000,
    tol: float = 1e-4,
) -> np.ndarray:
    """Cluster the rows of ``Y`` (N, p) into at most ``n_clusters`` parts
    (docs/algorithm.md#kmeans-partition).

    scikit-learn's k-means++ ``KMeans`` (``n_init`` restarts) on :func:`kmeans_space`
    ``(Y, kmeans_dims)``, inside :func:`partition_with_min_size`: attempt ``a``
    (S = n_clusters − a) seeds its k-means with the first word of ``child(seed, a)``.
    Returns (N,) int64 labels in ``0..S−1``; every part has at least ``min_cluster_size``
    rows unless S = 1.
    """
    Z = kmeans_space(Y, kmeans_dims) if min(int(n_clusters), Y.shape[0]) > 1 else Y

    def step(S: int, attempt_seed: np.random.SeedSequence) -> np.ndarray:
        rs = int(attempt_seed.generate_state(1)[0])
        km = KMeans(S, init="k-means++", n_init=n_init, max_iter=max_iter, tol=tol, random_state=rs)
        return km.fit_predict(Z)

    return partition_with_min_size(
        Y.shape[0], n_clusters, step, min_cluster_size=min_cluster_size, seed=as_seed_sequence(random_state)
    )


def check_partition(partition, n_samples: int, min_rows: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Validate a user-given partition: (N,) integer labels → (labels, sorted unique ids).

    Every part needs at least ``min_rows`` rows (a KAHM needs two samples to have spread).
    """
    labels = np.asarray(partition)
    if labels.shape != (n_samples,):
        raise ValueError(
            f"partition must have shape ({n_samples},) (one branch label per row), got {labels.shape}."
        )
    if labels.dtype.kind not in "iu":
        raise TypeError(f"partition must hold integer branch labels, got dtype {labels.dtype}.")
    ids, counts = np.unique(labels, return_counts=True)
    if counts.min() < min_rows:
        small = ids[counts < min_rows].tolist()
        raise ValueError(
            f"partition branch(es) {small} have fewer than {min_rows} rows; every branch "
            f"needs at least {min_rows} samples."
        )
    return labels, ids


def cap_cluster_rows(labels: np.ndarray, max_rows: int | None) -> np.ndarray:
    """Split every cluster of more than ``max_rows`` rows into ``⌈n / max_rows⌉`` parts.

    labels : (N,) integer cluster labels of one class. A cluster of n > max_rows rows becomes
    parts of ⌊n/k⌋ or ⌈n/k⌉ consecutive rows (in row order), k = ⌈n / max_rows⌉; the labels are
    renumbered 0..S' − 1 in order of the original label, then part. Bounds the rows, hence the
    memory, of every per-cluster task; no data are read, so on a partition of DP rows it is
    post-processing. ``max_rows`` None returns ``labels`` unchanged.

    >>> cap_cluster_rows(np.array([0, 0, 0, 0, 0, 1]), 2).tolist()
    [0, 0, 1, 1, 2, 3]
    """
    if max_rows is None:
        return labels
    if max_rows < 2:
        raise ValueError(f"max_rows must be >= 2 (a KAHM needs 2 rows), got {max_rows}.")
    labels = np.asarray(labels)
    out = np.empty(labels.shape, dtype=np.int64)
    next_label = 0
    for s in np.unique(labels):
        rows = np.flatnonzero(labels == s)
        k = -(-rows.size // max_rows)
        out[rows] = next_label + (np.arange(rows.size) * k) // rows.size
        next_label += k
    return out
