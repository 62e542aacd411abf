"""Public feature bounds: the sensitivity of every release comes from them.

The owner states ``bounds=(lower, upper)``: two scalars, or two arrays of one value per feature,
known without looking at the private rows (pixels 0–255, a questionnaire's scale, an instrument's
range). Entries are clipped to them before noise, and the adjacency bound ``d`` defaults to their
width. Bounds taken from the data are themselves a release of the private minimum and maximum of
every column (one entry can set a column's range): they are allowed, with a
:class:`~kahm_dask.privacy.randomness.PrivacyLeakWarning`, and the privacy statement names them.

Examples
--------
>>> import numpy as np
>>> from kahm_dask.privacy.bounds import public_bounds
>>> lower, upper = public_bounds((0, 16), n_features=3)
>>> lower.tolist(), upper.tolist()
([0.0, 0.0, 0.0], [16.0, 16.0, 16.0])
"""

from __future__ import annotations

import warnings

import numpy as np

from kahm_dask.privacy.randomness import PrivacyLeakWarning

__all__ = ["public_bounds", "bounds_from_private_data", "resolve_bounds", "BOUNDS_PUBLIC", "BOUNDS_PRIVATE"]

BOUNDS_PUBLIC = "public (stated by the data owner)"
BOUNDS_PRIVATE = "the private data (min and max of each feature; not covered by the guarantee)"


def public_bounds(bounds, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """``(lower, upper)`` as two float64 arrays of shape (n_features,).

    ``bounds``: a pair of scalars or of (n_features,) arrays. Raises ``ValueError`` naming the
    problem (not a pair, wrong length, not finite, upper ≤ lower).
    """
    try:
        lower, upper = bounds
    except (TypeError, ValueError):
        raise ValueError(f"bounds must be a pair (lower, upper), got {bounds!r}.") from None
    try:
        lower = np.broadcast_to(np.asarray(lower, dtype=np.float64), (n_features,)).copy()
        upper = np.broadcast_to(np.asarray(upper, dtype=np.float64), (n_features,)).copy()
    except (TypeError, ValueError):
        raise ValueError(
            f"bounds: lower and upper must be numbers or arrays of {n_features} values (one per feature)."
        ) from None
    if not (np.isfinite(lower).all() and np.isfinite(upper).all()):
        raise ValueError("bounds must be finite numbers.")
    bad = np.flatnonzero(upper <= lower)
    if bad.size:
        j = int(bad[0])
        raise ValueError(f"bounds: upper must exceed lower, got [{lower[j]}, {upper[j]}] for feature {j}.")
    return lower, upper


def bounds_from_private_data(X: np.ndarray, *, stacklevel: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Each column's min and max (width 1 where a column is constant), with a warning."""
    warnings.warn(
        "no public bounds given: the bounds of the noise are taken from the private data (each "
        "feature's min and max), which the guarantee does not cover. Pass bounds=(lower, upper) "
        "known without looking at the data.",
        PrivacyLeakWarning,
        stacklevel=stacklevel + 1,
    )
    lower, upper = np.min(X, axis=0).astype(np.float64), np.max(X, axis=0).astype(np.float64)
    return lower, np.where(upper > lower, upper, lower + 1.0)


def resolve_bounds(bounds, X: np.ndarray, *, stacklevel: int = 2) -> tuple[np.ndarray, np.ndarray, str]:
    """``(lower, upper, source)``: the public bounds, or those of X with a warning."""
    if bounds is None:
        return (*bounds_from_private_data(X, stacklevel=stacklevel + 1), BOUNDS_PRIVATE)
    return (*public_bounds(bounds, X.shape[1]), BOUNDS_PUBLIC)
