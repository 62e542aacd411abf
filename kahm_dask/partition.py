"""k-means partition rules of the wide KAHM (docs/algorithm.md#kmeans-partition).

``S = max(1, round_half_up(N / N_b))`` (or ``ceil``); k-means++ with 10 restarts and a
seeded stream per run; while a cluster has fewer than ``min_cluster_size`` rows, S ← S − 1
and re-cluster, down to S = 1. The Dask pipeline applies the same rules with dask-ml.
Decisions: docs/algorithm.md#decision-s-rule, docs/algorithm.md#decision-min-cluster-size.
"""

from __future__ import annotations

import math

import numpy as np
from sklearn.cluster import KMeans

from kahm_dask._random import as_seed_sequence, child_seed_sequence
from kahm_dask._validation import check_positive_int

__all__ = [
    "n_branches",
    "default_min_cluster_size",
    "kmeans_partition",
    "check_partition",
    "cap_cluster_rows",
]

S_RULES = ("round", "ceil")


def n_branches(n_samples: int, block_size: int = 1000, rule: str = "round") -> int:
    """Number of branches S for N samples and block size N_b (eq. 61,
    docs/algorithm.md#decision-s-rule)."""
    check_positive_int(block_size, "block_size")
    if rule == "round":
        S = math.floor(n_samples / block_size + 0.5)
    elif rule == "ceil":
        S = math.ceil(n_samples / block_size)
    else:
        raise ValueError(f"s_rule must be one of {S_RULES}, got {rule!r}.")
    return max(1, int(S))


def default_min_cluster_size(n_components: int) -> int:
    """``max(30, n + 2)`` (docs/algorithm.md#decision-min-cluster-size)."""
    return max(30, n_components + 2)


def kmeans_partition(
    Y: np.ndarray,
    n_clusters: int,
    *,
    min_cluster_size: int,
    random_state=None,
    n_init: int = 10,
    max_iter: int = 10_000,
    tol: float = 1e-4,
) -> np.ndarray:
    """Cluster the rows of ``Y`` (N, p) into at most ``n_clusters`` parts
    (docs/algorithm.md#kmeans-partition).

    Attempt ``a`` (S = n_clusters − a) uses the k-means seed stream ``child(seed, a)``.
    Returns (N,) int64 labels in ``0..S−1``; every part has at least ``min_cluster_size``
    rows unless S = 1.
    """
    N = Y.shape[0]
    seed = as_seed_sequence(random_state)
    S = min(int(n_clusters), N)
    attempt = 0
    while S > 1:
        rs = int(child_seed_sequence(seed, attempt).generate_state(1)[0])
        km = KMeans(S, init="k-means++", n_init=n_init, max_iter=max_iter, tol=tol, random_state=rs)
        labels = km.fit_predict(Y).astype(np.int64)
        if np.bincount(labels, minlength=S).min() >= min_cluster_size:
            return labels
        S -= 1
        attempt += 1
    return np.zeros(N, dtype=np.int64)


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
