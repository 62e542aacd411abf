"""DaskKAHMClassifier: the scikit-learn API over the Dask pipeline.

Accuracy on digits (non-private and DP), the same predictions as KAHMClassifier with the same
parameters and seed, lazy dask output for dask input (no model loaded in the client while the
graph is built), NumPy output for NumPy input, a dataset store path as input, the model store's
save/load and KAHMClassifier round trips, and parameter validation. All on one in-process
LocalCluster (2 workers x 1 thread).
"""

from __future__ import annotations

import math
import pickle

import dask.array as da
import numpy as np
import pytest
from sklearn.utils._param_validation import InvalidParameterError
from sklearn.utils.estimator_checks import (
    check_do_not_raise_errors_in_init_or_set_params,
    check_estimator_cloneable,
    check_estimator_repr,
    check_estimators_unfitted,
    check_get_params_invariance,
    check_mixin_order,
    check_no_attributes_set_in_init,
    check_param_validation,
    check_parameters_default_constructible,
    check_set_params,
)

import kahm_dask.pipeline.predict as predict_mod
from kahm_dask import DaskKAHMClassifier, KAHMClassifier
from kahm_dask.params import RuleError
from kahm_dask.pipeline.stores.dataset import write_dataset
from tests._kit import ledger_of

SEED = 0
NOISE_SEED = 123


def _dask(X: np.ndarray) -> da.Array:
    return da.from_array(X, chunks=(300, -1))


@pytest.fixture(scope="module")
def fitted(client, digits):
    """The default non-private model, fitted from a dask array (several row chunks)."""
    return DaskKAHMClassifier(random_state=SEED, chunk_rows=300).fit(_dask(digits.X_train), digits.y_train)


def _assert_same_model(est: DaskKAHMClassifier, clf: KAHMClassifier, X: np.ndarray) -> None:
    np.testing.assert_array_equal(est.predict(X), clf.predict(X))
    np.testing.assert_allclose(est.class_distances(X), clf.class_distances(X), rtol=1e-10, atol=1e-12)


def test_defaults_on_digits_match_kahm_classifier(fitted, digits):
    assert fitted.score(digits.X_test, digits.y_test) >= 0.98
    assert fitted.n_clusters_ == 10 and not hasattr(fitted, "privacy_statement_")
    clf = KAHMClassifier(random_state=SEED).fit(digits.X_train, digits.y_train)
    _assert_same_model(fitted, clf, digits.X_test)


def test_several_branches_per_class_match_kahm_classifier(client, digits):
    """block_size 60: each class is split by k-means in one task, with the estimator's own rule."""
    est = DaskKAHMClassifier(block_size=60, random_state=SEED).fit(digits.X_train, digits.y_train)
    clf = KAHMClassifier(block_size=60, random_state=SEED).fit(digits.X_train, digits.y_train)
    assert est.n_clusters_ == clf.n_branches_.sum() > 10
    np.testing.assert_array_equal(est.n_branches_, clf.n_branches_)
    _assert_same_model(est, clf, digits.X_test)


@pytest.mark.filterwarnings("ignore::kahm_dask.privacy.randomness.PrivacyLeakWarning")
def test_dp_on_digits_matches_kahm_classifier_with_the_same_noise(client, digits, tmp_path):
    """ε = 2 per entry, public bounds; the (test-only) seeded noise is block-addressed by row, so
    both draw the same noise and fabricate the same rows."""
    params = dict(epsilon=2.0, bounds=(0, 1), random_state=SEED, insecure_noise_seed=NOISE_SEED)
    est = DaskKAHMClassifier(**params, store_dir=tmp_path).fit(_dask(digits.X_train), digits.y_train)
    assert est.score(digits.X_test, digits.y_test) >= 0.92
    clf = KAHMClassifier(**params).fit(digits.X_train, digits.y_train)
    assert est.privacy_statement_ == clf.privacy_statement_ and not est.privacy_statement_.holds
    _assert_same_model(est, clf, digits.X_test)
    # both releases are in the one ledger of these rows, whichever estimator made them
    assert [e["what"][:11] for e in ledger_of(digits.X_train).entries] == ["noisy rows ", "KAHMClassif"]
    back = est.to_local()  # the stored fabricated rows, cluster by cluster
    for label in clf.classes_:
        np.testing.assert_allclose(back.dp_data_[label], clf.dp_data_[label], rtol=1e-10, atol=1e-12)


