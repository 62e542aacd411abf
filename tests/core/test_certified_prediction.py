"""The certified prediction (``eval_dtype="auto"``, docs/algorithm.md#certified-prediction).

``predict`` evaluates every row in float32 with the proven error bound and evaluates again in
float64 the rows whose class the bound does not decide: its predictions must be those of the
float64 class distances, whatever share of rows the bound decides. Checked on digits and breast
cancer with the real bound, with a bound so wide that no row is decided (everything goes through
the float64 fallback) and with the rule of ``certified_argmin`` on intervals whose answer is known;
the float64 class is always among ``candidate_classes`` (the classes a re-evaluated row is
evaluated under); the same with routing (``n_probe``), whose routed intervals hold the float64
routed distance; deeper models predict from the float64 distances; ``class_distances`` under
"auto" is the float64 evaluation, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from kahm_dask import KAHMClassifier, float32_bound
from kahm_dask.float32_bound import candidate_classes, certified_argmin, class_intervals


def _float64_predictions(clf: KAHMClassifier, X: np.ndarray) -> np.ndarray:
    return clf.classes_[np.argmin(clf.set_params(eval_dtype="float64").class_distances(X), axis=1)]


def _counting_fallback(monkeypatch) -> list[int]:
    """Record how many rows each block sends back to float64."""
    seen: list[int] = []
    real = float32_bound.certified_argmin

    def counted(lower, upper):
        codes = real(lower, upper)
        seen.append(int(np.count_nonzero(codes < 0)))
        return codes

    monkeypatch.setattr("kahm_dask.classifier.certified_argmin", counted)
    return seen


def test_digits_predictions_are_the_float64_ones(digits, monkeypatch):
    clf = KAHMClassifier(random_state=0).fit(digits.X_train, digits.y_train)
    assert clf.eval_dtype == "auto"
    X = np.vstack([digits.X_test, digits.X_train])
    fallback = _counting_fallback(monkeypatch)
    auto = clf.predict(X)
    assert fallback and sum(fallback) < len(X)  # the float32 route decided rows
    np.testing.assert_array_equal(auto, _float64_predictions(clf, X))


def test_breast_cancer_predictions_are_the_float64_ones():
    X, y = load_breast_cancer(return_X_y=True)
    clf = KAHMClassifier(random_state=0).fit(X, y)
    np.testing.assert_array_equal(clf.predict(X), _float64_predictions(clf, X))


def test_with_no_row_decided_every_row_goes_back_to_float64(digits, monkeypatch):
    clf = KAHMClassifier(random_state=0, n_jobs=2).fit(digits.X_train, digits.y_train)
    monkeypatch.setattr(float32_bound, "gemm_constant", lambda n_rows: 1e30)  # bounds beyond any gap
    fallback = _counting_fallback(monkeypatch)
    auto = clf.predict(digits.X_test)
    assert sum(fallback) == len(digits.X_test)
    np.testing.assert_array_equal(auto, _float64_predictions(clf, digits.X_test))


def test_auto_distances_are_the_float64_evaluation(digits):
    clf = KAHMClassifier(random_state=0).fit(digits.X_train, digits.y_train)
    auto = clf.class_distances(digits.X_test)
    np.testing.assert_array_equal(auto, clf.set_params(eval_dtype="float64").class_distances(digits.X_test))


@pytest.fixture
def routed(digits):
    """A classifier of two branches in most classes, routed to the nearest one."""
    clf = KAHMClassifier(random_state=0, block_size=60, n_probe=1).fit(digits.X_train, digits.y_train)
    assert sum(model.n_branches_ > 1 for model in clf.models_) >= 5
    return clf


def test_routed_predictions_are_the_float64_ones(routed, digits, monkeypatch):
    X = np.vstack([digits.X_test, digits.X_train])
    fallback = _counting_fallback(monkeypatch)
    auto = routed.predict(X)
    assert fallback and sum(fallback) < len(X)  # the certified route is taken and decides rows
    np.testing.assert_array_equal(auto, _float64_predictions(routed, X))


def test_routed_with_no_row_decided_every_row_goes_back_to_float64(routed, digits, monkeypatch):
    monkeypatch.setattr(float32_bound, "gemm_constant", lambda n_rows: 1e30)
    fallback = _counting_fallback(monkeypatch)
    auto = routed.set_params(n_jobs=2).predict(digits.X_test)
    assert sum(fallback) == len(digits.X_test)
    np.testing.assert_array_equal(auto, _float64_predictions(routed, digits.X_test))


def test_routed_intervals_hold_the_float64_routed_distance(routed, digits):
    X = digits.X_test
    below = 0
    for model in routed.models_:
        gamma, lower, upper = model._distance_intervals(X, "float32", n_probe=1)
        g64 = model._distance_rows(X, n_probe=1, dtype="float64")[0]
        assert np.all((lower <= g64) & (g64 <= upper)) and np.all(lower <= gamma) and np.all(gamma <= upper)
        below += np.count_nonzero(model._distance_rows(X, dtype="float64")[0] < lower)
    assert below  # the interval is the routed one's: the exhaustive minimum falls below it for some rows


def test_deeper_models_predict_from_the_float64_distances(digits, monkeypatch):
    clf = KAHMClassifier(random_state=0, n_layers=2).fit(digits.X_train, digits.y_train)
    fallback = _counting_fallback(monkeypatch)
    auto = clf.predict(digits.X_test)
    assert not fallback  # the certified route is not taken: no bound exists there
    np.testing.assert_array_equal(auto, _float64_predictions(clf, digits.X_test))


def test_certified_argmin_decides_only_separated_intervals():
    lower = np.array([[1.0, 2.0, 3.0], [1.0, 1.5, 3.0], [-np.inf, 2.0, 3.0], [2.0, 1.0, 0.5]])
    upper = np.array([[1.5, 2.5, 3.5], [1.6, 2.0, 3.5], [1.0, 2.5, 3.5], [2.5, 1.2, 0.9]])
    # row 0: [1, 1.5] below the others; row 1: [1, 1.6] overlaps [1.5, 2]; row 2: the first class's
    # float64 distance may be anything but lies at most 1.0, below the others; row 3: class 2
    np.testing.assert_array_equal(certified_argmin(lower, upper), [0, -1, 0, 2])


def test_class_intervals_open_below_an_unbounded_distance():
    lower, upper = class_intervals(np.array([2.0, 2.0, np.inf]), np.array([0.5, np.inf, np.inf]))
    np.testing.assert_array_equal(lower, [1.5, -np.inf, -np.inf])
    np.testing.assert_array_equal(upper, [2.5, np.inf, np.inf])


def test_the_float64_class_is_always_a_candidate_and_a_decided_row_has_one(digits):
    clf = KAHMClassifier(random_state=0).fit(digits.X_train, digits.y_train)
    X = digits.X_test
    D64 = clf.set_params(eval_dtype="float64").class_distances(X)
    for widen in (1.0, 300.0):  # the real bounds, and bounds 300 times wider (more candidates)
        intervals = [class_intervals(g, widen * b) for g, b in
                     (model._distances_with_bound(X, "float32") for model in clf.models_)]
        lower = np.column_stack([low for low, _ in intervals])
        upper = np.column_stack([high for _, high in intervals])
        candidates = candidate_classes(lower, upper)
        assert candidates[np.arange(len(X)), D64.argmin(axis=1)].all()
        decided = certified_argmin(lower, upper) >= 0
        np.testing.assert_array_equal(candidates[decided].sum(axis=1), 1)
        assert widen == 1.0 or candidates.sum(axis=1).max() > 1  # the wider bounds leave choices
