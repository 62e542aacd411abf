"""Membership-inference score and attack (docs/algorithm.md#membership).

* :func:`lsdd` -- least-squares density-difference estimation (Sugiyama et al. 2013;
  docs/algorithm.md#lsdd) of the squared L2 distance ``int (p1 - p2)^2`` between the densities
  of two samples.
* ``mis`` (eq. 73 at o = 0; docs/algorithm.md#mis) -- LSDD between sample set 1,
  ``min_c Gamma_c(y)`` over the (original, private) training rows, and sample set 2, the same
  over the test rows; and ``mis_norm`` (docs/algorithm.md#mis-reporting) -- the same on the
  distances divided by their pooled median.
* The scale-free threshold attack of docs/algorithm.md#mis-reporting with score
  ``-min_c Gamma_c(y)``: ROC AUC, attacker advantage and TPR at 1 % / 0.1 % FPR.

The classifier-level functions take any object with a ``class_distances(X) -> (m, C)`` method.
The ``*_from_distances`` functions take the 1-D arrays of min-over-class distances directly (for
pipelines that compute distances elsewhere). One ``random_state`` seeds a whole evaluation: the
training-row subset (docs/algorithm.md#mis) uses its child stream 0 and LSDD its child
stream 1, so ``membership_inference_score(clf, X_train, X_test, random_state=s)`` equals
``membership_inference_from_distances(dist[training_row_subset(n, m, s)], dist_test,
random_state=s)``, and the attack with the same seed sees the same training rows.

Decisions: docs/algorithm.md#decision-lsdd-settings, docs/algorithm.md#decision-mis-members,
docs/algorithm.md#decision-mis-norm, docs/algorithm.md#decision-membership-subsets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import scipy.linalg
from numpy.typing import ArrayLike
from scipy.spatial.distance import cdist, pdist
from scipy.stats import rankdata
from sklearn.metrics import roc_auc_score, roc_curve

from kahm_dask._random import RandomState, as_generator, as_seed_sequence, child_seed_sequence
from kahm_dask._validation import as_data_matrix, check_positive_int

__all__ = [
    "LSDDResult",
    "MembershipInference",
    "MembershipAttack",
    "SIGMA_FACTORS",
    "LAMBDA_GRID",
    "lsdd",
    "training_row_subset",
    "membership_inference_from_distances",
    "membership_attack_from_distances",
    "membership_inference_score",
    "membership_attack",
    "membership_evaluation",
]

#: docs/algorithm.md#lsdd, step 6: σ grid of the public LSDD port, multiplied by the median
#: pairwise distance.
SIGMA_FACTORS: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.2, 1.5, 2.0, 2.2, 2.5, 3.0, 5.0)
#: docs/algorithm.md#lsdd, step 6: λ grid ``logspace(-3, 1, 9)``.
LAMBDA_GRID: tuple[float, ...] = tuple(np.logspace(-3.0, 1.0, 9))

# Child streams of an LSDD seed (docs/algorithm.md#lsdd) and of a membership-evaluation seed
# (docs/algorithm.md#mis).
_MEDIAN_STREAM, _CENTRE_STREAM, _FOLD_STREAM = 0, 1, 2
_SUBSET_STREAM, _LSDD_STREAM = 0, 1


class SupportsClassDistances(Protocol):
    """A classifier exposing the per-class distances ``Gamma_c(y)`` as an (m, C) array
    (docs/algorithm.md#classifier)."""

    def class_distances(self, X: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class LSDDResult:
    """LSDD estimate (docs/algorithm.md#lsdd, step 4) and the model selected by cross-validation.

    ``l2 = 2 h^T theta - theta^T H theta`` (unclipped, may be slightly negative),
    ``l2_clipped = max(0, l2)``, ``sigma``/``lambda_`` the selected kernel width and ridge,
    ``n_centers`` the number of Gaussian centres ``b_c`` used.
    """

    l2: float
    l2_clipped: float
    sigma: float
    lambda_: float
    n_centers: int


@dataclass(frozen=True)
class MembershipInference:
    """Report of docs/algorithm.md#mis-reporting: ``mis`` (raw), ``mis_norm`` (distances
    divided by ``median_distance``), the pooled finite median ``median_distance`` (m~), the
    number of training rows used, the number of test rows and the number of ``+inf`` distances
    left out of the LSDD samples."""

    mis: float
    mis_norm: float
    median_distance: float
    n_train_used: int
    n_test: int
    n_infinite: int


@dataclass(frozen=True)
class MembershipAttack:
    """Threshold attack of docs/algorithm.md#mis-reporting, score ``-min_c Gamma_c``: ROC AUC
    (0.5 = no signal), attacker advantage ``max |TPR - FPR|``, the largest TPR at FPR <= 1 % and
    <= 0.1 %, and the numbers of members (training rows, label 1) and non-members (test rows,
    label 0)."""

    auc: float
    advantage: float
    tpr_at_1pct_fpr: float
    tpr_at_0_1pct_fpr: float
    n_members: int
    n_nonmembers: int


# ----------------------------------------------------------------------------------------------
# LSDD (docs/algorithm.md#lsdd)
# ----------------------------------------------------------------------------------------------


def _as_samples(x: ArrayLike, name: str) -> np.ndarray:
    """Return a sample set as an (n, D) finite float64 array; 1-D input means D = 1."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise ValueError(
            f"{name} must be a non-empty sample of shape (n,) or (n, D), got shape {arr.shape}."
        )
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must contain only finite values.")
    return arr


def _as_grid(values: ArrayLike, name: str) -> np.ndarray:
    grid = np.atleast_1d(np.asarray(values, dtype=np.float64))
    if grid.ndim != 1 or grid.size == 0 or not (np.isfinite(grid) & (grid > 0)).all():
        raise ValueError(f"{name} must be a non-empty 1-D list of finite numbers > 0.")
    return grid


def _sigma_scale(pool: np.ndarray, median_subset: int | None, rng: np.random.Generator) -> float:
    """Median pairwise distance of the pooled sample (docs/algorithm.md#lsdd, step 6;
    docs/algorithm.md#decision-membership-subsets).

    Over a seeded subset of ``median_subset`` points drawn without replacement when the pool is
    larger (``None``: exact). Falls back to the standard deviation of all pooled entries, then 1.
    """
    if median_subset is not None and pool.shape[0] > median_subset:
        pool_for_median = pool[rng.choice(pool.shape[0], median_subset, replace=False)]
    else:
        pool_for_median = pool
    median = float(np.median(pdist(pool_for_median))) if pool_for_median.shape[0] > 1 else 0.0
    if median > 0.0:
        return median
    sd = float(np.std(pool))
    return sd if sd > 0.0 else 1.0


def _lsdd_kernels(
    sq_a: np.ndarray, sq_b: np.ndarray, sq_c: np.ndarray, sigma: float, dim: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gaussian design matrices (n1, b_c), (n2, b_c) and ``H`` (b_c, b_c) of
    docs/algorithm.md#lsdd, step 3."""
    two_sigma_sq = 2.0 * sigma * sigma
    H = (np.sqrt(np.pi) * sigma) ** dim * np.exp(-sq_c / (2.0 * two_sigma_sq))
    return np.exp(-sq_a / two_sigma_sq), np.exp(-sq_b / two_sigma_sq), H


def _ridge_solve(H: np.ndarray, lam: float, rhs: np.ndarray) -> np.ndarray:
    """``theta = (H + lam I)^{-1} rhs`` by a Cholesky-based solve (no explicit inverse)."""
    return scipy.linalg.solve(H + lam * np.eye(H.shape[0]), rhs, assume_a="pos", check_finite=False)


def _fold_indicator(n: int, n_folds: int, rng: np.random.Generator) -> np.ndarray:
    """(n_folds, n) 0/1 matrix of a random, balanced split of n samples into folds."""
    folds = rng.permutation(np.arange(n) % n_folds)
    return (folds[None, :] == np.arange(n_folds)[:, None]).astype(np.float64)


def _cv_select(
    sq_a: np.ndarray,
    sq_b: np.ndarray,
    sq_c: np.ndarray,
    dim: int,
    sigmas: np.ndarray,
    lambdas: np.ndarray,
    n_folds: int,
    rng: np.random.Generator,
) -> tuple[float, float]:
    """K-fold CV (docs/algorithm.md#lsdd, step 5): the (sigma, lambda) with the smallest summed
    score.

    ``score_k = theta_k^T H theta_k - 2 h_te^T theta_k`` with ``theta_k = (H + lam I)^{-1}
    h_tr``; ``h_tr``/``h_te`` are differences of fold means (other folds / fold k). Ties go to
    the first grid point (sigma-major order).
    """
    n1, n2 = sq_a.shape[0], sq_b.shape[0]
    for n, name in ((n1, "a"), (n2, "b")):
        if n < n_folds:
            raise ValueError(
                f"sample set {name} has {n} value(s); LSDD cross-validation with "
                f"n_folds={n_folds} needs at least {n_folds} in each sample set."
            )
    fold_a, fold_b = _fold_indicator(n1, n_folds, rng), _fold_indicator(n2, n_folds, rng)
    count_a, count_b = fold_a.sum(axis=1)[:, None], fold_b.sum(axis=1)[:, None]
    scores = np.empty((sigmas.size, lambdas.size))
    for i, sigma in enumerate(sigmas):
        Ka, Kb, H = _lsdd_kernels(sq_a, sq_b, sq_c, sigma, dim)
        sum_a, sum_b = fold_a @ Ka, fold_b @ Kb  # (K, b_c) per-fold sums
        h_te = sum_a / count_a - sum_b / count_b
        h_tr = (sum_a.sum(axis=0) - sum_a) / (n1 - count_a) - (sum_b.sum(axis=0) - sum_b) / (
            n2 - count_b
        )
        for j, lam in enumerate(lambdas):
            theta = _ridge_solve(H, lam, h_tr.T)  # (b_c, K): one column per fold
            scores[i, j] = np.sum(theta * (H @ theta)) - 2.0 * np.sum(h_te.T * theta)
    i, j = np.unravel_index(np.argmin(scores), scores.shape)
    return float(sigmas[i]), float(lambdas[j])


def lsdd(
    a: ArrayLike,
    b: ArrayLike,
    *,
    sigma_list: ArrayLike | None = None,
    lambda_list: ArrayLike | None = None,
    n_centers: int = 300,
    n_folds: int = 5,
    random_state: RandomState = 0,
    median_subset: int | None = 2000,
) -> LSDDResult:
    """Least-squares density-difference estimate of ``int (p1 - p2)^2`` (docs/algorithm.md#lsdd).

    Parameters
    ----------
    a, b : arrays of shape (n1,) / (n2,) or (n1, D) / (n2, D)
        Finite samples from p1 and p2.
    sigma_list : kernel widths (absolute, in the units of the data). Default: the median pairwise
        distance of the pooled sample times :data:`SIGMA_FACTORS` (step 6).
    lambda_list : ridge parameters. Default :data:`LAMBDA_GRID` = ``logspace(-3, 1, 9)``.
    n_centers : at most this many centres ``b_c = min(n1 + n2, n_centers)``, drawn without
        replacement from the pooled sample (step 1).
    n_folds : K of the K-fold CV (step 5); skipped when the grid has a single (sigma, lambda).
    random_state : seeds the median subset, the centres and the folds (separate child streams).
    median_subset : the median pairwise distance is taken over this many pooled points, drawn
        without replacement, when the pool is larger; ``None`` for the exact median
        (docs/algorithm.md#decision-membership-subsets).

    Returns
    -------
    LSDDResult with ``l2 = 2 h^T theta - theta^T H theta`` (step 4), ``theta = (H + lam I)^{-1} h``
    refitted on all data with the selected (sigma, lambda).
    """
    a, b = _as_samples(a, "a"), _as_samples(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"a and b must have the same dimension, got {a.shape[1]} and {b.shape[1]}."
        )
    n_centers = check_positive_int(n_centers, "n_centers")
    n_folds = check_positive_int(n_folds, "n_folds", minimum=2)
    if median_subset is not None:
        median_subset = check_positive_int(median_subset, "median_subset", minimum=2)
    root = as_seed_sequence(random_state)
    pool = np.concatenate([a, b])
    dim = pool.shape[1]

    lambdas = (
        np.asarray(LAMBDA_GRID) if lambda_list is None else _as_grid(lambda_list, "lambda_list")
    )
    if sigma_list is None:
        scale = _sigma_scale(
            pool, median_subset, as_generator(child_seed_sequence(root, _MEDIAN_STREAM))
        )
        sigmas = scale * np.asarray(SIGMA_FACTORS)
    else:
        sigmas = _as_grid(sigma_list, "sigma_list")

    b_c = min(pool.shape[0], n_centers)
    centre_rng = as_generator(child_seed_sequence(root, _CENTRE_STREAM))
    centres = pool[centre_rng.choice(pool.shape[0], b_c, replace=False)]
    sq_a = cdist(a, centres, "sqeuclidean")
    sq_b = cdist(b, centres, "sqeuclidean")
    sq_c = cdist(centres, centres, "sqeuclidean")

    if sigmas.size * lambdas.size > 1:
        fold_rng = as_generator(child_seed_sequence(root, _FOLD_STREAM))
        sigma, lam = _cv_select(sq_a, sq_b, sq_c, dim, sigmas, lambdas, n_folds, fold_rng)
    else:
        sigma, lam = float(sigmas[0]), float(lambdas[0])

    Ka, Kb, H = _lsdd_kernels(sq_a, sq_b, sq_c, sigma, dim)
    h = Ka.mean(axis=0) - Kb.mean(axis=0)
    theta = _ridge_solve(H, lam, h)
    l2 = float(2.0 * h @ theta - theta @ H @ theta)
    return LSDDResult(l2=l2, l2_clipped=max(0.0, l2), sigma=sigma, lambda_=lam, n_centers=b_c)


# ----------------------------------------------------------------------------------------------
# Distances -> mis / attack (docs/algorithm.md#mis, docs/algorithm.md#mis-reporting)
# ----------------------------------------------------------------------------------------------


def _as_distances(dist: ArrayLike, name: str) -> np.ndarray:
    """1-D float64 distances in [0, +inf]; NaN, negative values and -inf raise ``ValueError``."""
    arr = np.asarray(dist, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(
            f"{name} must be a non-empty 1-D array of distances, got shape {arr.shape}."
        )
    if np.isnan(arr).any() or (arr < 0).any():
        raise ValueError(f"{name} must hold distances >= 0 (+inf allowed), found NaN or negatives.")
    return arr


def training_row_subset(
    n_rows: int, max_train_rows: int | None, random_state: RandomState = 0
) -> np.ndarray:
    """Indices (sorted, int64) of the training rows used for ``mis`` and the attack
    (docs/algorithm.md#mis).

    All rows when ``max_train_rows`` is None or >= ``n_rows``; otherwise a uniform random subset
    of ``max_train_rows`` rows drawn without replacement from child stream 0 of
    ``random_state`` (the stream every membership function uses for this subset).
    """
    n_rows = check_positive_int(n_rows, "n_rows")
    if (
        max_train_rows is None
        or check_positive_int(max_train_rows, "max_train_rows", minimum=2) >= n_rows
    ):
        return np.arange(n_rows)
    rng = as_generator(child_seed_sequence(as_seed_sequence(random_state), _SUBSET_STREAM))
    return np.sort(rng.choice(n_rows, max_train_rows, replace=False))


def membership_inference_from_distances(
    dist_train: ArrayLike,
    dist_test: ArrayLike,
    *,
    random_state: RandomState = 0,
    **lsdd_kwargs: Any,
) -> MembershipInference:
    """``mis`` and ``mis_norm`` from min-over-class distances.

    See docs/algorithm.md#mis and docs/algorithm.md#mis-reporting.

    ``dist_train`` (n_train,) are ``min_c Gamma_c`` of the training rows used (sample set 1),
    ``dist_test`` (n_test,) those of the test rows (sample set 2). ``+inf`` values are left out of
    the LSDD samples and counted. ``mis`` is the unclipped :func:`lsdd` estimate on the finite
    distances; ``mis_norm`` the same (same ``lsdd_kwargs``, same seed: child stream 1 of
    ``random_state``) on the distances divided by their pooled finite median m~ (m~ = 1 if that
    median is 0). A user ``sigma_list`` is passed unchanged to both calls, i.e. it is in raw
    distance units for ``mis`` and in units of m~ for ``mis_norm``.
    """
    dist_train = _as_distances(dist_train, "dist_train")
    dist_test = _as_distances(dist_test, "dist_test")
    finite_train = dist_train[np.isfinite(dist_train)]
    finite_test = dist_test[np.isfinite(dist_test)]
    for finite, dist, name in (
        (finite_train, dist_train, "dist_train"),
        (finite_test, dist_test, "dist_test"),
    ):
        if finite.size == 0:
            raise ValueError(f"{name}: all {dist.size} distances are +inf; mis is undefined.")
    median = float(np.median(np.concatenate([finite_train, finite_test])))
    median = median if median > 0.0 else 1.0
    lsdd_seed = child_seed_sequence(as_seed_sequence(random_state), _LSDD_STREAM)
    raw = lsdd(finite_train, finite_test, random_state=lsdd_seed, **lsdd_kwargs)
    norm = lsdd(finite_train / median, finite_test / median, random_state=lsdd_seed, **lsdd_kwargs)
    return MembershipInference(
        mis=raw.l2,
        mis_norm=norm.l2,
        median_distance=median,
        n_train_used=int(dist_train.size),
        n_test=int(dist_test.size),
        n_infinite=int(dist_train.size - finite_train.size + dist_test.size - finite_test.size),
    )


def membership_attack_from_distances(
    dist_train: ArrayLike, dist_test: ArrayLike
) -> MembershipAttack:
    """Threshold attack of docs/algorithm.md#mis-reporting from min-over-class distances.

    Members (label 1) are the training rows (``dist_train``), non-members (label 0) the test rows.
    The attack score ``-min_c Gamma_c`` is replaced by its dense rank among all scores (ROC
    metrics depend only on the order, ties included), which maps ``+inf`` distances to a finite
    score below all others: they are never called members before any finite row.
    """
    dist_train = _as_distances(dist_train, "dist_train")
    dist_test = _as_distances(dist_test, "dist_test")
    scores = rankdata(-np.concatenate([dist_train, dist_test]), method="dense").astype(np.float64)
    labels = np.concatenate([np.ones(dist_train.size), np.zeros(dist_test.size)])
    fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=False)
    return MembershipAttack(
        auc=float(roc_auc_score(labels, scores)),
        advantage=float(np.max(np.abs(tpr - fpr))),
        tpr_at_1pct_fpr=float(tpr[fpr <= 0.01].max()),
        tpr_at_0_1pct_fpr=float(tpr[fpr <= 0.001].max()),
        n_members=int(dist_train.size),
        n_nonmembers=int(dist_test.size),
    )


# ----------------------------------------------------------------------------------------------
# Classifier level
# ----------------------------------------------------------------------------------------------


def _min_class_distances(clf: SupportsClassDistances, X: np.ndarray, name: str) -> np.ndarray:
    """``min_c Gamma_c(y)`` for the rows of X, shape (m,), from ``clf.class_distances(X)``."""
    D = np.asarray(clf.class_distances(X), dtype=np.float64)
    if D.ndim != 2 or D.shape[0] != X.shape[0] or D.shape[1] == 0:
        raise ValueError(
            f"clf.class_distances({name}) must return an array of shape ({X.shape[0]}, n_classes), "
            f"got shape {D.shape}."
        )
    return D.min(axis=1)


def _membership_distances(
    clf: SupportsClassDistances,
    X_train: ArrayLike,
    X_test: ArrayLike,
    max_train_rows: int | None,
    random_state: RandomState,
) -> tuple[np.ndarray, np.ndarray]:
    """Sample sets 1 and 2 of docs/algorithm.md#mis: distances of the (subset of) training rows
    and test rows."""
    if not callable(getattr(clf, "class_distances", None)):
        raise TypeError("clf must provide a class_distances(X) -> (m, n_classes) method.")
    X_train = as_data_matrix(X_train, "X_train", min_rows=2)
    X_test = as_data_matrix(X_test, "X_test", min_rows=2)
    if X_train.shape[1] != X_test.shape[1]:
        raise ValueError(
            f"X_train has {X_train.shape[1]} features but X_test has {X_test.shape[1]}; "
            "they must have the same feature count."
        )
    rows = training_row_subset(X_train.shape[0], max_train_rows, random_state)
    X_used = X_train if rows.size == X_train.shape[0] else X_train[rows]
    return _min_class_distances(clf, X_used, "X_train"), _min_class_distances(clf, X_test, "X_test")


def membership_inference_score(
    clf: SupportsClassDistances,
    X_train: ArrayLike,
    X_test: ArrayLike,
    *,
    max_train_rows: int | None = None,
    random_state: RandomState = 0,
    **lsdd_kwargs: Any,
) -> MembershipInference:
    """``mis`` / ``mis_norm`` report for a classifier (docs/algorithm.md#mis-reporting).

    ``X_train`` (n, p) must be the **original private** training rows the classifier was built
    for (docs/algorithm.md#decision-mis-members), not noisy or fabricated data; ``X_test``
    (m, p) the test rows. With ``max_train_rows`` a seeded uniform subset of the training rows is
    used (docs/algorithm.md#mis); the same ``random_state`` gives :func:`membership_attack` the
    same rows. ``lsdd_kwargs`` go to :func:`lsdd`.
    """
    dist_train, dist_test = _membership_distances(
        clf, X_train, X_test, max_train_rows, random_state
    )
    return membership_inference_from_distances(
        dist_train, dist_test, random_state=random_state, **lsdd_kwargs
    )


def membership_attack(
    clf: SupportsClassDistances,
    X_train: ArrayLike,
    X_test: ArrayLike,
    *,
    max_train_rows: int | None = None,
    random_state: RandomState = 0,
) -> MembershipAttack:
    """Threshold attack (score ``-min_c Gamma_c``) on the original training rows vs test rows.

    See docs/algorithm.md#mis-reporting.

    The training-row subset is the one :func:`membership_inference_score` uses for the same
    ``max_train_rows`` and ``random_state``.
    """
    dist_train, dist_test = _membership_distances(
        clf, X_train, X_test, max_train_rows, random_state
    )
    return membership_attack_from_distances(dist_train, dist_test)


def membership_evaluation(
    clf: SupportsClassDistances,
    X_train: ArrayLike,
    X_test: ArrayLike,
    *,
    max_train_rows: int | None = None,
    random_state: RandomState = 0,
    **lsdd_kwargs: Any,
) -> tuple[MembershipInference, MembershipAttack]:
    """Both reports of docs/algorithm.md#mis-reporting from one pass of ``clf.class_distances``
    over the training and test rows.

    Equal to ``(membership_inference_score(...), membership_attack(...))`` with the same
    arguments, at half the distance computations; with ``random_state=None`` it is the only way
    to give both the same (fresh) training-row subset.
    """
    root = as_seed_sequence(random_state)
    dist_train, dist_test = _membership_distances(clf, X_train, X_test, max_train_rows, root)
    return (
        membership_inference_from_distances(
            dist_train, dist_test, random_state=root, **lsdd_kwargs
        ),
        membership_attack_from_distances(dist_train, dist_test),
    )