def test_dask_in_lazy_out_numpy_in_numpy_out(fitted, digits, monkeypatch):
    loads = []
    real = predict_mod.cached_cluster
    monkeypatch.setattr(predict_mod, "cached_cluster", lambda path: loads.append(path) or real(path))
    X = _dask(digits.X_test)
    lazy = {name: getattr(fitted, name)(X) for name in ("predict", "class_distances", "predict_proba", "match_score")}
    accuracy = fitted.score(X, digits.y_test)
    assert loads == []  # building the graphs loads no model in the client
    assert all(isinstance(v, da.Array) for v in (*lazy.values(), accuracy))
    for name, value in lazy.items():
        eager = getattr(fitted, name)(digits.X_test)  # other row chunks: equal up to rounding
        assert isinstance(eager, np.ndarray)
        np.testing.assert_allclose(value.compute(), eager, rtol=1e-12, atol=0)
    assert float(accuracy) == fitted.score(digits.X_test, digits.y_test)
    proba = lazy["predict_proba"].compute()
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    np.testing.assert_array_equal(fitted.classes_[proba.argmax(axis=1)], lazy["predict"].compute())


def test_save_load_and_pickle(fitted, digits, tmp_path):
    path = fitted.save(tmp_path / "saved.zarr")
    loaded = DaskKAHMClassifier.load(path)
    assert loaded.get_params() == {**fitted.get_params(), "store_dir": None}
    np.testing.assert_array_equal(loaded.predict(digits.X_test), fitted.predict(digits.X_test))
    assert fitted.save(path) == path  # an existing model store is replaced
    (tmp_path / "other").mkdir()
    with pytest.raises(FileExistsError, match="not a kahm-dask model store"):
        fitted.save(tmp_path / "other")
    copy = pickle.loads(pickle.dumps(fitted))
    np.testing.assert_array_equal(copy.predict(digits.X_test[:50]), fitted.predict(digits.X_test[:50]))


def test_to_and_from_kahm_classifier(fitted, digits, tmp_path):
    clf = fitted.to_local()
    assert isinstance(clf, KAHMClassifier) and clf.n_branches_.sum() == fitted.n_clusters_
    _assert_same_model(fitted, clf, digits.X_test)
    back = DaskKAHMClassifier.from_local(clf, tmp_path / "from_clf.zarr")
    np.testing.assert_array_equal(back.predict(digits.X_test), clf.predict(digits.X_test))
    assert back.n_clusters_ == fitted.n_clusters_ and back.random_state == SEED


def test_dataset_store_path_as_input(fitted, digits, tmp_path):
    store = write_dataset(tmp_path / "train.zarr", digits.X_train, digits.y_train, chunk_rows=300)
    est = DaskKAHMClassifier(random_state=SEED, store_dir=tmp_path / "stores").fit(str(store.path))
    np.testing.assert_array_equal(est.predict(digits.X_test), fitted.predict(digits.X_test))
    test = write_dataset(tmp_path / "test.zarr", digits.X_test, digits.y_test)
    assert isinstance(est.predict(str(test.path)), da.Array)
    assert float(est.score(str(test.path))) == fitted.score(digits.X_test, digits.y_test)
    with pytest.raises(ValueError, match="pass y=None"):
        est.fit(str(store.path), digits.y_train)
    est.set_params(block_size=60).fit(digits.X_train, digits.y_train)  # refit: replaces the stores
    # a non-private fit whose rows fit the workers' memory trains from them (no train.zarr)
    assert est.n_clusters_ > fitted.n_clusters_ and not (tmp_path / "stores" / "train.zarr").exists()


