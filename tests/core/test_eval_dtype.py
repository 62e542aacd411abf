"""The float32 evaluation path (``eval_dtype``, docs/algorithm.md#evaluation-precision).

float32 runs the kernel block's ``exp`` and the (m × N)·(N × (p + 1)) GEMM in float32: the
distances and images stay within ``RTOL`` (relative) of float64 on digits and on a
high-dimensional random case, the predictions do not change, the returned arrays are float64
and float64 stays bit-identical to the default. The setting acts at evaluation (``set_params``
after ``fit``), survives pickling and ``to_state``/``from_state`` (the float32 copy of β is never
stored), keeps the denominator guard and is checked against the parameter table
(tests/pipeline/estimator/test_eval_dtype.py: it reaches the Dask pipeline's tasks and
``kahm-dask predict``).
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

from kahm_dask import KAHM, DeepKAHM, DegenerateWeightsWarning, KAHMClassifier, WideKAHM
from tests._kit import FLOAT32_RTOL as RTOL
from tests._kit import max_rel as _max_rel


def _max_row_rel(a: np.ndarray, b: np.ndarray) -> float:
    """Largest ‖a_i − b_i‖ / ‖b_i‖ over the rows of images (m, p)."""
    return float(np.max(np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)))


@pytest.fixture(scope="module")
def classifiers(digits):
    """Fitted KAHMClassifiers by depth L (default float64)."""
    return {L: KAHMClassifier(n_layers=L, random_state=0).fit(digits.X_train, digits.y_train) for L in (1, 3)}


@pytest.fixture(scope="module")
def random_case():
    """A high-dimensional case: 1000 rows of p = 784 near a 30-dim subspace, offset from 0, and
    800 queries of the same law, some scaled far out."""
    rng = np.random.default_rng(7)
    basis = rng.normal(size=(30, 784)) / np.sqrt(30)

    def rows(m: int) -> np.ndarray:
        return rng.normal(size=(m, 30)) @ basis + 0.3 * rng.normal(size=(m, 784)) + 5.0

    Q = rows(800)
    Q[600:] *= 3.0
    return rows(1000), Q


def _float32_distances(clf: KAHMClassifier, X: np.ndarray) -> np.ndarray:
    clf.set_params(eval_dtype="float32")
    try:
        return clf.class_distances(X)
    finally:
        clf.set_params(eval_dtype="float64")


@pytest.mark.parametrize("L", [1, 3])
def test_digits_float32_distances_close_and_predictions_equal(classifiers, digits, L):
    clf = classifiers[L]
    D64 = clf.class_distances(digits.X_test)
    D32 = _float32_distances(clf, digits.X_test)
    assert D32.dtype == np.float64 and D32.shape == D64.shape
    assert _max_rel(D32, D64) <= RTOL
    np.testing.assert_array_equal(D32.argmin(axis=1), D64.argmin(axis=1))


def test_digits_float32_with_routing(digits):
    clf = KAHMClassifier(block_size=30, n_probe=2, random_state=0).fit(digits.X_train, digits.y_train)
    assert clf.n_branches_.max() > 2  # routing prunes branches
    D64 = clf.class_distances(digits.X_test)
    D32 = _float32_distances(clf, digits.X_test)
    assert _max_rel(D32, D64) <= RTOL
    np.testing.assert_array_equal(D32.argmin(axis=1), D64.argmin(axis=1))


def test_random_high_dimensional_images_and_distances(random_case):
    Y, Q = random_case
    kahm = KAHM(n_components=20).fit(Y)
    I64, g64 = kahm.transform_with_distance(Q)
    I32, g32 = kahm.set_params(eval_dtype="float32").transform_with_distance(Q)
    assert I32.dtype == g32.dtype == np.float64
    assert _max_row_rel(I32, I64) <= RTOL and _max_rel(g32, g64) <= RTOL
    deep = DeepKAHM(20, 3).fit(Y)
    out64, gd64, l64 = deep.transform_with_distance(Q)
    out32, gd32, l32 = deep.set_params(eval_dtype="float32").transform_with_distance(Q)
    assert out32.dtype == np.float64
    assert _max_row_rel(out32, out64) <= RTOL and _max_rel(gd32, gd64) <= RTOL


def test_float64_is_bit_identical_to_the_default(classifiers, digits, random_case):
    clf = classifiers[3]
    explicit = KAHMClassifier(n_layers=3, random_state=0, eval_dtype="float64").fit(digits.X_train, digits.y_train)
    np.testing.assert_array_equal(explicit.class_distances(digits.X_test), clf.class_distances(digits.X_test))
    wide = clf.models_[0]
    np.testing.assert_array_equal(wide._distance_rows(digits.X_test, dtype="float64")[0],
                                  wide._distance_rows(digits.X_test)[0])
    Y, Q = random_case
    kahm = KAHM(n_components=20).fit(Y)
    images, gamma = kahm.transform_with_distance(Q)
    np.testing.assert_array_equal(kahm._evaluate(Q, "float64")[0], images)
    np.testing.assert_array_equal(kahm._evaluate(Q, "float64")[1], gamma)
    assert not hasattr(kahm, "_beta32_cache")  # float64 never builds the float32 operand


def test_set_params_after_fit_takes_effect(digits):
    clf = KAHMClassifier(random_state=0).fit(digits.X_train, digits.y_train)
    X = digits.X_test[:200]
    D64 = clf.class_distances(X)
    D32 = clf.set_params(eval_dtype="float32").class_distances(X)  # not the cached float64 result
    assert not np.array_equal(D32, D64) and _max_rel(D32, D64) <= RTOL
    np.testing.assert_array_equal(clf.set_params(eval_dtype="float64").class_distances(X), D64)
    wide = clf.models_[0]  # a model's own setting: its distance() follows it too
    g32 = wide.set_params(eval_dtype="float32").distance(X)
    np.testing.assert_array_equal(g32, wide._distance_rows(X, dtype="float32")[0])
    assert not np.array_equal(g32, wide.set_params(eval_dtype="float64").distance(X))


def test_pickle_and_state_round_trips_evaluate_in_float32(random_case):
    Y, Q = random_case
    kahm = KAHM(n_components=10, eval_dtype="float32").fit(Y[:300])
    g32 = kahm.distance(Q)
    assert hasattr(kahm, "_beta32_cache")
    assert "_beta32_cache" not in kahm.__getstate__()
    restored = pickle.loads(pickle.dumps(kahm))
    assert not hasattr(restored, "_beta32_cache")
    np.testing.assert_array_equal(restored.distance(Q), g32)
    g64 = kahm._evaluate(Q, "float64")[1]
    np.testing.assert_array_equal(restored.set_params(eval_dtype="float64").distance(Q), g64)
    arrays, scalars = kahm.to_state()
    assert scalars["params"]["eval_dtype"] == "float32" and all(a.dtype == np.float64 for a in arrays.values())
    np.testing.assert_array_equal(KAHM.from_state(arrays, scalars).distance(Q), g32)
    # a state stored before eval_dtype existed loads with the default and evaluates in both
    scalars["params"].pop("eval_dtype")
    old = KAHM.from_state(arrays, scalars)
    assert old.eval_dtype == "auto"  # today's default, whose distances are float64
    np.testing.assert_array_equal(old.distance(Q), g64)
    np.testing.assert_array_equal(old._evaluate(Q, "float32")[1], g32)
    deep = DeepKAHM(10, 2).fit(Y[:300])
    layer_states, meta = deep.to_state()
    meta["params"].pop("eval_dtype")
    np.testing.assert_array_equal(DeepKAHM.from_state(layer_states, meta)._distance_rows(Q, dtype="float32")[0],
                                  pickle.loads(pickle.dumps(deep))._distance_rows(Q, dtype="float32")[0])


def test_refit_and_new_beta_rebuild_the_float32_operand(random_case):
    Y, Q = random_case
    kahm = KAHM(n_components=10, eval_dtype="float32").fit(Y[:300])
    kahm.distance(Q)
    fresh = KAHM(n_components=10, eval_dtype="float32").fit(Y[300:600])
    np.testing.assert_array_equal(kahm.fit(Y[300:600]).distance(Q), fresh.distance(Q))


def test_guard_in_float32(random_case):
    """A zero weight sum gives +inf and NaN images with a DegenerateWeightsWarning, and a
    non-finite row (what a deep layer gets after a guarded one) +inf and NaN images silently,
    as in float64."""
    Y, Q = random_case
    kahm = KAHM(n_components=10, eval_dtype="float32").fit(Y[:300])
    Yq = Q[:5].copy()
    Yq[1, 3] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error", DegenerateWeightsWarning)
        images, gamma = kahm._evaluate(Yq)
    assert gamma[1] == np.inf and np.all(np.isnan(images[1]))
    assert np.all(np.isfinite(np.delete(gamma, 1))) and np.all(np.isfinite(np.delete(images, 1, axis=0)))
    kahm.beta_ = kahm.beta_.copy()
    kahm.beta_[:, -1] = 0.0  # every weight sum is 0 (the threshold still comes from the fit)
    with pytest.warns(DegenerateWeightsWarning, match="5 query row"):
        images, gamma = kahm.transform_with_distance(Q[:5])
    assert np.all(gamma == np.inf) and np.all(np.isnan(images))


def test_invalid_value_is_rejected_naming_the_parameter(classifiers, digits, random_case):
    Y, Q = random_case
    for estimator in (KAHM(2, eval_dtype="float16"), DeepKAHM(2, 2, eval_dtype="half"),
                      WideKAHM(2, 2, eval_dtype="FLOAT32")):
        with pytest.raises(ValueError, match="'eval_dtype' parameter of " + type(estimator).__name__):
            estimator.fit(Y[:100])
    with pytest.raises(ValueError, match="'eval_dtype' parameter of KAHMClassifier"):
        KAHMClassifier(eval_dtype=np.float32).fit(digits.X_train, digits.y_train)
    clf = pickle.loads(pickle.dumps(classifiers[1]))
    with pytest.raises(ValueError, match="'eval_dtype' parameter of KAHMClassifier"):
        clf.set_params(eval_dtype="float16").predict(digits.X_test)
    with pytest.raises(ValueError, match="'eval_dtype' parameter of WideKAHM"):
        clf.models_[0]._distance_rows(digits.X_test, n_probe=1, dtype="float16")
