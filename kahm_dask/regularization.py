"""The regularisation parameter λ* of a KAHM: Theorem 1 fixed point (docs/algorithm.md#krls).

With ``K = U diag(μ) Uᵀ`` and ``C = Uᵀ Y`` the training MSE of KRLS is
(docs/algorithm.md#training-mse)

    e(λ) = 1/(pN) Σ_k (λ / (μ_k + λ))² ‖C_k,:‖²,

and λ* = ê + τ* with τ* = 2s, s = ‖Y‖_F² / (pN), where ê is the unique fixed point of
``R(e, τ) = e(e + τ)`` (eqs. 21–28). After one eigendecomposition each iteration is O(N).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy.linalg import eigh
from sklearn.exceptions import ConvergenceWarning

from kahm_dask._validation import as_data_matrix, check_positive_int

__all__ = ["LambdaFixedPoint", "regularized_training_mse", "solve_lambda", "solve_lambda_spectral"]


@dataclass(frozen=True)
class LambdaFixedPoint:
    """Result of the λ* search.

    lambda_star : λ* = ê + 2s (eq. 28)
    e_hat : ê, the fixed point of R(·, 2s), in (0, s)
    n_iter : number of fixed-point iterations performed
    converged : whether the stopping rule was met within ``max_iter``
    s : ‖Y‖_F² / (pN), the uncentred mean square of the targets
    """

    lambda_star: float
    e_hat: float
    n_iter: int
    converged: bool
    s: float


def regularized_training_mse(
    e: float | np.ndarray, tau: float, mu: np.ndarray, c2: np.ndarray, pN: int
) -> float | np.ndarray:
    """``R(e, τ)`` of eq. (21) in spectral form (docs/algorithm.md#training-mse).

    mu : (N,) eigenvalues of K (clipped at 0); c2 : (N,) squared row norms of ``UᵀY``;
    pN : p·N. ``e`` may be a scalar or an array of values (evaluated independently).
    """
    lam = np.asarray(e, dtype=np.float64)[..., None] + tau
    ratio = lam / (mu + lam)
    out = (ratio * ratio) @ c2 / pN
    return float(out) if np.ndim(out) == 0 else out


def solve_lambda_spectral(
    mu: np.ndarray,
    c2: np.ndarray,
    s: float,
    pN: int,
    *,
    e0: float | None = None,
    rtol: float = 1e-10,
    lambda_atol: float | None = None,
    max_iter: int = 1000,
) -> LambdaFixedPoint:
    """Iterate ``e ← R(e, 2s)`` from ``e0`` (default s/2) to the fixed point
    (docs/algorithm.md#lambda-star).

    Stops when ``|e_new − e| ≤ rtol·s`` or, if ``lambda_atol`` is given (the author's
    rule: 0.01 in MATLAB, 1e-3 in Python), when the change of λ is at most ``lambda_atol``.
    """
    max_iter = check_positive_int(max_iter, "max_iter")
    tau = 2.0 * s
    e = 0.5 * s if e0 is None else float(e0)
    if not (0.0 < e < s):
        raise ValueError(f"e0 must lie in (0, s) = (0, {s:g}), got {e0}.")
    tol = rtol * s if lambda_atol is None else float(lambda_atol)
    for it in range(1, max_iter + 1):
        e_new = regularized_training_mse(e, tau, mu, c2, pN)
        change = abs(e_new - e)
        if change <= tol:
            return LambdaFixedPoint(e_new + tau, e_new, it, True, s)
        e = e_new
    warnings.warn(
        f"λ* fixed point did not converge in {max_iter} iterations "
        f"(last change {change:.3g}, tolerance {tol:.3g}).",
        ConvergenceWarning,
        stacklevel=2,
    )
    return LambdaFixedPoint(e + tau, e, max_iter, False, s)


def solve_lambda(
    K: np.ndarray,
    Y: np.ndarray,
    *,
    e0: float | None = None,
    rtol: float = 1e-10,
    lambda_atol: float | None = None,
    max_iter: int = 1000,
) -> LambdaFixedPoint:
    """λ* for the kernel matrix ``K`` (N, N) and regression targets ``Y`` (N, p)
    (docs/algorithm.md#lambda-star).

    Computes ``eigh(K)`` once (O(N³)), then iterates the spectral form of R.
    Raises ``ValueError`` if ``Y`` is all zeros (Theorem 1 assumes Y ≠ 0).
    """
    Y = as_data_matrix(Y, "Y")
    K = as_data_matrix(K, "K")
    N, p = Y.shape
    if K.shape != (N, N):
        raise ValueError(f"K must have shape ({N}, {N}) to match Y, got {K.shape}.")
    s = float(np.einsum("ij,ij->", Y, Y)) / (p * N)
    if s == 0.0:
        raise ValueError("Y is all zeros: λ* is undefined (Theorem 1 assumes Y ≠ 0).")
    mu, U = eigh(K)
    np.maximum(mu, 0.0, out=mu)
    C = U.T @ Y
    c2 = np.einsum("ij,ij->i", C, C)
    return solve_lambda_spectral(
        mu, c2, s, p * N, e0=e0, rtol=rtol, lambda_atol=lambda_atol, max_iter=max_iter
    )