@pytest.mark.parametrize("params, name, error", [
    ({"n_components": 0}, "n_components", InvalidParameterError),
    ({"epsilon": -1.0}, "epsilon", InvalidParameterError),
    ({"dp_data": "raw"}, "dp_data", InvalidParameterError),
    ({"random_state": np.random.default_rng(0)}, "random_state", InvalidParameterError),  # the seed is an int
    ({"chunk_rows": 0}, "chunk_rows", InvalidParameterError),
    ({"store_dir": 3}, "store_dir", InvalidParameterError),
    ({"r_source": "private", "r_value": 3}, "r_value", RuleError),
])
def test_invalid_parameters_are_rejected_before_any_work(params, name, error, digits, tmp_path):
    with pytest.raises(error, match=f"'{name}' parameter of DaskKAHMClassifier"):
        DaskKAHMClassifier(**{"store_dir": tmp_path, **params}).fit(digits.X_train, digits.y_train)
    assert not any(tmp_path.iterdir())


# scikit-learn's common checks that need no fit, or only fits that fail on a parameter. The others
# do not apply or cost too much here: each fit is a pipeline run (Zarr stores, a graph per stage;
# about a second even on tiny data), and check_estimator's fitting checks run dozens of them
# (check_classifiers_train, check_fit_idempotent, check_methods_subset_invariance, ...);
# the sparse and array-API checks test inputs the pipeline does not take (it writes dense Zarr);
# check_estimators_pickle holds (test_save_load_and_pickle; a fresh process: test_pickle.py).
@pytest.mark.parametrize("check", [
    check_estimator_cloneable,
    check_estimator_repr,
    check_mixin_order,
    check_get_params_invariance,
    check_set_params,
    check_parameters_default_constructible,
    check_no_attributes_set_in_init,
    check_do_not_raise_errors_in_init_or_set_params,
    check_estimators_unfitted,
    check_param_validation,
])
def test_scikit_learn_checks(check):
    check(DaskKAHMClassifier.__name__, DaskKAHMClassifier())


def test_more_workers_than_data_chunks_and_the_estimators_client(digits):
    """Workers that hold no rows (4 workers, one chunk of a few classes) neither fail nor change
    the model; ``client`` set on the estimator is the one it uses, and it is not a parameter."""
    from distributed import Client, LocalCluster

    X, y = digits.X_train[digits.y_train < 3], digits.y_train[digits.y_train < 3]
    with LocalCluster(n_workers=4, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as other:
        est = DaskKAHMClassifier(random_state=SEED)
        est.client = other
        est.fit(X, y)
        assert cluster.scheduler.transition_counter > 0  # the fit ran on this cluster
        assert "client" not in est.get_params() and est.client is other
        reference = KAHMClassifier(random_state=SEED).fit(X, y)
        _assert_same_model(est, reference, digits.X_test[digits.y_test < 3])
        assert "client" not in pickle.loads(pickle.dumps(est)).__dict__


def test_dask_estimator_takes_ledger_and_budget():
    params = DaskKAHMClassifier().get_params()
    assert params["ledger"] == "auto" and params["budget"] is None
    with pytest.raises(ValueError, match="budget"):
        DaskKAHMClassifier(budget=(math.nan, 0))._check_params()


def test_rows_of_one_class_are_refused_before_anything_is_written_or_spent(tmp_path):
    """Issue 38, item 4: a one-class fit refused with one line, for arrays (before the data
    store is written) and for a store (before the work store is made or the ledger charged)."""
    X, y = np.random.default_rng(0).random((40, 5)), np.full(40, 3)
    message = r"^the training rows hold one class \(3\); a classifier needs at least two\.$"
    with pytest.raises(ValueError, match=message):
        DaskKAHMClassifier(epsilon=2.0, bounds=(0, 1), store_dir=tmp_path / "a").fit(X, y)
    assert not any((tmp_path / "a").rglob("*.json"))  # no data store, no work store
    store = write_dataset(tmp_path / "one.zarr", X, y, chunk_rows=20)
    with pytest.raises(ValueError, match=message):
        DaskKAHMClassifier(epsilon=2.0, bounds=(0, 1), store_dir=tmp_path / "b").fit(str(store.path))
    assert not (tmp_path / "b" / "work").exists() and ledger_of(X).entries == []
