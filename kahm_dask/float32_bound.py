"""A proven bound on how far the float32 evaluation of a KAHM lies from the float64 one.

docs/algorithm.md#float32-error-bound derives it. In short, for one query row with float64
kernel weights ``k`` (both evaluations compute them identically, in float64), the float32
evaluation rounds ``k`` and β to float32 (``k̂``, ``β̂``) and forms ``Ô = k̂·β̂`` by a float32
GEMM, the float64 one ``O = k·β`` by a float64 GEMM. With ``u = 2⁻²⁴`` and the dot-product bound
``|fl(aᵀb) − aᵀb| ≤ γ_N |a|ᵀ|b|``, ``γ_N = N u_t / (1 − N u_t)`` for either precision ``u_t``
(any summation order, with or without FMA), every entry obeys

    |Ô_j − O_j| ≤ c_N Σ_k k̂_k |β̂_kj| + N τ (1 + max_k |β̂_kj|),  c_N = (2u + γ_N(u) + γ_N(2⁻⁵³))(1 + 4u),

where ``τ = 2⁻¹²⁶`` covers float32's subnormal range (also when subnormals are flushed to zero).
Over the p image columns the 2-norm is then at most ``T = c_N S + t`` with
``S = Σ_k k̂_k ‖β̂_{k,:p}‖₂``, and in the weight-sum column ``T_p = c_N S_p + t`` with
``S_p = Σ_k k̂_k |β̂_{k,p}|`` (``t`` the subnormal slack; S and S_p are one (m × N)·(N × 2) product
per block). The images are quotients ``Ô_{:p}/Ô_p`` and ``O_{:p}/O_p``: they differ by at most
``B = (T + ‖x̂‖ T_p) / (|Ô_p| − T_p)`` plus the float64 roundings of the two quotients, and the
distances ``Γ = ‖y − x‖`` by at most that plus the roundings of the two norms.

The functions here are the formula, in one place; :meth:`kahm_dask.KAHM._images_into` computes
S and S_p alongside the float32 GEMM.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "U32", "U64", "gemm_constant", "nonnegative_sum_upper", "row_norms_upper", "image_bound", "distance_bound",
    "certified_argmin", "candidate_classes", "class_intervals",
]

#: Unit roundoffs of float32 and float64 (round to nearest).
U32 = 2.0**-24
U64 = 2.0**-53

#: Below float32's smallest normal number, 2⁻¹²⁶, relative accuracy is lost: rounding to a subnormal,
#: or a BLAS kernel that flushes subnormal inputs and products to zero (FTZ/DAZ), moves a value
#: or a product by less than this.
_TINY32 = 2.0**-126


def _gamma(n: int, u: float) -> float:
    """γ_n = n u / (1 − n u) (inf when n u ≥ 1: no bound)."""
    nu = n * u
    return nu / (1.0 - nu) if nu < 1.0 else np.inf


def gemm_constant(n_rows: int) -> float:
    """c_N of the module docstring for a model of ``n_rows`` = N samples: the factor of
    ``S = Σ_k k̂_k ‖β̂_{k,:p}‖₂`` and of ``S_p = Σ_k k̂_k |β̂_{k,p}|`` in the bounds on
    ‖Ô_{:p} − O_{:p}‖₂ and |Ô_p − O_p| of one query row."""
    return (2.0 * U32 + _gamma(n_rows, U32) + _gamma(n_rows, U64)) * (1.0 + 4.0 * U32)


def nonnegative_sum_upper(computed: np.ndarray, n_terms: int) -> np.ndarray:
    """An upper bound on exact sums of ``n_terms`` nonnegative terms from their float32 sums
    ``computed``: each is at least (1 − γ_n) times the exact sum, so ``computed (1 + 2γ_n)``
    bounds it (γ_n ≤ 1/2), in float64."""
    return np.asarray(computed, dtype=np.float64) * (1.0 + 2.0 * _gamma(n_terms, U32))


def row_norms_upper(beta32: np.ndarray) -> np.ndarray:
    """(N, 2) float32 upper bounds, per row k of the float32 weights β̂ (N, p + 1), on ‖β̂_{k,:p}‖₂
    (the image columns) and |β̂_{k,p}| (the weight-sum column): the float64 norms carry at most
    (p + 3) u₆₄ relative error, inflated away before rounding up to float32."""
    norms = np.empty((beta32.shape[0], 2))
    norms[:, 0] = np.sqrt(np.einsum("ij,ij->i", beta32[:, :-1], beta32[:, :-1], dtype=np.float64))
    norms[:, 0] *= 1.0 + (beta32.shape[1] + 3.0) * U64
    norms[:, 1] = np.abs(beta32[:, -1])
    return np.nextafter(norms.astype(np.float32), np.float32(np.inf))


def image_bound(weighted_norms: np.ndarray, den32: np.ndarray, image_norms: np.ndarray, *, n_rows: int,
                n_features: int, beta_max: float, threshold: float) -> np.ndarray:
    """Per query row, a bound on ‖x̂ − x‖₂ between the float32 image x̂ and the float64 image x.

    weighted_norms : (m, 2) upper bounds on ``S = Σ_k k̂_k ‖β̂_{k,:p}‖₂`` and
                     ``S_p = Σ_k k̂_k |β̂_{k,p}|`` for each row.
    den32          : (m,) the float32 weight sums Ô_p (as float64).
    image_norms    : (m,) ‖x̂‖₂ of the float32 images (float64).
    n_rows, n_features : N and p of the model; ``beta_max`` : max |β̂|.
    threshold      : the denominator guard's threshold; a row whose float64 weight sum could lie
                     below it (or whose float32 one does) gets +inf (the two evaluations may guard
                     it differently).

    With ``T = c_N S + t`` and ``T_p = c_N S_p + t`` (``t = √(p + 1) N τ (1 + max|β̂|)``) bounding
    ‖Ô_{:p} − O_{:p}‖₂ and |Ô_p − O_p|, the exact quotients differ by at most
    ``B = (T + ‖x̂‖ T_p) / (|Ô_p| − T_p)``; returns ``B (1 + 4u₆₄) + 3u₆₄ (‖x̂‖ + B)`` (m,), which
    adds the float64 roundings of both quotients.
    """
    image_norms = image_norms * (1.0 + (n_features + 3.0) * U64)  # the norms' own rounding
    slack = np.sqrt(n_features + 1.0) * n_rows * _TINY32 * (1.0 + beta_max)
    T, T_p = (gemm_constant(n_rows) * weighted_norms + slack).T
    margin = np.abs(den32) - T_p
    with np.errstate(divide="ignore", invalid="ignore"):
        B = (T + image_norms * T_p) / margin
    B = B * (1.0 + 4.0 * U64) + 3.0 * U64 * (image_norms + B)
    B[~(margin >= threshold) | ~np.isfinite(B)] = np.inf
    return B


def distance_bound(image_error: np.ndarray, gamma32: np.ndarray, n_features: int) -> np.ndarray:
    """Per query row, a bound on |Γ̂₃₂ − Γ̂₆₄| from the image bound ``image_error`` (m,) and the
    float32 evaluation's distances ``gamma32`` (m,): the image bound, plus
    the float64 roundings of both ``‖y − x‖`` (a difference, p squares summed, a square root:
    at most (p + 3) u₆₄ relative each), ``(1 + 2⁻⁴⁰)`` for the arithmetic of this bound itself."""
    rounding = (n_features + 3.0) * U64 * (2.0 * gamma32 + image_error)
    with np.errstate(invalid="ignore"):
        bound = (image_error + rounding) * (1.0 + 2.0**-40)
    bound[~np.isfinite(gamma32)] = np.inf
    return bound


def certified_argmin(lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """The class each row's float64 distances put first, where the intervals prove it, else -1.

    lower, upper : (m, C) bounds between which each float64 class distance lies. Row i's class is
    c = argmin_c upper[i, c] when ``upper[i, c] < lower[i, c']`` for every other class c': its float64
    distance is then strictly the smallest, so the float64 argmin (ties: the lowest index) is c.
    Returns (m,) int64 class indices, -1 for rows the intervals do not decide.
    """
    rows = np.arange(lower.shape[0])
    best = np.argmin(upper, axis=1)
    others = lower.copy()
    others[rows, best] = np.inf
    return np.where(upper[rows, best] < others.min(axis=1), best, -1)


def candidate_classes(lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """(m, C) bool: the classes whose float64 distance may be row i's smallest, ``lower[i, c] ≤
    min_c' upper[i, c']``. Any other class's float64 distance exceeds the float64 distance of the
    class of smallest ``upper``, so the float64 argmin (ties included) is among these; a row
    :func:`certified_argmin` decides has exactly one."""
    return lower <= upper.min(axis=1, keepdims=True)


def class_intervals(gamma: np.ndarray, bound: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(gamma − bound, gamma + bound)`` of distances and their bounds (same shapes), with −inf
    below a row whose bound is +inf (its float64 distance may be anything)."""
    with np.errstate(invalid="ignore"):
        lower = np.where(np.isinf(bound), -np.inf, gamma - bound)
    return lower, gamma + bound
