"""Membership-inference score and attack (docs/algorithm.md#membership).

* ``mis`` (eq. 73 at o = 0; docs/algorithm.md#mis) -- LSDD between sample set 1,
  ``min_c Gamma_c(y)`` over the (original, private) training rows, and sample set 2, the same
  over the test rows; and ``mis_norm`` (docs/algorithm.md#mis-reporting) -- the same on the
  distances divided by their pooled median.
* The scale-free threshold attack of docs/algorithm.md#mis-reporting with score
  ``-min_c Gamma_c(y)``: ROC AUC, attacker advantage and TPR at 1 % / 0.1 % FPR.

The classifier-level functions take any object with a ``class_distances(X) -> (m, C)`` method.
The ``*_from_distances`` functions take the 1-D arrays of min-over-class distances directly (for
pipelines that compute distances elsewhere). One ``random_state`` seeds a whole evaluation: the
training-row subset (docs/algorithm.md#mis) uses its child stream 0 and LSDD its child
stream 1, so ``membership_inference_score(clf, X_train, X_test, random_state=s)`` equals
``membership_inference_from_distances(dist[training_row_subset(n, m, s)], dist_test,
random_state=s)``, and the attack with the same seed sees the same training rows.

The density difference is :func:`~kahm_dask.privacy.lsdd.lsdd` (:mod:`kahm_dask.privacy.lsdd`).

Decisions: docs/decisions.md#decision-mis-members,
docs/decisions.md#decision-mis-norm, docs/decisions.md#decision-membership-subsets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import rankdata
from sklearn.metrics import roc_auc_score, roc_curve

from kahm_dask._random import RandomState, as_generator, as_seed_sequence, child_seed_sequence
from kahm_dask._validation import as_data_matrix, check_positive_int
from kahm_dask.privacy.lsdd import lsdd_runs

__all__ = [
    "MembershipInference",
    "MembershipAttack",
    "SUBSET_STREAM",
    "LSDD_STREAM",
    "training_row_subset",
    "membership_inference_from_distances",
    "membership_attack_from_distances",
    "membership_inference_score",
    "membership_attack",
    "membership_evaluation",
]

#: Child streams of a membership-evaluation seed (docs/algorithm.md#mis): the training-row
#: subset, and the seed of the LSDD estimate.
SUBSET_STREAM, LSDD_STREAM = 0, 1


class SupportsClassDistances(Protocol):
    """A classifier exposing the per-class distances ``Gamma_c(y)`` as an (m, C) array
    (docs/algorithm.md#classifier)."""

    def class_distances(self, X: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class MembershipInference:
    """Report of docs/algorithm.md#mis-reporting: ``mis`` (raw), ``mis_norm`` (distances
    divided by ``median_distance``), the pooled finite median ``median_distance`` (m~), the
    number of training rows used, the number of test rows and the number of ``+inf`` distances
    left out of the LSDD samples."""

    mis: float
    mis_norm: float
    median_distance: float
    n_train_used: int
    n_test: int
    n_infinite: int


@dataclass(frozen=True)
class MembershipAttack:
    """Threshold attack of docs/algorithm.md#mis-reporting, score ``-min_c Gamma_c``: ROC AUC
    (0.5 = no signal), attacker advantage ``max |TPR - FPR|``, the largest TPR at FPR <= 1 % and
    <= 0.1 %, and the numbers of members (training rows, label 1) and non-members (test rows,
    label 0)."""

    auc: float
    advantage: float
    tpr_at_1pct_fpr: float
    tpr_at_0_1pct_fpr: float
    n_members: int
    n_nonmembers: int


# ----------------------------------------------------------------------------------------------
# Distances -> mis / attack (docs/algorithm.md#mis, docs/algorithm.md#mis-reporting)
# ----------------------------------------------------------------------------------------------


def _as_distances(dist: ArrayLike, name: str) -> np.ndarray:
    """1-D float64 distances in [0, +inf]; NaN, negative values and -inf raise ``ValueError``."""
    arr = np.asarray(dist, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(
            f"{name} must be a non-empty 1-D array of distances, got shape {arr.shape}."
        )
    if np.isnan(arr).any() or (arr < 0).any():
        raise ValueError(f"{name} must hold distances >= 0 (+inf allowed), found NaN or negatives.")
    return arr


def training_row_subset(
    n_rows: int, max_train_rows: int | None, random_state: RandomState = 0
) -> np.ndarray:
    """Indices (sorted, int64) of the training rows used for ``mis`` and the attack
    (docs/algorithm.md#mis).

    All rows when ``max_train_rows`` is None or >= ``n_rows``; otherwise a uniform random subset
    of ``max_train_rows`` rows drawn without replacement from child stream 0 of
    ``random_state`` (the stream every membership function uses for this subset).
    """
    n_rows = check_positive_int(n_rows, "n_rows")
    if (
        max_train_rows is None
        or check_positive_int(max_train_rows, "max_train_rows", minimum=2) >= n_rows
    ):
        return np.arange(n_rows)
    rng = as_generator(child_seed_sequence(as_seed_sequence(random_state), SUBSET_STREAM))
    return np.sort(rng.choice(n_rows, max_train_rows, replace=False))


def membership_inference_from_distances(
    dist_train: ArrayLike,
    dist_test: ArrayLike,
    *,
    random_state: RandomState = 0,
    **lsdd_kwargs: Any,
) -> MembershipInference:
    """``mis`` and ``mis_norm`` from min-over-class distances.

    See docs/algorithm.md#mis and docs/algorithm.md#mis-reporting.

    ``dist_train`` (n_train,) are ``min_c Gamma_c`` of the training rows used (sample set 1),
    ``dist_test`` (n_test,) those of the test rows (sample set 2). ``+inf`` values are left out of
    the LSDD samples and counted. ``mis`` is the unclipped :func:`~kahm_dask.privacy.lsdd.lsdd` estimate on the finite
    distances; ``mis_norm`` the same (same ``lsdd_kwargs``, same seed: child stream 1 of
    ``random_state``) on the distances divided by their pooled finite median m~ (m~ = 1 if that
    median is 0). A user ``sigma_list`` is passed unchanged to both calls, i.e. it is in raw
    distance units for ``mis`` and in units of m~ for ``mis_norm``.

    Both estimates come from one :func:`lsdd_runs` pass: with the default grid the two runs have
    the same kernels in raw units (the median scale of the scaled distances is the raw one over
    m~), so the median, the kernel sums and the eigendecompositions are computed once. Each
    estimate equals the separate :func:`~kahm_dask.privacy.lsdd.lsdd` call up to rounding.
    """
    dist_train = _as_distances(dist_train, "dist_train")
    dist_test = _as_distances(dist_test, "dist_test")
    finite_train = dist_train[np.isfinite(dist_train)]
    finite_test = dist_test[np.isfinite(dist_test)]
    for finite, dist, name in (
        (finite_train, dist_train, "dist_train"),
        (finite_test, dist_test, "dist_test"),
    ):
        if finite.size == 0:
            raise ValueError(f"{name}: all {dist.size} distances are +inf; mis is undefined.")
    median = float(np.median(np.concatenate([finite_train, finite_test])))
    median = median if median > 0.0 else 1.0
    lsdd_seed = child_seed_sequence(as_seed_sequence(random_state), LSDD_STREAM)
    raw, norm = lsdd_runs(
        finite_train, finite_test, (1.0, median), random_state=lsdd_seed, **lsdd_kwargs
    )
    return MembershipInference(
        mis=raw.l2,
        mis_norm=norm.l2,
        median_distance=median,
        n_train_used=int(dist_train.size),
        n_test=int(dist_test.size),
        n_infinite=int(dist_train.size - finite_train.size + dist_test.size - finite_test.size),
    )


def _attack_scores(dist: np.ndarray) -> np.ndarray:
    """Finite attack scores with the order and ties of ``-dist``, ``+inf`` distances lowest.

    ``-dist``, with the ``+inf`` distances set to the float just below the lowest finite score
    (all to 0 if every distance is infinite); the dense rank of ``-dist`` when that float would
    not be finite (a distance of about 1.8e308).
    """
    scores = -dist
    infinite = np.isinf(scores)
    if infinite.any():
        lowest = float(scores[~infinite].min()) if not infinite.all() else 0.0
        if lowest == -np.finfo(np.float64).max:
            return rankdata(scores, method="dense").astype(np.float64)
        scores[infinite] = np.nextafter(lowest, -np.inf)
    return scores


def membership_attack_from_distances(
    dist_train: ArrayLike, dist_test: ArrayLike
) -> MembershipAttack:
    """Threshold attack of docs/algorithm.md#mis-reporting from min-over-class distances.

    Members (label 1) are the training rows (``dist_train``), non-members (label 0) the test rows.
    The attack score is ``-min_c Gamma_c`` with every ``+inf`` distance mapped to one finite
    score below all others (ROC metrics depend only on the order of the scores, ties included:
    this is the order of their dense rank, without ranking): such rows are never called members
    before any finite row.
    """
    dist_train = _as_distances(dist_train, "dist_train")
    dist_test = _as_distances(dist_test, "dist_test")
    scores = _attack_scores(np.concatenate([dist_train, dist_test]))
    labels = np.concatenate([np.ones(dist_train.size), np.zeros(dist_test.size)])
    fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=False)
    return MembershipAttack(
        auc=float(roc_auc_score(labels, scores)),
        advantage=float(np.max(np.abs(tpr - fpr))),
        tpr_at_1pct_fpr=float(tpr[fpr <= 0.01].max()),
        tpr_at_0_1pct_fpr=float(tpr[fpr <= 0.001].max()),
        n_members=int(dist_train.size),
        n_nonmembers=int(dist_test.size),
    )


# ----------------------------------------------------------------------------------------------
# Classifier level
# ----------------------------------------------------------------------------------------------


def _min_class_distances(clf: SupportsClassDistances, X: np.ndarray, name: str) -> np.ndarray:
    """``min_c Gamma_c(y)`` for the rows of X, shape (m,), from ``clf.class_distances(X)``."""
    D = np.asarray(clf.class_distances(X), dtype=np.float64)
    if D.ndim != 2 or D.shape[0] != X.shape[0] or D.shape[1] == 0:
        raise ValueError(
            f"clf.class_distances({name}) must return an array of shape ({X.shape[0]}, n_classes), "
            f"got shape {D.shape}."
        )
    return D.min(axis=1)


def _membership_distances(
    clf: SupportsClassDistances,
    X_train: ArrayLike,
    X_test: ArrayLike,
    max_train_rows: int | None,
    random_state: RandomState,
) -> tuple[np.ndarray, np.ndarray]:
    """Sample sets 1 and 2 of docs/algorithm.md#mis: distances of the (subset of) training rows
    and test rows."""
    if not callable(getattr(clf, "class_distances", None)):
        raise TypeError("clf must provide a class_distances(X) -> (m, n_classes) method.")
    X_train = as_data_matrix(X_train, "X_train", min_rows=2)
    X_test = as_data_matrix(X_test, "X_test", min_rows=2)
    if X_train.shape[1] != X_test.shape[1]:
        raise ValueError(
            f"X_train has {X_train.shape[1]} features but X_test has {X_test.shape[1]}; "
            "they must have the same feature count."
        )
    rows = training_row_subset(X_train.shape[0], max_train_rows, random_state)
    X_used = X_train if rows.size == X_train.shape[0] else X_train[rows]
    return _min_class_distances(clf, X_used, "X_train"), _min_class_distances(clf, X_test, "X_test")


def membership_inference_score(
    clf: SupportsClassDistances,
    X_train: ArrayLike,
    X_test: ArrayLike,
    *,
    max_train_rows: int | None = None,
    random_state: RandomState = 0,
    **lsdd_kwargs: Any,
) -> MembershipInference:
    """``mis`` / ``mis_norm`` report for a classifier (docs/algorithm.md#mis-reporting).

    ``X_train`` (n, p) must be the **original private** training rows the classifier was built
    for (docs/decisions.md#decision-mis-members), not noisy or fabricated data; ``X_test``
    (m, p) the test rows. With ``max_train_rows`` a seeded uniform subset of the training rows is
    used (docs/algorithm.md#mis); the same ``random_state`` gives :func:`membership_attack` the
    same rows. ``lsdd_kwargs`` go to :func:`~kahm_dask.privacy.lsdd.lsdd`.
    """
    dist_train, dist_test = _membership_distances(
        clf, X_train, X_test, max_train_rows, random_state
    )
    return membership_inference_from_distances(
        dist_train, dist_test, random_state=random_state, **lsdd_kwargs
    )


def membership_attack(
    clf: SupportsClassDistances,
    X_train: ArrayLike,
    X_test: ArrayLike,
    *,
    max_train_rows: int | None = None,
    random_state: RandomState = 0,
) -> MembershipAttack:
    """Threshold attack (score ``-min_c Gamma_c``) on the original training rows vs test rows.

    See docs/algorithm.md#mis-reporting.

    The training-row subset is the one :func:`membership_inference_score` uses for the same
    ``max_train_rows`` and ``random_state``.
    """
    dist_train, dist_test = _membership_distances(
        clf, X_train, X_test, max_train_rows, random_state
    )
    return membership_attack_from_distances(dist_train, dist_test)


def membership_evaluation(
    clf: SupportsClassDistances,
    X_train: ArrayLike,
    X_test: ArrayLike,
    *,
    max_train_rows: int | None = None,
    random_state: RandomState = 0,
    **lsdd_kwargs: Any,
) -> tuple[MembershipInference, MembershipAttack]:
    """Both reports of docs/algorithm.md#mis-reporting from one pass of ``clf.class_distances``
    over the training and test rows.

    Equal to ``(membership_inference_score(...), membership_attack(...))`` with the same
    arguments, at half the distance computations; with ``random_state=None`` it is the only way
    to give both the same (fresh) training-row subset.
    """
    root = as_seed_sequence(random_state)
    dist_train, dist_test = _membership_distances(clf, X_train, X_test, max_train_rows, root)
    return (
        membership_inference_from_distances(
            dist_train, dist_test, random_state=root, **lsdd_kwargs
        ),
        membership_attack_from_distances(dist_train, dist_test),
    )
