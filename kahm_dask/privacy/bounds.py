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
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from kahm_dask.privacy.randomness import PrivacyLeakWarning

__all__ = [
    "public_bounds",
    "bounds_from_private_data",
    "resolve_bounds",
    "Scaling",
    "FeatureBounds",
    "ResolvedBounds",
    "BOUNDS_PUBLIC",
    "BOUNDS_PRIVATE",
    "BOUNDS_PRIVATE_SCALING",
    "SCALINGS",
    "warn_private_scaling",
    "ClippingWarning",
    "clipped_share",
    "warn_if_clipped",
]

BOUNDS_PUBLIC = "public (stated by the data owner)"
BOUNDS_PRIVATE = "the private data (min and max of each feature; not covered by the guarantee)"
BOUNDS_PRIVATE_SCALING = (
    "the private data: the features were scaled by the training rows' min and max of each feature, "
    "which are not covered by the guarantee"
)
#: How features can be made from raw values (:class:`Scaling`).
SCALINGS = ("minmax", "tanh255", "none")


@dataclass(frozen=True, eq=False)
class Scaling:
    """How the features were made from the raw values: ``kind`` of :data:`SCALINGS` and the raw
    bounds ``raw_lower``, ``raw_upper`` (p,) it maps.

    * ``minmax``: ``(x − raw_lower) / (raw_upper − raw_lower)``, raw bounds → [0, 1];
    * ``tanh255``: ``tanh(x / 255)`` (8-bit pixels, raw bounds [0, 255] by default);
    * ``none``: the raw values.

    :meth:`invert` maps features back to raw values (within the raw bounds). :meth:`scaled_d`
    turns an adjacency bound in raw units into one in feature units that covers
    it: minmax divides by the width; tanh is 1-Lipschitz, so a change of ``d`` raw units moves
    ``tanh(x/255)`` by at most ``d / 255``. :meth:`raw_d` is the inverse factor.
    """

    kind: str
    raw_lower: np.ndarray
    raw_upper: np.ndarray

    def __post_init__(self) -> None:
        if self.kind not in SCALINGS:
            raise ValueError(f"scaling must be one of {SCALINGS}, got {self.kind!r}.")
        object.__setattr__(self, "raw_lower", np.asarray(self.raw_lower, dtype=np.float64))
        object.__setattr__(self, "raw_upper", np.asarray(self.raw_upper, dtype=np.float64))

    def _factor(self) -> np.ndarray | float:
        """Feature units per raw unit (an upper bound of the slope of the map)."""
        if self.kind == "minmax":
            return 1.0 / (self.raw_upper - self.raw_lower)
        return 1.0 / 255.0 if self.kind == "tanh255" else 1.0

    def apply(self, x):
        """The features of raw values ``x`` (clipped to the raw bounds first)."""
        x = np.clip(np.asarray(x, dtype=np.float64), self.raw_lower, self.raw_upper)
        if self.kind == "minmax":
            return (x - self.raw_lower) / (self.raw_upper - self.raw_lower)
        return np.tanh(x / 255.0) if self.kind == "tanh255" else x

    def invert(self, features):
        """The raw values of ``features`` (the inverse of :meth:`apply` on its range): each
        feature is clipped to the image of the raw bounds first (so tanh255's inverse,
        ``255·artanh``, stays finite), so the result lies within the raw bounds."""
        low, high = self.apply(self.raw_lower), self.apply(self.raw_upper)
        f = np.clip(np.asarray(features, dtype=np.float64), low, high)
        if self.kind == "minmax":
            return self.raw_lower + f * (self.raw_upper - self.raw_lower)
        return 255.0 * np.arctanh(f) if self.kind == "tanh255" else f

    def scaled_d(self, d_raw):
        """The adjacency bound in feature units covering a change of ``d_raw`` raw units."""
        return np.asarray(d_raw, dtype=np.float64) * self._factor()

    def raw_d(self, d_scaled):
        """The change in raw units that an adjacency bound ``d_scaled`` in feature units covers:
        the raw width where ``d_scaled`` spans the features' whole range (any change is covered),
        else ``d_scaled`` divided by the slope bound."""
        d_scaled = np.asarray(d_scaled, dtype=np.float64)
        width = self.apply(self.raw_upper) - self.apply(self.raw_lower)
        return np.where(d_scaled >= width, self.raw_upper - self.raw_lower, d_scaled / self._factor())

    def describe(self) -> dict:
        return {"kind": self.kind, "raw_lower": _compact(self.raw_lower), "raw_upper": _compact(self.raw_upper)}


def _compact(a) -> float | list[float]:
    a = np.atleast_1d(np.asarray(a, dtype=np.float64))
    return float(a[0]) if a.size and np.all(a == a[0]) else [float(v) for v in a]


