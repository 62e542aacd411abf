"""The certified prediction of the Dask estimator (``eval_dtype="auto"``,
docs/algorithm.md#certified-prediction; tests/core/test_certified_prediction.py tests it in the
in-memory classifier): its predictions are those of the float64 class distances for NumPy and
lazy dask input, also when the bound decides no row and every row takes the float64 tasks, and
they equal the in-memory classifier's; with routing (``n_probe``) too, whose intervals hold the
float64 routed class distances.
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


@pytest.fixture(scope="module")
def routed(digits, tmp_path_factory):
    """The in-memory classifier of two branches in most classes, routed to the nearest one, and
    the Dask estimator on its model store."""
    clf = KAHMClassifier(random_state=0, block_size=60, n_probe=1).fit(digits.X_train, digits.y_train)
    assert sum(model.n_branches_ > 1 for model in clf.models_) >= 5
    return clf, DaskKAHMClassifier.from_local(clf, tmp_path_factory.mktemp("routed") / "model.zarr")


#: The (m, 2C) intervals the final task of each chunk received (as UNDECIDED).
INTERVALS: list[np.ndarray] = []


def _recording_resolved_codes(intervals: np.ndarray, distances: np.ndarray) -> np.ndarray:
    INTERVALS.append(intervals.copy())
    return _RESOLVED_CODES(intervals, distances)


def test_routed_dask_predictions_are_the_float64_ones(client, routed, digits, monkeypatch):
    clf, est = routed
    assert est.n_probe == 1 and est.eval_dtype == "auto"
    X = digits.X_test
    expected = _float64_labels(est, X)
    lazy = est.predict(da.from_array(X, chunks=(150, -1)))
    np.testing.assert_array_equal(lazy.compute(), expected)
    np.testing.assert_array_equal(clf.predict(X), expected)
    # the intervals (one chunk, so one array in row order) hold the float64 routed class
    # distances, and not the exhaustive ones
    monkeypatch.setattr(predict, "_resolved_codes", _recording_resolved_codes)
    INTERVALS.clear()
    np.testing.assert_array_equal(est.predict(da.from_array(X, chunks=(len(X), -1))).compute(), expected)
    C = len(est.classes_)
    [intervals] = INTERVALS
    D_routed = np.asarray(est.set_params(eval_dtype="float64").class_distances(X))
    D_all = np.asarray(est.set_params(n_probe=None).class_distances(X))
    est.set_params(n_probe=1, eval_dtype="auto")
    assert np.all((intervals[:, :C] <= D_routed) & (D_routed <= intervals[:, C:]))
    assert np.any(D_all < intervals[:, :C])


def test_routed_with_no_row_decided_the_float64_tasks_settle_every_row(client, routed, digits, monkeypatch):
    _, est = routed
    monkeypatch.setattr(float32_bound, "gemm_constant", lambda n_rows: 1e30)
    monkeypatch.setattr(predict, "_resolved_codes", _counting_resolved_codes)
    UNDECIDED.clear()
    predicted = est.predict(digits.X_test)
    assert sum(UNDECIDED) == len(digits.X_test)
    np.testing.assert_array_equal(predicted, _float64_labels(est, digits.X_test))
