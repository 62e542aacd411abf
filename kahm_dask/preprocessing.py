"""Scaling by public constants: the leak-free first step of a DP pipeline.

A fitted scaler (scikit-learn's ``StandardScaler``, ``MinMaxScaler``) learns its means,
deviations or ranges from the training rows. They are private statistics: one changed entry
moves a whole column's scale, and every scaled entry with it, which the per-entry guarantee of
a DP fit downstream does not cover; the estimator cannot see what came before it in a
``Pipeline`` and would call its bounds public. :class:`PublicScaler` learns nothing from the
rows: it maps the raw bounds the data owner states, known without looking at the data, to
[0, 1] with the one formula of :class:`~kahm_dask.privacy.bounds.Scaling` (``minmax``, entries
clipped to the bounds first), so the DP estimator after it takes ``bounds=(0, 1)``.

Examples
--------
>>> import numpy as np
>>> from sklearn.pipeline import make_pipeline
>>> from kahm_dask import KAHMClassifier
>>> from kahm_dask.datasets import load_bundled
>>> from kahm_dask.privacy.ledger import PrivacyLedger
>>> X, y = load_bundled("digits")                       # pixel counts 0..16: public bounds
>>> scaler = PublicScaler(0, 16)
>>> scaler.fit_transform(np.array([[0.0, 8.0, 16.0, 20.0]]))
array([[0. , 0.5, 1. , 1. ]])
>>> dp = KAHMClassifier(epsilon=2.0, bounds=scaler.feature_bounds(), random_state=0, ledger=PrivacyLedger())
>>> clf = make_pipeline(scaler, dp)
>>> clf.fit(X[:300], y[:300]).predict(X[:3]).shape
(3,)
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, OneToOneFeatureMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from kahm_dask.privacy.bounds import FeatureBounds, Scaling, public_bounds

__all__ = ["PublicScaler"]


class PublicScaler(OneToOneFeatureMixin, TransformerMixin, BaseEstimator):
    """Map public raw bounds ``[lower, upper]`` to [0, 1]: ``(clip(x) − lower) / (upper − lower)``.

    Parameters
    ----------
    lower, upper : float or (p,) array-like
        The raw range of every feature, known without looking at the data (pixels 0–255, a
        questionnaire's scale, an instrument's range). Entries outside are clipped to it.

    Attributes
    ----------
    n_features_in_ : int
        The number of features (p) seen in ``fit``; the only thing ``fit`` reads from the rows.
    feature_names_in_ : (p,) ndarray of str
        The column names of a DataFrame passed to ``fit``, if it had them.
    scaling_ : Scaling
        The map, with the raw bounds per feature.
    """

    def __init__(self, lower=0.0, upper=1.0) -> None:
        self.lower = lower
        self.upper = upper

    def fit(self, X, y=None) -> PublicScaler:
        """Check the bounds against X's number of features (p); nothing else is read from X (n, p)."""
        X = validate_data(self, X, dtype=np.float64, ensure_all_finite="allow-nan")
        lower, upper = public_bounds((self.lower, self.upper), X.shape[1])
        self.scaling_ = Scaling("minmax", lower, upper)
        return self

    def transform(self, X) -> np.ndarray:
        """``Scaling.apply``: X (n, p) → (n, p) float64 in [0, 1] (NaN stays NaN)."""
        check_is_fitted(self, "scaling_")
        X = validate_data(self, X, dtype=np.float64, reset=False, ensure_all_finite="allow-nan")
        return self.scaling_.apply(X)

    def feature_bounds(self) -> FeatureBounds:
        """The bounds of the output, (0, 1), public, remembering the raw bounds: give it as the DP
        estimator's ``bounds`` and its privacy statement states the bounds and d in raw units
        too. Needs no fit (it depends on the parameters only)."""
        return FeatureBounds(0.0, 1.0, public=True, scaling=Scaling("minmax", self.lower, self.upper))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.requires_fit = True
        tags.input_tags.allow_nan = True
        return tags
