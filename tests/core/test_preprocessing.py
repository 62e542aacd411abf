"""PublicScaler: scaling by public constants (kahm_dask.preprocessing).

It is a scikit-learn transformer (check_estimator), maps the stated bounds to [0, 1] with
Scaling's formula, learns nothing from the rows, and hands a DP estimator public bounds that
its privacy statement gives in raw units.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.pipeline import make_pipeline
from sklearn.utils.estimator_checks import parametrize_with_checks

from kahm_dask import KAHMClassifier
from kahm_dask.preprocessing import PublicScaler
from kahm_dask.privacy.bounds import BOUNDS_PUBLIC, Scaling
from kahm_dask.privacy.randomness import PrivacyLeakWarning


@parametrize_with_checks([PublicScaler(), PublicScaler(-5.0, 5.0)])
def test_is_a_scikit_learn_transformer(estimator, check):
    check(estimator)


def test_maps_the_public_bounds_to_the_unit_interval_per_feature():
    X = np.array([[0.0, -1.0], [8.0, 0.0], [16.0, 1.0], [20.0, -3.0]])
    out = PublicScaler([0.0, -1.0], [16.0, 1.0]).fit_transform(X)
    np.testing.assert_array_equal(out, [[0.0, 0.0], [0.5, 0.5], [1.0, 1.0], [1.0, 0.0]])
    np.testing.assert_array_equal(out, Scaling("minmax", [0.0, -1.0], [16.0, 1.0]).apply(X))


def test_fit_learns_nothing_from_the_rows():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(50, 3)), 100 * rng.normal(size=(7, 3))
    query = rng.normal(size=(5, 3))
    np.testing.assert_array_equal(PublicScaler(-2, 2).fit(a).transform(query),
                                  PublicScaler(-2, 2).fit(b).transform(query))


def test_feature_names_pass_through():
    df = pd.DataFrame({"height": [1.0, 2.0], "weight": [3.0, 4.0]})
    scaler = PublicScaler(0, 10).fit(df)
    assert scaler.get_feature_names_out().tolist() == ["height", "weight"]


@pytest.mark.parametrize("lower, upper, pattern", [
    (1.0, 0.0, "upper must exceed lower"),
    ([0.0, 0.0, 0.0], 1.0, "arrays of 2 values"),
    (0.0, np.inf, "finite"),
])
def test_bad_bounds_are_refused_at_fit(lower, upper, pattern):
    with pytest.raises(ValueError, match=pattern):
        PublicScaler(lower, upper).fit(np.zeros((3, 2)))


def test_in_a_pipeline_the_dp_fit_states_public_bounds_in_raw_units(digits):
    X = digits.X_train * 16.0  # back to the raw pixel counts 0..16
    scaler = PublicScaler(0, 16)
    clf = make_pipeline(scaler, KAHMClassifier(epsilon=2.0, bounds=scaler.feature_bounds(), random_state=0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        clf.fit(X[:300], digits.y_train[:300])
    statement = clf[-1].privacy_statement_
    assert statement.bounds_source == BOUNDS_PUBLIC and not statement.weakenings
    assert "16" in statement.to_markdown()
