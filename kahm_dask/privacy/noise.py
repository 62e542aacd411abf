"""Optimal (epsilon, delta)-DP additive noise (ALGORITHM.md §9, Result 1, Remark 3, Algorithm 1).

The noise density of Result 1 (eq. 79, reconstructed, §15 A1) is

    f*(v; eps, delta, d) = delta * Dirac(v) + (1 - delta) * eps / (2 d) * exp(-eps |v| / d),

i.e. exactly 0 with probability ``delta`` and Laplace(0, d/eps) otherwise. Algorithm 1 (eq. 90)
adds an independent draw to every entry of the data matrix: ``Y+ = Y + V``.

Privacy unit (§9, §15 A19) -- what the guarantee covers, stated exactly:

* **Element level, bounded change.** ``Y -> Y + V`` is (eps, delta)-DP for *d-adjacent* data
  matrices (Definition 10, eq. 77): matrices that differ in **one entry** by **at most d**.
  It is not record-level DP.
* **Record level via basic composition.** A whole record (row) of ``p`` features, each changing by
  at most ``d``, is protected at (p * eps, p * delta).
* A value that can change by more than ``d`` is covered only if its feature range is at most
  ``d`` (e.g. ``d = 1`` for features scaled to [0, 1]).
* **Exact release.** Each entry is released without any noise with probability ``delta``, so
  about ``delta * N * p`` entries of an N x p matrix are published exactly. Keep
  ``delta << 1 / (N p)`` if that matters.

Randomness: uniforms are drawn on the open interval (0, 1) (exact 0s are redrawn) and mapped
through the inverse CDF. :func:`add_blocked_optimal_noise` draws the noise of each global block
of rows from its own child seed sequence, so any row range can be noised reproducibly, and
bit-identically to an in-memory run, without drawing the noise of the other rows.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from kahm_dask._random import RandomState, as_generator, as_seed_sequence, child_seed_sequence
from kahm_dask._validation import (
    as_data_matrix,
    check_positive_float,
    check_positive_int,
    check_probability,
)

__all__ = [
    "optimal_noise_pdf",
    "optimal_noise_cdf",
    "optimal_noise_inverse_cdf",
    "sample_optimal_noise",
    "blocked_optimal_noise",
    "add_optimal_noise",
    "add_blocked_optimal_noise",
]


def _check_noise_parameters(epsilon: Any, delta: Any, d: Any) -> tuple[float, float, float]:
    return (
        check_positive_float(epsilon, "epsilon"),
        check_probability(delta, "delta"),
        check_positive_float(d, "d"),
    )


def _as_float_array(x: ArrayLike, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if np.isnan(arr).any():
        raise ValueError(f"{name} must not contain NaN.")
    return arr


def optimal_noise_pdf(v: ArrayLike, epsilon: float, delta: float, d: float) -> np.ndarray:
    """Density of the absolutely continuous part of the optimal noise (§9, eq. 79).

    Returns ``(1 - delta) * epsilon / (2 d) * exp(-epsilon |v| / d)`` elementwise, same shape as
    ``v`` (a float for scalar ``v``). The full law also has an atom of mass ``delta`` at
    ``v = 0`` (the ``delta * Dirac(v)`` term), which a density cannot represent: this function
    integrates to ``1 - delta``, not 1.
    """
    epsilon, delta, d = _check_noise_parameters(epsilon, delta, d)
    v = _as_float_array(v, "v")
    scale = d / epsilon
    out = (1.0 - delta) / (2.0 * scale) * np.exp(-np.abs(v) / scale)
    return out[()]


def optimal_noise_cdf(v: ArrayLike, epsilon: float, delta: float, d: float) -> np.ndarray:
    """CDF ``F(v) = P(V <= v)`` of the optimal noise (§9, Remark 3).

    ``F(v) = (1-delta)/2 * exp(eps v / d)`` for ``v < 0`` and
    ``1 - (1-delta)/2 * exp(-eps v / d)`` for ``v >= 0``. Right-continuous with a jump of
    ``delta`` at 0: ``F(0-) = (1-delta)/2``, ``F(0) = (1+delta)/2``. Vectorised; same shape as
    ``v`` (a float for scalar ``v``); ``v = +-inf`` give 1 and 0.
    """
    epsilon, delta, d = _check_noise_parameters(epsilon, delta, d)
    v = _as_float_array(v, "v")
    tail = 0.5 * (1.0 - delta) * np.exp(-np.abs(v) * (epsilon / d))
    out = np.where(v < 0.0, tail, 1.0 - tail)
    return out[()]


def optimal_noise_inverse_cdf(t: ArrayLike, epsilon: float, delta: float, d: float) -> np.ndarray:
    """Quantile function ``F^{-1}(t)`` of the optimal noise for ``t`` in (0, 1) (§9).

    ``F^{-1}(t) = d/eps * ln(2t / (1-delta))`` for ``t < (1-delta)/2``, ``0`` for
    ``(1-delta)/2 <= t <= (1+delta)/2`` and ``-d/eps * ln(2(1-t) / (1-delta))`` for
    ``t > (1+delta)/2``. The logarithms are evaluated as ``ln(2t) - log1p(-delta)`` so that a
    small ``delta`` loses no digits. Vectorised; same shape as ``t``.

    Raises ``ValueError`` if any ``t`` lies outside the open interval (0, 1) or is NaN.
    """
    epsilon, delta, d = _check_noise_parameters(epsilon, delta, d)
    t = np.asarray(t, dtype=np.float64)
    if not np.all((t > 0.0) & (t < 1.0)):
        raise ValueError("t must lie strictly between 0 and 1 (and not be NaN).")
    scale = d / epsilon
    log_keep = np.log1p(-delta)  # ln(1 - delta)
    lower = t < 0.5 * (1.0 - delta)
    upper = t > 0.5 * (1.0 + delta)
    # For t > 1/2, 1 - t is exact (Sterbenz), so the upper tail keeps full relative precision.
    tail_prob = np.where(upper, 1.0 - t, t)
    # >= 0 on both tails; the clip only removes rounding noise right at the atom's edges.
    magnitude = np.maximum(scale * (log_keep - np.log(2.0 * tail_prob)), 0.0)
    out = np.where(lower, -magnitude, np.where(upper, magnitude, 0.0))
    return out[()]


def sample_optimal_noise(
    shape: int | tuple[int, ...],
    epsilon: float,
    delta: float,
    d: float,
    random_state: RandomState = None,
) -> np.ndarray:
    """Draw i.i.d. optimal noise of the given ``shape`` (float64) by inverse-CDF sampling.

    Uniforms come from ``numpy.random.Generator.random`` (interval [0, 1)); exact 0s are
    redrawn, so every ``t`` lies in the open interval (0, 1) (§9, Algorithm 1).
    ``random_state``: None, int, SeedSequence or Generator (see :mod:`kahm_dask._random`).
    """
    epsilon, delta, d = _check_noise_parameters(epsilon, delta, d)
    rng = as_generator(random_state)
    t = rng.random(shape)
    zeros = np.flatnonzero(t == 0.0)
    while zeros.size:  # probability 2**-53 per draw: practically never runs
        t.flat[zeros] = rng.random(zeros.size)
        zeros = zeros[t.flat[zeros] == 0.0]
    return np.asarray(optimal_noise_inverse_cdf(t, epsilon, delta, d))


def add_optimal_noise(
    Y: ArrayLike,
    epsilon: float,
    delta: float = 1e-5,
    d: float = 1.0,
    random_state: RandomState = None,
) -> np.ndarray:
    """Algorithm 1 (§9, eq. 90): return ``Y + V`` with i.i.d. optimal noise ``V``.

    ``Y`` is an (N, p) finite data matrix (NaN/inf raise ``ValueError``). Returns a new float64
    array of shape (N, p); ``Y`` is never modified. The result is (epsilon, delta)-DP for
    d-adjacent inputs (one entry changing by at most ``d``, Definition 10); see the module
    docstring for the record-level statement.
    """
    epsilon, delta, d = _check_noise_parameters(epsilon, delta, d)
    Y = as_data_matrix(Y, "Y", min_rows=0)
    return Y + sample_optimal_noise(Y.shape, epsilon, delta, d, random_state)


def _as_root_seed(seed: Any) -> np.random.SeedSequence:
    if isinstance(seed, np.random.SeedSequence) or (
        isinstance(seed, numbers.Integral) and not isinstance(seed, bool)
    ):
        return as_seed_sequence(seed)
    raise TypeError(
        "seed must be a numpy.random.SeedSequence (or an int), got "
        f"{type(seed).__name__}; blocked noise needs a reproducible root seed."
    )


def blocked_optimal_noise(
    n_rows: int,
    n_features: int,
    epsilon: float,
    delta: float,
    d: float,
    seed: np.random.SeedSequence | int,
    *,
    row_offset: int = 0,
    block_rows: int = 4096,
) -> np.ndarray:
    """Optimal noise (n_rows, n_features) for the global rows ``[row_offset, row_offset + n_rows)``.

    The data set's rows are cut into global blocks ``b`` of ``block_rows`` rows,
    ``[b * block_rows, (b + 1) * block_rows)``. The noise of block ``b`` is the
    (block_rows, n_features) draw of :func:`sample_optimal_noise` seeded with
    ``child_seed_sequence(seed, b)``; a row range gets the matching rows of the blocks it
    touches. Hence the noise of a row range does not depend on how the rows are chunked, as
    long as ``seed``, ``block_rows`` and ``n_features`` are the same.
    """
    epsilon, delta, d = _check_noise_parameters(epsilon, delta, d)
    root = _as_root_seed(seed)
    n_rows = check_positive_int(n_rows, "n_rows", minimum=0)
    n_features = check_positive_int(n_features, "n_features", minimum=0)
    row_offset = check_positive_int(row_offset, "row_offset", minimum=0)
    block_rows = check_positive_int(block_rows, "block_rows")
    out = np.empty((n_rows, n_features), dtype=np.float64)
    stop = row_offset + n_rows
    first_block, last_block = row_offset // block_rows, -(-stop // block_rows)
    for b in range(first_block, last_block):  # loop over blocks, not samples
        lo, hi = max(b * block_rows, row_offset), min((b + 1) * block_rows, stop)
        block = sample_optimal_noise(
            (block_rows, n_features), epsilon, delta, d, child_seed_sequence(root, b)
        )
        out[lo - row_offset : hi - row_offset] = block[lo - b * block_rows : hi - b * block_rows]
    return out


def add_blocked_optimal_noise(
    Y: ArrayLike,
    epsilon: float,
    delta: float,
    d: float,
    seed: np.random.SeedSequence | int,
    *,
    row_offset: int = 0,
    block_rows: int = 4096,
) -> np.ndarray:
    """Algorithm 1 (§9, eq. 90) on a row chunk with block-addressed, reproducible noise.

    ``Y`` (n, p) holds the global rows ``[row_offset, row_offset + n)`` of the full data set.
    Returns ``Y + V`` (new float64 array, ``Y`` unchanged), where ``V`` is
    :func:`blocked_optimal_noise` for those rows. Noising row chunks separately and
    concatenating gives bit-for-bit the same result as one call on the whole array.
    Same privacy unit as :func:`add_optimal_noise`.
    """
    epsilon, delta, d = _check_noise_parameters(epsilon, delta, d)
    Y = as_data_matrix(Y, "Y", min_rows=0)
    V = blocked_optimal_noise(
        Y.shape[0],
        Y.shape[1],
        epsilon,
        delta,
        d,
        seed,
        row_offset=row_offset,
        block_rows=block_rows,
    )
    return Y + V
