"""Routing: evaluate each query on the ``n_probe`` branches whose centres are nearest to it.

A wide KAHM's distance is a minimum over its S branches (eq. 64), and every branch costs
O(N_b · (n + p)) per query, so an exhaustive prediction grows with S. The branches are k-means
clusters, so the branch of minimum Γ is almost always among those whose centre (the mean of
its training rows) is nearest to the query. Routing computes the squared Euclidean distances
from the queries to the S centres, one (m, S) GEMM of O(m · S · p), keeps the ``n_probe``
nearest per query and evaluates each branch only on the queries that probe it
(docs/algorithm.md#routing). The per-query cost is then O(S · p + n_probe · N_b · (n + p)),
nearly flat in S. With ``n_probe ≥ S`` callers take the exhaustive path, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

__all__ = ["nearest_centres", "probed_rows", "routed_intervals", "routed_minimum", "rows_per_centre"]


def nearest_centres(Yq: np.ndarray, centres: np.ndarray, n_probe: int) -> np.ndarray:
    """Indices (m, k) of the ``k = min(n_probe, S)`` centres nearest to each query.

    Yq : (m, p) queries; centres : (S, p). Distances are ``‖y‖² − 2 y·c + ‖c‖²`` (the
    ``‖y‖²`` term is common to a row and dropped). Each row's indices come in increasing
    distance, equal distances by increasing index; a tie at the k-th place is cut by
    ``np.argpartition`` (deterministic).

    >>> C = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 3.0]])
    >>> nearest_centres(np.array([[9.0, 0.0], [0.0, 2.0]]), C, 2).tolist()
    [[1, 0], [2, 0]]
    """
    S = centres.shape[0]
    k = min(int(n_probe), S)
    score = np.einsum("ij,ij->i", centres, centres)[None, :] - 2.0 * (Yq @ centres.T)  # (m, S)
    if k == S:
        return np.argsort(score, axis=1, kind="stable")
    part = np.argpartition(score, k - 1, axis=1)[:, :k]
    # order the k kept ones by (distance, index) so ties keep the lower index
    kept = np.take_along_axis(score, part, axis=1)
    order = np.lexsort((part, kept), axis=1)
    return np.take_along_axis(part, order, axis=1)


def rows_per_centre(probes: np.ndarray, n_centres: int) -> list[np.ndarray]:
    """For each centre s, the sorted query rows (int64) whose probe list contains s.

    probes : (m, k) centre indices from :func:`nearest_centres` (distinct within a row).

    >>> [r.tolist() for r in rows_per_centre(np.array([[1, 0], [2, 0]]), 3)]
    [[0, 1], [0], [1]]
    """
    m, k = probes.shape
    flat = probes.ravel()
    order = np.argsort(flat, kind="stable")  # stable: rows stay sorted within a centre
    splits = np.cumsum(np.bincount(flat, minlength=n_centres))[:-1]
    return np.split(order // k, splits)


def probed_rows(Yq: np.ndarray, centres: np.ndarray, n_probe: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(s, rows)`` for every branch s that some query of ``Yq`` (m, p) probes, in branch order:
    ``rows`` the sorted indices of the queries whose ``n_probe`` nearest centres (S, p) include s
    (:func:`nearest_centres`, :func:`rows_per_centre`). The one routing rule of
    :func:`routed_minimum` and :func:`routed_intervals`.

    >>> [(s, r.tolist()) for s, r in probed_rows(np.array([[1.0], [19.0]]), np.array([[0.0], [10.0], [20.0]]), 1)]
    [(0, [0]), (2, [1])]
    """
    probes = nearest_centres(Yq, centres, n_probe)
    for s, rows in enumerate(rows_per_centre(probes, centres.shape[0])):
        if rows.size:
            yield s, rows


def routed_minimum(
    Yq: np.ndarray, centres: np.ndarray, n_probe: int, distance: Callable[[int, np.ndarray], np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """The routed ``Γ^{(k)}(y) = min_{s ∈ P_k(y)} Γ_s(y)`` (m,) of the queries ``Yq`` (m, p) and the
    branch s attaining it (m,), docs/algorithm.md#routing.

    ``P_k(y)`` are the ``n_probe`` centres (S, p) nearest to y (:func:`nearest_centres`).
    ``distance(s, rows)`` gives Γ_s (r,) of the query rows ``rows`` (r, p); it is called once
    per branch that some query probes, in branch order, on those queries only. Ties keep the
    lowest branch.

    >>> C = np.array([[0.0], [10.0], [20.0]])
    >>> routed_minimum(np.array([[1.0], [19.0]]), C, 1, lambda s, rows: np.abs(rows[:, 0] - C[s, 0]))
    (array([1., 1.]), array([0, 2]))
    """
    gamma = np.full(Yq.shape[0], np.inf)
    index = np.zeros(Yq.shape[0], dtype=np.int64)
    for s, rows in probed_rows(Yq, centres, n_probe):
        g = distance(s, Yq[rows])
        better = g < gamma[rows]
        gamma[rows[better]] = g[better]
        index[rows[better]] = s
    return gamma, index


def routed_intervals(
    Yq: np.ndarray, centres: np.ndarray, n_probe: int,
    interval: Callable[[int, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The routed minimum (m,) as in :func:`routed_minimum` of an evaluation that comes with an
    interval around another one, and the interval (lower (m,), upper (m,)) that holds that other
    evaluation's routed minimum (docs/algorithm.md#certified-prediction).

    ``interval(s, rows)`` gives Γ_s (r,) of the query rows ``rows`` (r, p) and the interval
    ``lower_s ≤ Γ'_s ≤ upper_s`` (each (r,)) of the other evaluation Γ'_s; branches are probed
    as in :func:`routed_minimum`, by the same rule. Both evaluations route a query to the same
    branches P, so ``min_{s ∈ P} Γ'_s`` lies in ``[min_{s ∈ P} lower_s, min_{s ∈ P} upper_s]``.

    >>> C = np.array([[0.0], [10.0], [20.0]])
    >>> def interval(s, rows):
    ...     g = np.abs(rows[:, 0] - C[s, 0])
    ...     return g, g - 0.5, g + 0.5
    >>> routed_intervals(np.array([[4.0], [19.0]]), C, 2, interval)
    (array([4., 1.]), array([3.5, 0.5]), array([4.5, 1.5]))
    """
    m = Yq.shape[0]
    gamma, lower, upper = np.full(m, np.inf), np.full(m, np.inf), np.full(m, np.inf)
    for s, rows in probed_rows(Yq, centres, n_probe):
        for total, part in zip((gamma, lower, upper), interval(s, Yq[rows]), strict=True):
            total[rows] = np.minimum(total[rows], part)
    return gamma, lower, upper
