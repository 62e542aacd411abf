"""Data that ship with a package or are generated: scikit-learn's bundled sets, synthetic
blobs and the author's 2-D spiral, plus the default split (docs/algorithm.md#train-test-split)
and [0, 1] scaling.

Nothing here touches the network: only scikit-learn's ``load_*`` functions (bundled files) are
used; every ``fetch_*`` is rejected.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from sklearn import datasets as _skd
from sklearn.model_selection import train_test_split

from kahm_dask._random import as_generator
from kahm_dask.privacy.bounds import FeatureBounds, Scaling, public_bounds, warn_private_scaling

__all__ = [
    "BUNDLED",
    "load_bundled",
    "Split",
    "split_and_scale",
    "PUBLIC_BOUNDS",
    "MinMaxRange",
    "make_class_blobs",
    "make_spiral",
]

BUNDLED = {
    "digits": _skd.load_digits,
    "breast_cancer": _skd.load_breast_cancer,
    "iris": _skd.load_iris,
    "wine": _skd.load_wine,
}


def load_bundled(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(X (N, p) float64, y (N,)) of a scikit-learn dataset that ships with the package."""
    if name not in BUNDLED:
        raise ValueError(
            f"unknown bundled dataset {name!r}; available offline: {sorted(BUNDLED)} "
            "(scikit-learn's fetch_* datasets need the network and are not supported)."
        )
    X, y = BUNDLED[name](return_X_y=True)
    return X.astype(np.float64), y


class MinMaxRange(NamedTuple):
    """Per-feature scaling to [0, 1]: ``(x − low) / width``; constant features map to 0."""

    low: np.ndarray
    width: np.ndarray

    @classmethod
    def fit(cls, X: np.ndarray) -> MinMaxRange:
        low, high = X.min(axis=0), X.max(axis=0)
        return cls(low, np.where(high > low, high - low, 1.0))

    def apply(self, X: np.ndarray) -> np.ndarray:
        return (X - self.low) / self.width


class Split(NamedTuple):
    """A train/test split: rows (N_train, p), (N_test, p), labels, and ``bounds``, the
    :class:`~kahm_dask.privacy.bounds.FeatureBounds` of the scaled features (public when the
    scaling used public raw bounds), None when not scaled. Pass ``bounds=split.bounds`` to a DP
    estimator: its privacy statement then says where the bounds came from, in raw units too."""

    X_train: np.ndarray
    X_test: np.ndarray
    y_train: np.ndarray
    y_test: np.ndarray
    bounds: FeatureBounds | None = None


#: Public feature ranges of the bundled data sets that have one (digits: 4x4 pixel counts 0–16).
PUBLIC_BOUNDS = {"digits": (0.0, 16.0)}


def split_and_scale(
    X, y, *, test_size: float = 0.3, split_seed: int = 0, scale: bool = True, bounds=None
) -> Split:
    """Stratified seeded split; with ``scale``, features mapped to [0, 1].

    ``bounds=(lower, upper)`` (public, scalars or per-feature arrays: the raw range known without
    looking at the data, e.g. ``PUBLIC_BOUNDS["digits"]``) scale by ``(x − lower) / (upper −
    lower)``: no private statistic is used, and ``split.bounds`` is the public [0, 1]. Without
    them, by the training split's min/max, which are private: one entry changed moves a whole
    column's scale. That warns with :class:`~kahm_dask.privacy.randomness.PrivacyLeakWarning`
    and ``split.bounds`` is marked private, so a DP fit with it names the leak in its statement
    (test values may then fall slightly outside [0, 1]).

    >>> X, y = load_bundled("digits")
    >>> split = split_and_scale(X, y, bounds=PUBLIC_BOUNDS["digits"])
    >>> split.bounds
    FeatureBounds(0.0, 1.0, public, scaling='minmax')
    """
    Xtr, Xte, ytr, yte = train_test_split(
        np.asarray(X, dtype=np.float64), np.asarray(y), test_size=test_size, stratify=y,
        random_state=split_seed,
    )
    if not scale:
        return Split(Xtr, Xte, ytr, yte)
    if bounds is not None:
        lower, upper = public_bounds(bounds, Xtr.shape[1])
        rng = MinMaxRange(lower, upper - lower)
    else:
        warn_private_scaling(stacklevel=2)
        rng = MinMaxRange.fit(Xtr)
    scaling = Scaling("minmax", rng.low, rng.low + rng.width)
    return Split(rng.apply(Xtr), rng.apply(Xte), ytr, yte, FeatureBounds(0.0, 1.0, public=bounds is not None,
                                                                       scaling=scaling))


def make_class_blobs(
    n_samples: int, n_features: int = 20, n_classes: int = 10, *, separation: float = 6.0,
    random_state=None,
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian classes (unit covariance, centres ``separation`` apart in RMS), features
    squashed to [0, 1] by a logistic map. Returns X (N, p) float64, y (N,) int64."""
    rng = as_generator(random_state)
    centres = rng.standard_normal((n_classes, n_features)) * (separation / np.sqrt(2.0 * n_features))
    y = rng.integers(0, n_classes, size=n_samples)
    X = centres[y] + rng.standard_normal((n_samples, n_features))
    return 1.0 / (1.0 + np.exp(-X / 4.0)), y.astype(np.int64)


def make_spiral(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The author's 2-D three-arm spiral (``datagen`` of demoGIKM.m).

    The data of docs/oracles.md#oracle-spiral (whose test checks it against the formula).

    u : (k,) positions in [0, 1]. Returns X (3k, 2) with rows (r sin t, r cos t),
    r = 0.25 + 0.7u, t = 2c + 2u for classes c = 1, 2, 3, and y (3k,) in {1, 2, 3}.
    """
    u = np.asarray(u, dtype=np.float64)
    X, y = [], []
    for c in (1, 2, 3):
        r, t = 0.25 + 0.7 * u, 2 * c + 2 * u
        X.append(np.column_stack([r * np.sin(t), r * np.cos(t)]))
        y.append(np.full(u.shape[0], c))
    return np.vstack(X), np.concatenate(y)
