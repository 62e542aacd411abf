"""Canary entries released through the real mechanism, and the optimal score of each.

A canary is one entry at ``x = lower`` or at ``x + d`` (clipped to ``upper``), by a fair coin:
two neighbouring values of the guarantee's unit (docs/privacy.md, *Guarantee*). The entries are
released with :meth:`GridLaplace.release`, the noise drawn by its own sampler from the given
source (OS entropy by default): nothing of the mechanism is re-implemented here.

The release of an entry on grid point ``q`` is the integer ``v = q + Z`` (times the grid step,
plus ``lower``), with ``P(Z = z) = (1 − δ)·c·r^|z| + δ·[z = 0]`` and ``c = (1 − r)/(1 + r)``.
The Neyman–Pearson optimal score of "x + d" against "x" is the log-likelihood ratio

    LLR(v) = ln P(v − q1) − ln P(v − q0),   q0, q1 the grid points of x and x + d,

which for δ = 0 is ``ln r · (|v − q1| − |v − q0|)``, at most ``(q1 − q0)·ln(1/r) ≤ ε`` in size.

Examples
--------
>>> import numpy as np
>>> from kahm_dask.privacy.noise import GridLaplace
>>> mech = GridLaplace(epsilon=1.0, lower=np.zeros(1), upper=np.ones(1))
>>> coins, v = release_canaries(mech, 1000)
>>> coins.shape, v.shape, v.dtype
((1000, 1), (1000, 1), dtype('int64'))
>>> bool(np.abs(log_likelihood_ratio(mech, v)).max() <= 1.0)
True
"""

from __future__ import annotations

import numpy as np

from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import NoiseSource

__all__ = ["canary_grid_points", "release_canaries", "log_likelihood_ratio"]


def canary_grid_points(mechanism: GridLaplace) -> tuple[np.ndarray, np.ndarray]:
    """``(q0, q1)`` (p,) int64: the grid points of ``x = lower`` and ``x + d`` per feature."""
    low = mechanism.lower[None, :]
    q0 = mechanism.grid_index(low)[0]
    q1 = mechanism.grid_index(low + mechanism.d)[0]
    return q0, q1


def release_canaries(mechanism: GridLaplace, m: int,
                     source: NoiseSource | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``m`` canaries (rounded up to whole rows of the mechanism's p features), released.

    Returns ``coins`` (rows, p) bool, True where the entry is ``x + d``, and the released grid
    integers ``v`` (rows, p) int64. The coins are fair and independent of the noise (a
    non-secret generator: the audit's coins are not private).
    """
    p = mechanism.n_features
    rows = -(-int(m) // p)
    coins = np.random.default_rng().random((rows, p)) < 0.5
    values = np.where(coins, mechanism.lower + mechanism.d, mechanism.lower)
    released = mechanism.release(values, source)
    v = np.rint((released - mechanism.lower) / mechanism.step).astype(np.int64)
    return coins, v


def log_likelihood_ratio(mechanism: GridLaplace, v: np.ndarray) -> np.ndarray:
    """``LLR(v)`` (same shape as v): > 0 favours ``x + d``, < 0 favours ``x`` (module docstring).

    Formed as ``ln r`` times an integer, so outputs of equal LLR get the same float (exact ties);
    with δ > 0 the atom adds ``ln(1 + δ / ((1 − δ) c))`` at ``v = q1`` and subtracts it at ``v = q0``.
    """
    q0, q1 = canary_grid_points(mechanism)
    llr = (np.abs(v - q1) - np.abs(v - q0)) * np.log(mechanism.ratio)
    if mechanism.delta:
        r, delta = mechanism.ratio, mechanism.delta
        atom = np.log1p(delta / ((1.0 - delta) * (1.0 - r) / (1.0 + r)))
        llr += atom * ((v == q1).astype(np.float64) - (v == q0))
    return llr
