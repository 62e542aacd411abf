"""The whitened Gaussian kernel of a KAHM and its squared distances.

See docs/algorithm.md#kahm-definition and docs/algorithm.md#batched-evaluation.

Codes are whitened, ``z = θ^{-1/2} P (y - ȳ)``, so the Mahalanobis kernel of eq. (35)
becomes ``k(z, z') = exp(-‖z - z'‖² / (2n))``. Squared distances are computed with one
BLAS product (‖a‖² + ‖b‖² − 2 a·b), never as an (m, N, n) broadcast tensor.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "kernel_scale",
    "squared_distances",
    "gaussian_kernel_matrix",
    "shifted_query_kernel",
]


def kernel_scale(n: int) -> float:
    """Return the factor ``1/(2n)`` of eq. (35); 0 for rank-0 data
    (n = 0, docs/decisions.md#decision-rank-zero)."""
    return 0.5 / n if n > 0 else 0.0


def squared_distances(
    A: np.ndarray, B: np.ndarray, B_sq_norms: np.ndarray | None = None
) -> np.ndarray:
    """Pairwise squared Euclidean distances ``D[a, b] = ‖A[a] - B[b]‖²``.

    Parameters
    ----------
    A : (m, n) array
    B : (N, n) array
    B_sq_norms : (N,) array, optional
        Precomputed ``‖B[b]‖²``.

    Returns
    -------
    (m, N) array, clipped at 0 (round-off can make the BLAS form slightly negative).
    """
    if B_sq_norms is None:
        B_sq_norms = np.einsum("ij,ij->i", B, B)
    D = A @ B.T
    D *= -2.0
    D += np.einsum("ij,ij->i", A, A)[:, None]
    D += B_sq_norms[None, :]
    np.maximum(D, 0.0, out=D)
    return D


def gaussian_kernel_matrix(Z: np.ndarray, n: int) -> np.ndarray:
    """Kernel matrix ``K[i, j] = exp(-‖z_i - z_j‖² / (2n))`` of eq. (39).

    Z : (N, n) whitened codes. Returns a symmetric (N, N) array with a unit diagonal.
    """
    D2 = squared_distances(Z, Z)
    D2 = 0.5 * (D2 + D2.T)  # exact symmetry despite BLAS rounding
    np.fill_diagonal(D2, 0.0)
    D2 *= -kernel_scale(n)
    return np.exp(D2, out=D2)


def shifted_query_kernel(
    Zq: np.ndarray, Z: np.ndarray, Z_sq_norms: np.ndarray, n: int
) -> np.ndarray:
    """Query kernel rows multiplied by ``exp(min_j D²[a, j] / (2n))`` (the row shift of
    docs/algorithm.md#batched-evaluation).

    Zq : (m, n) query codes, Z : (N, n) training codes. Returns (m, N); every row has
    its largest entry equal to 1, so the KAHM ratio (eq. 33), in which a common row
    factor cancels, never meets 0/0 even for queries far from the data.
    """
    D2 = squared_distances(Zq, Z, Z_sq_norms)
    D2 -= D2.min(axis=1, keepdims=True)
    D2 *= -kernel_scale(n)
    return np.exp(D2, out=D2)
