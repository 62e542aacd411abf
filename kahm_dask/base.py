"""What the in-memory and the Dask classifier share: one base, as xgboost's ``DaskXGBClassifier``
shares ``XGBClassifierBase``.

:class:`KAHMClassifierBase` holds the parameter checks (the rules of :data:`kahm_dask.params.PARAMS`,
the ``r_value``/``r_source`` rule and the budget) and every prediction that is a function of the
per-class distances Γ_c (Definitions 7 and 8): ``predict``, ``match_score``, ``predict_proba`` and
``decision_function``. A subclass gives the distances (:meth:`KAHMClassifierBase._map_distances`:
NumPy for the in-memory classifier, lazy blockwise dask arrays for the Dask one) and its
``_parameter_constraints``; both keep an explicit scikit-learn signature, checked against the
parameter table by the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted

from kahm_dask.params import check_estimator_params, check_privacy_target, check_r_value
from kahm_dask.privacy.ledger import check_budget

__all__ = ["KAHMClassifierBase", "class_matching_scores", "class_proportions", "exponent_ratios"]


def class_matching_scores(distances: np.ndarray) -> np.ndarray:
    """Class-matching scores ``ms_c(y) = exp(−Γ_c² / Σ_c' Γ_c'²)`` (Definition 8, eq. 67).

    distances : (m, C) per-class distances Γ_c ≥ 0, possibly +∞. Returns (m, C) in
    [e^{-1}, 1]. Rows of zeros give 1 everywhere; with k ≥ 1 infinite entries in a row, those
    get e^{-1/k} and the finite ones 1 (the limit rule,
    docs/decisions.md#decision-infinite-distances).
    """
    return np.exp(-exponent_ratios(np.asarray(distances, dtype=np.float64)))


def class_proportions(distances: np.ndarray) -> np.ndarray:
    """The class-matching scores (:func:`class_matching_scores`) of distances (m, C), scaled to
    sum to 1 per row → (m, C): what ``predict_proba`` returns (a monotone re-expression of the
    distances, not a calibrated probability)."""
    ms = class_matching_scores(distances)
    return ms / ms.sum(axis=1, keepdims=True)


def exponent_ratios(D: np.ndarray) -> np.ndarray:
    """``Γ_c² / Σ_c' Γ_c'²`` per row of D (m, C) with the zero-row and +∞ rules of Definition 8."""
    inf = np.isinf(D)
    finite = np.where(inf, 0.0, D)
    scale = finite.max(axis=1, keepdims=True)
    scale[scale == 0] = 1.0
    sq = (finite / scale) ** 2
    total = sq.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(total > 0, sq / total, 0.0)
    n_inf = inf.sum(axis=1, keepdims=True)
    return np.where(n_inf > 0, np.where(inf, 1.0 / np.maximum(n_inf, 1), 0.0), ratio)


def _two_class_decision(D: np.ndarray) -> np.ndarray:
    """``log ms_1 − log ms_0`` of two-class distances D (m, 2) → (m,)."""
    log_ms = -exponent_ratios(D)
    return log_ms[:, 1] - log_ms[:, 0]


def _negated(D: np.ndarray) -> np.ndarray:
    return -D


class KAHMClassifierBase(ClassifierMixin, BaseEstimator):
    """The shared part of :class:`~kahm_dask.KAHMClassifier` and
    :class:`~kahm_dask.DaskKAHMClassifier` (module docstring). Not an estimator on its own."""

    _parameter_constraints: dict = {}
    #: The fitted attribute whose presence means "fitted" (``check_is_fitted``).
    _fitted_attribute = "classes_"

    def _check_params(self) -> int | float | None:
        """Raise scikit-learn's ``InvalidParameterError`` (a ValueError and a TypeError) naming
        the first parameter that breaks its rule; returns ``r_value`` as ``r_source`` takes it."""
        check_estimator_params(self)
        check_privacy_target(self.epsilon, self.record_epsilon, type(self).__name__)
        check_budget(self.budget, "budget")
        return check_r_value(self.r_source, self.r_value, type(self).__name__)

    def _map_distances(self, X, fn: Callable[[np.ndarray], np.ndarray], *, rows: bool, dtype: Any):
        """``fn`` of the (m, C) class distances of X, block by block; ``rows``: ``fn`` gives one
        value per row (m,), else (m, C); ``dtype``: of the result."""
        raise NotImplementedError

    def _labels(self, D: np.ndarray) -> np.ndarray:
        return self.classes_[np.argmin(D, axis=1)]

    def _predicts_certified(self) -> bool:
        """Whether :meth:`predict` takes the certified float32 route: ``eval_dtype="auto"`` and
        single-layer branches, where the float32 error bound exists
        (docs/algorithm.md#float32-error-bound), routed or not; otherwise predictions come from the
        class distances in ``eval_dtype``."""
        return self.eval_dtype == "auto" and self.n_layers == 1

    def predict(self, X):
        """Class of minimum distance (Definition 7, eq. 66; ties: the lowest class index) → (m,).

        With ``eval_dtype="auto"`` (the default) every row is evaluated in float32, and a row whose
        float64 class the proven error bound does not decide is evaluated again in float64: the
        predictions are those of the float64 distances (docs/algorithm.md#certified-prediction)."""
        check_is_fitted(self, self._fitted_attribute)
        if self._predicts_certified():
            return self._certified_labels(X)
        return self._map_distances(X, self._labels, rows=True, dtype=self.classes_.dtype)

    def _certified_labels(self, X):
        """The labels of the certified prediction of X (:meth:`predict`)."""
        raise NotImplementedError

    def match_score(self, X):
        """Class-matching scores (Definition 8) → (m, C) in [e^{-1}, 1]; not probabilities."""
        return self._map_distances(X, class_matching_scores, rows=False, dtype=np.float64)

    def predict_proba(self, X):
        """Class-matching scores normalised to sum to 1 per row → (m, C).

        A monotone re-expression of the distances, not a calibrated probability
        (:func:`class_proportions`).
        """
        return self._map_distances(X, class_proportions, rows=False, dtype=np.float64)

    def decision_function(self, X):
        """Negated distances ``−Γ_c`` → (m, C).

        For two classes (scikit-learn convention: one column, positive means
        ``classes_[1]``) it returns ``log ms_1 − log ms_0 = (Γ_0² − Γ_1²) / (Γ_0² + Γ_1²)``
        → (m,) in [−1, 1], which ranks rows exactly like ``predict_proba[:, 1]``.
        """
        check_is_fitted(self, self._fitted_attribute)
        if len(self.classes_) == 2:
            return self._map_distances(X, _two_class_decision, rows=True, dtype=np.float64)
        return self._map_distances(X, _negated, rows=False, dtype=np.float64)