class FeatureBounds(tuple):
    """Feature bounds ``(lower, upper)`` that remember where they came from: a pair, usable as
    any estimator's ``bounds``.

    ``public``: whether they are known without looking at the private rows; ``scaling``: the
    :class:`Scaling` that made the features from raw values (so that the privacy statement gives
    the bounds and d in raw units too), or None. :func:`kahm_dask.datasets.split_and_scale`
    returns them as ``split.bounds``: public when it was given public raw bounds, private (the
    training split's min/max) otherwise, and a fit with private ones warns and says so.
    """

    public: bool
    scaling: Scaling | None

    def __new__(cls, lower, upper, *, public: bool, scaling: Scaling | None = None) -> FeatureBounds:
        self = super().__new__(cls, (lower, upper))
        self.public = bool(public)
        self.scaling = scaling
        return self

    def __getnewargs_ex__(self) -> tuple[tuple, dict]:
        return (self[0], self[1]), {"public": self.public, "scaling": self.scaling}

    def __repr__(self) -> str:
        kind = "public" if self.public else "private"
        how = "" if self.scaling is None else f", scaling={self.scaling.kind!r}"
        return f"FeatureBounds({self[0]!r}, {self[1]!r}, {kind}{how})"

    @property
    def source(self) -> str:
        """:data:`BOUNDS_PUBLIC` or :data:`BOUNDS_PRIVATE_SCALING` (for the statement)."""
        return BOUNDS_PUBLIC if self.public else BOUNDS_PRIVATE_SCALING


class ResolvedBounds(NamedTuple):
    """The bounds of a release: ``lower``, ``upper`` (p,) float64, ``source`` (for the statement:
    :data:`BOUNDS_PUBLIC`, :data:`BOUNDS_PRIVATE` or :data:`BOUNDS_PRIVATE_SCALING`) and the
    ``scaling`` of the features, when known."""

    lower: np.ndarray
    upper: np.ndarray
    source: str
    scaling: Scaling | None = None


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


def resolve_bounds(bounds, X: np.ndarray, *, stacklevel: int = 2) -> ResolvedBounds:
    """The bounds of a release of X (n, p): the public ``bounds``; those of X with a warning
    when None; a :class:`FeatureBounds` with its provenance (a private one warns)."""
    if bounds is None:
        return ResolvedBounds(*bounds_from_private_data(X, stacklevel=stacklevel + 1), BOUNDS_PRIVATE)
    lower, upper = public_bounds(tuple(bounds), X.shape[1])
    if not isinstance(bounds, FeatureBounds):
        return ResolvedBounds(lower, upper, BOUNDS_PUBLIC)
    if not bounds.public:
        warn_private_scaling(stacklevel=stacklevel + 1)
    return ResolvedBounds(lower, upper, bounds.source, bounds.scaling)


class ClippingWarning(UserWarning):
    """Many entries lie outside the bounds of a release (they are clipped): are the bounds in
    the data's units? The share is computed from the private rows and shown to the owner only
    (a warning on the owner's console, never in a published file)."""


#: Share of clipped entries above which a release warns (:func:`warn_if_clipped`).
CLIP_WARN_SHARE = 0.01


def clipped_share(X, lower: np.ndarray, upper: np.ndarray):
    """Share of the entries of X (n, p) outside ``[lower, upper]`` (a NumPy float, or a lazy
    0-d dask array for a dask X)."""
    return ((X < lower) | (X > upper)).mean()


def warn_if_clipped(share: float, lower: np.ndarray, upper: np.ndarray, *, stacklevel: int = 2) -> None:
    """Warn (:class:`ClippingWarning`) when more than :data:`CLIP_WARN_SHARE` of the entries are
    clipped to the bounds of a release."""
    if share <= CLIP_WARN_SHARE:
        return
    lo, hi = _compact(lower), _compact(upper)
    shown = f"[{lo:g}, {hi:g}]" if isinstance(lo, float) and isinstance(hi, float) else "the bounds"
    warnings.warn(
        f"{100 * share:.1f} % of the entries lie outside {shown} and are clipped to them before the noise (a "
        "count made on the private rows, shown to you only). Are the bounds in the data's units? E.g. "
        "digits count pixels 0 to 16: bounds (0, 16), or scale to [0, 1] first (kahm-dask ingest --bounds "
        "0 16 --scale minmax; split_and_scale(..., bounds=(0, 16))).",
        ClippingWarning,
        stacklevel=stacklevel + 1,
    )


def warn_private_scaling(
    *, remedy: str = "e.g. split_and_scale(X, y, bounds=(lower, upper)) or data.bounds in a pipeline file",
    stacklevel: int = 2,
) -> None:
    """The :class:`PrivacyLeakWarning` of features scaled by their private min and max;
    ``remedy`` names the caller's way to give public bounds."""
    warnings.warn(
        "the features were scaled by the training rows' min and max, which are private: the guarantee "
        f"does not cover them (one entry can move a whole column's scale). Scale by public bounds instead, "
        f"{remedy}.",
        PrivacyLeakWarning,
        stacklevel=stacklevel + 1,
    )
