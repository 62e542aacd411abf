"""The solve-based LSDD of commit 3513982 (before the eigenbasis rewrite): benchmark and test
reference, and the bound within which the new code must agree with it.

This is the membership score of ``kahm_dask/privacy/membership.py`` as it was computed before
the cross-validation was evaluated in the eigenbasis of H: ``_cv_select`` loops over the
(sigma, lambda) grid and makes one Cholesky-based ``scipy.linalg.solve`` of the (b_c x b_c)
system ``(H + lam I) theta = h_tr`` per grid point (11 x 9 = 99 solves with the default grids),
with the full (n, b_c) kernel matrices built per sigma and again for the refit; ``mis`` and
``mis_norm`` are two independent :func:`reference_lsdd` calls, each with its own median of all
pairwise distances; the attack ranks the scores with ``rankdata``. The code is copied unchanged
(only renamed, and ``_cv_select`` split into its score matrix and the argmin). It is the one
reference of ``benchmarks/bench_membership.py`` (the baseline of the speed-up) and of
``tests/privacy/test_membership.py`` (the new code selects the same (sigma, lambda) and agrees
within :func:`l2_agreement_bound`). The grids, the seed-stream numbers and the input checks are
imported from the package: they are not what changed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.linalg
from numpy.typing import ArrayLike
from scipy.spatial.distance import cdist, pdist

from kahm_dask._random import RandomState, as_generator, as_seed_sequence, child_seed_sequence
from kahm_dask._validation import check_positive_int
from kahm_dask.privacy.lsdd import (
    CENTRE_STREAM,
    FOLD_STREAM,
    LAMBDA_GRID,
    MEDIAN_STREAM,
    SIGMA_FACTORS,
    LSDDResult,
    _as_grid,
    _as_samples,
)
from kahm_dask.privacy.membership import LSDD_STREAM, _as_distances

__all__ = [
    "reference_lsdd",
    "reference_cv_scores",
    "reference_mis",
    "reference_attack_from_distances",
    "sigma_perturbation_bound",
    "kernel_perturbation_bound",
    "l2_agreement_bound",
]


def _sigma_scale(pool: np.ndarray, median_subset: int | None, rng: np.random.Generator) -> float:
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
    two_sigma_sq = 2.0 * sigma * sigma
    H = (np.sqrt(np.pi) * sigma) ** dim * np.exp(-sq_c / (2.0 * two_sigma_sq))
    return np.exp(-sq_a / two_sigma_sq), np.exp(-sq_b / two_sigma_sq), H


def _ridge_solve(H: np.ndarray, lam: float, rhs: np.ndarray) -> np.ndarray:
    return scipy.linalg.solve(H + lam * np.eye(H.shape[0]), rhs, assume_a="pos", check_finite=False)


def _fold_indicator(n: int, n_folds: int, rng: np.random.Generator) -> np.ndarray:
    folds = rng.permutation(np.arange(n) % n_folds)
    return (folds[None, :] == np.arange(n_folds)[:, None]).astype(np.float64)


def reference_cv_scores(
    sq_a: np.ndarray,
    sq_b: np.ndarray,
    sq_c: np.ndarray,
    dim: int,
    sigmas: np.ndarray,
    lambdas: np.ndarray,
    n_folds: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """The (sigmas, lambdas) CV score matrix of the old ``_cv_select`` (its argmin is the pair)."""
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
    return scores


def _cv_select(sq_a, sq_b, sq_c, dim, sigmas, lambdas, n_folds, rng) -> tuple[float, float]:
    scores = reference_cv_scores(sq_a, sq_b, sq_c, dim, sigmas, lambdas, n_folds, rng)
    i, j = np.unravel_index(np.argmin(scores), scores.shape)
    return float(sigmas[i]), float(lambdas[j])


def reference_lsdd(
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
    """The old ``lsdd`` (same arguments and result)."""
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
            pool, median_subset, as_generator(child_seed_sequence(root, MEDIAN_STREAM))
        )
        sigmas = scale * np.asarray(SIGMA_FACTORS)
    else:
        sigmas = _as_grid(sigma_list, "sigma_list")

    b_c = min(pool.shape[0], n_centers)
    centre_rng = as_generator(child_seed_sequence(root, CENTRE_STREAM))
    centres = pool[centre_rng.choice(pool.shape[0], b_c, replace=False)]
    sq_a = cdist(a, centres, "sqeuclidean")
    sq_b = cdist(b, centres, "sqeuclidean")
    sq_c = cdist(centres, centres, "sqeuclidean")

    if sigmas.size * lambdas.size > 1:
        fold_rng = as_generator(child_seed_sequence(root, FOLD_STREAM))
        sigma, lam = _cv_select(sq_a, sq_b, sq_c, dim, sigmas, lambdas, n_folds, fold_rng)
    else:
        sigma, lam = float(sigmas[0]), float(lambdas[0])

    Ka, Kb, H = _lsdd_kernels(sq_a, sq_b, sq_c, sigma, dim)
    h = Ka.mean(axis=0) - Kb.mean(axis=0)
    theta = _ridge_solve(H, lam, h)
    l2 = float(2.0 * h @ theta - theta @ H @ theta)
    return LSDDResult(l2=l2, l2_clipped=max(0.0, l2), sigma=sigma, lambda_=lam, n_centers=b_c)


def reference_mis(
    dist_train: ArrayLike, dist_test: ArrayLike, *, random_state: RandomState = 0, **lsdd_kwargs: Any
) -> tuple[LSDDResult, LSDDResult, float]:
    """The LSDD part of the old ``membership_inference_from_distances``: the raw and the
    median-scaled :func:`reference_lsdd` results (``mis = raw.l2``, ``mis_norm = norm.l2``) and
    the pooled finite median m~ (``+inf`` distances left out; the input checks are the
    package's, which did not change)."""
    dist_train = _as_distances(dist_train, "dist_train")
    dist_test = _as_distances(dist_test, "dist_test")
    finite_train = dist_train[np.isfinite(dist_train)]
    finite_test = dist_test[np.isfinite(dist_test)]
    median = float(np.median(np.concatenate([finite_train, finite_test])))
    median = median if median > 0.0 else 1.0
    lsdd_seed = child_seed_sequence(as_seed_sequence(random_state), LSDD_STREAM)
    raw = reference_lsdd(finite_train, finite_test, random_state=lsdd_seed, **lsdd_kwargs)
    norm = reference_lsdd(
        finite_train / median, finite_test / median, random_state=lsdd_seed, **lsdd_kwargs
    )
    return raw, norm, median


# ----------------------------------------------------------------------------------------------
# How far the new code may be from the reference (used by the test and by the benchmark)
# ----------------------------------------------------------------------------------------------

EPS = float(np.finfo(np.float64).eps)


def sigma_perturbation_bound(R: float, M: float) -> float:
    """Bound on ``|sigma_new / sigma_ref - 1|`` for the ``mis_norm`` run with the default grid.

    The reference takes the median pairwise distance of ``fl(x / m)``, the new code
    ``fl(median of the raw distances) / m``. Each distance of the rounded ``x / m`` is off by at
    most ``eps (2 R + D_ij)`` (two divisions and a subtraction; R the largest ``|x / m|``), the
    raw one by ``eps D_ij / 2``; an order statistic moves by at most the largest perturbation
    (it is 1-Lipschitz in the sup norm), so the medians differ by at most ``eps (2 R + 2 M)``
    (M the median distance); the products with the factor and the division by m add three
    roundings: ``eps (2 R / M + 5)``, taken as ``eps (2 R / M + 6)``.
    """
    return EPS * (2.0 * R / M + 6.0)


def kernel_perturbation_bound(rho_sigma: float, R: float, sigma: float) -> float:
    """Bound on ``|K_new - K_ref|`` for one Gaussian kernel entry ``K = exp(-q)``,
    ``q = (x - c)^2 / (2 sigma^2)``, when the two implementations compute q differently.

    ``rho_sigma`` is the relative difference of the two sigmas, R the largest ``|x|`` and
    ``|c|`` in the run's units. Relative to the exact q, the rounded squared difference and
    ``2 sigma^2`` are off by ``q (2 rho_sigma + 8 eps)`` plus the cancellation in ``x - c``:
    ``|delta (x - c)| <= eps (2 R + |x - c|)``, i.e. ``|delta q| <= 2 eps (R / sigma) sqrt(2 q)``
    more. With ``max q e^{-q} = 1/e`` and ``max sqrt(2 q) e^{-q} < 1``,
    ``|delta K| <= (2 rho_sigma + 8 eps) / e + 2 eps R / sigma``, taken without the 1/e. The
    ``8 eps`` also covers ``exp`` itself (a few ulp), so this is the bound to use even when both
    compute q alike (``rho_sigma = 0``, ``R = 0``).
    """
    return 2.0 * rho_sigma + 8.0 * EPS + 2.0 * EPS * R / sigma


def l2_agreement_bound(
    a: ArrayLike,
    b: ArrayLike,
    sigma: float,
    lam: float,
    *,
    random_state: RandomState,
    n_centers: int = 300,
    rho: float = 8.0 * EPS,
) -> float:
    """Bound on ``|l2_new - l2_ref|`` for one LSDD estimate with the selected (sigma, lambda),
    a and b in the units of that estimate (``x / m`` for ``mis_norm``).

    First-order perturbation theory of ``l2 = 2 h^T theta - theta^T H theta`` with
    ``theta = M^{-1} h``, ``M = H + lam I``: ``l2 = h^T M^{-1} h + lam ||M^{-1} h||^2``, so for a
    perturbation E of M (H) and e of h

        |d l2| <= ||E|| ||theta||^2 (1 + 2 lam ||M^{-1}||) + 2 ||e|| ||theta|| (1 + lam ||M^{-1}||)
               <= 3 ||E|| ||theta||^2 + 4 ||e|| ||theta||            (||M^{-1}|| <= 1 / lam).

    Both implementations are within these perturbations of the exact value, hence the factor 2:

    * ``||E|| <= eta_H ||M||_2``, ``eta_H = 3 b_c^2 eps + (D + 1) b_c rho``: the normwise backward
      error of the Cholesky solve (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd
      ed., Thm 10.3, ``|Delta M| <= gamma_{3 b_c + 1} |R^T| |R|``, with
      ``|| |R^T| |R| ||_2 <= b_c ||M||_2``: ``3 b_c^2 eps``) and the rounding of the dot products
      in l2 (``<= b_c eps ||H|| ||theta||^2``, H has non-negative entries), plus the entries of H,
      each off by at most ``(D + 1) rho ||H||_2`` (kernel entry ``rho``, prefactor
      ``(sqrt(pi) sigma)^D`` relative ``D rho``; ``||H||_2 >= H_ll``), in the Frobenius norm;
    * ``||e|| <= eta_h ||g||_2``, ``eta_h = (n + 4) eps + 2 n rho``, ``g = mean_a + mean_b`` of
      the kernel columns, n the larger sample size: summing n non-negative kernel values in any
      order is exact up to ``gamma_n ~ n eps`` relative (Higham, §4.2), and each kernel entry is
      off by ``rho`` absolute, which is ``<= n rho g_l`` since every centre is a sample point
      (its own kernel value 1 gives ``g_l >= 1 / n``); this term also covers the rounding of
      ``h^T theta`` (``<= b_c eps ||g|| ||theta||``, ``b_c <= 2 n``).

    ``rho`` is :func:`kernel_perturbation_bound`. The machine-epsilon terms are worst-case
    bounds; typical rounding errors are far smaller, so the actual differences sit well inside.
    """
    a, b = _as_samples(a, "a"), _as_samples(b, "b")
    pool = np.concatenate([a, b])
    b_c = min(pool.shape[0], n_centers)
    root = as_seed_sequence(random_state)
    centres = pool[
        as_generator(child_seed_sequence(root, CENTRE_STREAM)).choice(
            pool.shape[0], b_c, replace=False
        )
    ]
    Ka, Kb, H = _lsdd_kernels(
        cdist(a, centres, "sqeuclidean"),
        cdist(b, centres, "sqeuclidean"),
        cdist(centres, centres, "sqeuclidean"),
        sigma,
        pool.shape[1],
    )
    g = Ka.mean(axis=0) + Kb.mean(axis=0)
    theta = _ridge_solve(H, lam, Ka.mean(axis=0) - Kb.mean(axis=0))
    n, dim = max(a.shape[0], b.shape[0]), pool.shape[1]
    eta_H = 3.0 * b_c**2 * EPS + (dim + 1) * b_c * rho
    eta_h = (n + 4) * EPS + 2.0 * n * rho
    norm_theta = float(np.linalg.norm(theta))
    return 2.0 * (
        3.0 * eta_H * (float(np.linalg.norm(H, 2)) + lam) * norm_theta**2
        + 4.0 * eta_h * float(np.linalg.norm(g)) * norm_theta
    )


def reference_attack_from_distances(dist_train: ArrayLike, dist_test: ArrayLike) -> tuple:
    """The old threshold attack's metrics ``(auc, advantage, tpr_at_1pct_fpr,
    tpr_at_0_1pct_fpr)``: the score ``-min_c Gamma_c`` replaced by its dense rank."""
    from scipy.stats import rankdata
    from sklearn.metrics import roc_auc_score, roc_curve

    dist_train = _as_distances(dist_train, "dist_train")
    dist_test = _as_distances(dist_test, "dist_test")
    scores = rankdata(-np.concatenate([dist_train, dist_test]), method="dense").astype(np.float64)
    labels = np.concatenate([np.ones(dist_train.size), np.zeros(dist_test.size)])
    fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=False)
    return (
        float(roc_auc_score(labels, scores)),
        float(np.max(np.abs(tpr - fpr))),
        float(tpr[fpr <= 0.01].max()),
        float(tpr[fpr <= 0.001].max()),
    )
