"""Independent reference implementations used by the core tests.

Everything here is written from the formulas of docs/algorithm.md (docs/algorithm.md#krls,
docs/algorithm.md#kahm, docs/algorithm.md#distance) with explicit linear solves
(``scipy.linalg.solve``) and broadcasting, never with the library's spectral shortcuts, so the
tests compare two different computations of the same quantity.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import solve, solve_triangular


def sq_dists(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``D[a, b] = ‖A[a] − B[b]‖²`` by broadcasting (no BLAS expansion trick)."""
    diff = A[:, None, :] - B[None, :, :]
    return np.einsum("abk,abk->ab", diff, diff)


def gaussian_kernel(A: np.ndarray, B: np.ndarray, width: float) -> np.ndarray:
    """``exp(−‖a − b‖² / width)``."""
    return np.exp(-sq_dists(A, B) / width)


def direct_R(K: np.ndarray, Y: np.ndarray, e: float, tau: float) -> float:
    """``R(e, τ)`` of eq. (21) with an explicit solve (no eigendecomposition)."""
    N, p = Y.shape
    lam = e + tau
    F = K @ solve(K + lam * np.eye(N), Y, assume_a="pos")
    return float(np.sum((Y - F) ** 2) / (p * N))


def kahm_reference(Y: np.ndarray, P: np.ndarray):
    """K (eq. 39) and a function mapping queries to their Mahalanobis codes, from Y and P."""
    n = P.shape[0]
    X = Y @ P.T
    theta = np.atleast_2d(np.cov(X, rowvar=False, ddof=1))
    L = np.linalg.cholesky(theta)

    def codes(Q: np.ndarray) -> np.ndarray:
        return solve_triangular(L, (Q @ P.T).T, lower=True).T

    Z = codes(Y)
    D2 = sq_dists(Z, Z)
    K = np.exp(-D2 / (2 * n))
    return K, codes


def explicit_images(K: np.ndarray, lam: float, Kq: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """``w(y)ᵀ Y`` with ``w = h / 1ᵀh``, ``h = (K + λI)^{-1} k(Py)`` by a linear solve (eq. 33)."""
    N = K.shape[0]
    H = solve(K + lam * np.eye(N), Kq.T, assume_a="sym")  # (N, m)
    W = H / H.sum(axis=0, keepdims=True)
    return W.T @ Y


def affine_residual(points: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Least-squares residual norm of ``points − y¹`` against ``span{y^i − y¹}`` (per row)."""
    B = (Y[1:] - Y[0]).T  # (p, N-1)
    R = (points - Y[0]).T  # (p, m)
    coef, *_ = np.linalg.lstsq(B, R, rcond=None)
    return np.linalg.norm(R - B @ coef, axis=0)
