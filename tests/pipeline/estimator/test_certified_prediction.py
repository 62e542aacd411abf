"""The certified prediction of the Dask estimator (``eval_dtype="auto"``,
docs/algorithm.md#certified-prediction; tests/core/test_certified_prediction.py tests it in the
in-memory classifier): its predictions are those of the float64 class distances for NumPy and
lazy dask input, also when the bound decides no row and every row takes the float64 tasks, and
they equal the in-memory classifier's.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from kahm_dask import DaskKAHMClassifier, KAHMClassifier, float32_bound
from kahm_dask.pipeline import predict


@pytest.fixture(scope="module")
def fitted(digits, tmp_path_factory):
    """The in-memory classifier and the Dask estimator on its model store."""
    clf = KAHMClassifier(random_state=0).fit(digits.X_train, digits.y_train)
    return clf, DaskKAHMClassifier.from_local(clf, tmp_path_factory.mktemp("certified") / "model.zarr")


def _float64_labels(est, X) -> np.ndarray:
    D = est.set_params(eval_dtype="float64").class_distances(X)
    est.set_params(eval_dtype="auto")
    return est.classes_[np.argmin(np.asarray(D), axis=1)]


def test_dask_predictions_are_the_float64_ones(client, fitted, digits):
    clf, est = fitted
    assert est.eval_dtype == "auto"
    expected = _float64_labels(est, digits.X_test)
    np.testing.assert_array_equal(est.predict(digits.X_test), expected)
    lazy = est.predict(da.from_array(digits.X_test, chunks=(150, -1)))
    assert isinstance(lazy, da.Array)
    np.testing.assert_array_equal(lazy.compute(), expected)
    np.testing.assert_array_equal(clf.predict(digits.X_test), expected)


#: Rows the final task of each chunk found undecided (appended to in the threaded workers: the
#: counting function below is pickled by reference, so it and this list are this module's).
UNDECIDED: list[int] = []
_RESOLVED_CODES = predict._resolved_codes


def _counting_resolved_codes(intervals: np.ndarray, distances: np.ndarray) -> np.ndarray:
    C = distances.shape[1]
    UNDECIDED.append(int(np.count_nonzero(float32_bound.certified_argmin(intervals[:, :C], intervals[:, C:]) < 0)))
    return _RESOLVED_CODES(intervals, distances)


def test_with_no_row_decided_the_float64_tasks_settle_every_row(client, fitted, digits, monkeypatch):
    _, est = fitted
    monkeypatch.setattr(float32_bound, "gemm_constant", lambda n_rows: 1e30)  # the workers are threads here
    monkeypatch.setattr(predict, "_resolved_codes", _counting_resolved_codes)
    UNDECIDED.clear()
    predicted = est.predict(digits.X_test)
    assert sum(UNDECIDED) == len(digits.X_test)
    np.testing.assert_array_equal(predicted, _float64_labels(est, digits.X_test))
