"""KAHM classifier and class-matching scores (docs/algorithm.md#classifier).

Oracles: docs/oracles.md#oracle-blobs, docs/oracles.md#oracle-spiral,
docs/oracles.md#oracle-argmin-and-scores, docs/oracles.md#oracle-digits.
"""

from __future__ import annotations

import numpy as np
import pytest

from kahm_dask import KAHMClassifier, WideKAHM, class_matching_scores
from kahm_dask.datasets import make_spiral
from tests._kit import three_blobs as _blobs


def _spiral(u: np.ndarray, c: int) -> np.ndarray:
    r, t = 0.25 + 0.7 * u, 2 * c + 2 * u
    return np.column_stack([r * np.sin(t), r * np.cos(t)])


# ------------------------------------------------------ docs/oracles.md#oracle-blobs
def test_oracle19_three_blobs():
    """docs/oracles.md#oracle-blobs: blobs 10σ apart, 200 train / 100 test per class:
    accuracy ≥ 0.99."""
    Xtr, ytr, Xte, yte, centres = _blobs(19)
    d = np.linalg.norm(centres[:, None] - centres[None], axis=-1)
    np.testing.assert_allclose(d[np.triu_indices(3, 1)], 10.0)
    clf = KAHMClassifier(random_state=0).fit(Xtr, ytr)
    assert clf.score(Xte, yte) >= 0.99


# ----------------------------------------------------- docs/oracles.md#oracle-spiral
@pytest.mark.parametrize("n_layers", [1, 2])
def test_oracle20_three_arm_spiral(n_layers):
    """docs/oracles.md#oracle-spiral: the author's 2-D three-arm spiral (demoGIKM.m datagen):
    class c ∈ {1,2,3}, point (r sin t, r cos t) with r = 0.25 + 0.7u, t = 2c + 2u;
    train u = linspace(0, 1, 100), test u ~ U(0, 1) plus N(0, 0.01²) noise per coordinate.
    n = 2, L ∈ {1, 2}: accuracy 1.00."""
    rng = np.random.default_rng(20)
    classes = (1, 2, 3)
    u_train = np.linspace(0, 1, 100)
    Xtr = np.vstack([_spiral(u_train, c) for c in classes])
    ytr = np.repeat(classes, 100)
    X_public, y_public = make_spiral(u_train)  # the library's generator is the same data
    np.testing.assert_array_equal(X_public, Xtr)
    np.testing.assert_array_equal(y_public, ytr)
    Xte = np.vstack(
        [_spiral(rng.uniform(0, 1, 100), c) + rng.normal(0, 0.01, size=(100, 2)) for c in classes]
    )
    yte = np.repeat(classes, 100)
    radii = np.linalg.norm(Xtr, axis=1)
    assert radii.min() == pytest.approx(0.25) and radii.max() == pytest.approx(0.95)
    clf = KAHMClassifier(n_components=2, n_layers=n_layers, random_state=0).fit(Xtr, ytr)
    np.testing.assert_array_equal(clf.n_branches_, 1)
    assert clf.score(Xte, yte) == 1.0


# ------------------------------------------ docs/oracles.md#oracle-argmin-and-scores
@pytest.fixture(scope="module")
def blob_clf():
    Xtr, ytr, Xte, yte, _ = _blobs(21, n_train=80, n_test=40)
    clf = KAHMClassifier(n_components=3, n_layers=2, random_state=0).fit(Xtr, ytr)
    return clf, Xtr, ytr, Xte, yte


def test_oracle21_predict_is_argmin_and_scores(blob_clf):
    """docs/oracles.md#oracle-argmin-and-scores: predicted label = argmin of the distance vector;
    ms_c ∈ [e^-1, 1] and maximal at the predicted class; ms_c = exp(−Γ_c²/Σ Γ²)."""
    clf, Xtr, _, Xte, _ = blob_clf
    rng = np.random.default_rng(211)
    X = np.vstack([Xte, Xtr[:20], 30 * rng.normal(size=(40, 5))])
    D = clf.class_distances(X)
    assert D.shape == (len(X), 3)
    pred = clf.predict(X)
    np.testing.assert_array_equal(pred, clf.classes_[np.argmin(D, axis=1)])
    ms = clf.match_score(X)
    assert ms.shape == D.shape
    assert np.all(ms >= np.exp(-1) - 1e-15) and np.all(ms <= 1.0)
    np.testing.assert_array_equal(np.argmax(ms, axis=1), np.argmin(D, axis=1))
    np.testing.assert_allclose(ms, np.exp(-(D**2) / np.sum(D**2, axis=1, keepdims=True)), rtol=1e-12)


def test_oracle21_ties_go_to_lowest_class():
    """docs/decisions.md#decision-ties: equal class distances → the lowest class index. Two classes
    with identical training rows give identical distances."""
    rng = np.random.default_rng(212)
    A = rng.normal(size=(30, 4))
    X = np.vstack([A, A])
    y = np.repeat(["b", "a"], 30)  # classes_ = ['a', 'b']; both have the same rows
    clf = KAHMClassifier(n_components=2, n_layers=1, random_state=0).fit(X, y)
    Q = rng.normal(size=(25, 4))
    D = clf.class_distances(Q)
    np.testing.assert_array_equal(D[:, 0], D[:, 1])
    np.testing.assert_array_equal(clf.predict(Q), "a")
    np.testing.assert_array_equal(clf.decision_function(Q), 0.0)


@pytest.mark.parametrize(
    "row,expected",
    [
        ([0.0, 0.0, 0.0], [1.0, 1.0, 1.0]),
        ([1.0, np.inf, 2.0], [1.0, np.exp(-1), 1.0]),
        ([np.inf, np.inf, 3.0], [np.exp(-0.5), np.exp(-0.5), 1.0]),
        ([np.inf, np.inf, np.inf], [np.exp(-1 / 3)] * 3),
        ([np.inf, np.inf], [np.exp(-0.5)] * 2),
        ([0.0, 2.0], [1.0, np.exp(-1)]),
        ([3.0, 4.0, 0.0], [np.exp(-9 / 25), np.exp(-16 / 25), 1.0]),
        ([1e-300, 1e-300], [np.exp(-0.5)] * 2),
        ([1e200, 3e200], [np.exp(-0.1), np.exp(-0.9)]),
    ],
)
def test_oracle21_class_matching_rules(row, expected):
    """docs/oracles.md#oracle-argmin-and-scores / Definition 8 and the +∞ limit rule
    (docs/decisions.md#decision-infinite-distances): a zero row → all 1; k infinite
    classes get e^{-1/k}, finite ones 1; all infinite → e^{-1/C}; no over/underflow."""
    out = class_matching_scores(np.array([row]))
    np.testing.assert_allclose(out[0], expected, rtol=1e-14)


def test_class_matching_scores_random_rows():
    """Scores stay in [e^-1, 1], the max is at the minimum distance, and scaling all
    distances of a row leaves the scores unchanged."""
    rng = np.random.default_rng(213)
    D = rng.exponential(size=(200, 4))
    ms = class_matching_scores(D)
    assert np.all((ms >= np.exp(-1)) & (ms <= 1))
    np.testing.assert_array_equal(np.argmax(ms, axis=1), np.argmin(D, axis=1))
    np.testing.assert_allclose(class_matching_scores(7.5 * D), ms, rtol=1e-13)


# --------------------------------------------------------------------------- labels, API
@pytest.mark.parametrize(
    "labels", [np.array(["setosa", "virginica", "versicolor"]), np.array([-4, 10, 7])]
)
def test_label_types_preserved(labels):
    """String and non-contiguous integer labels: classes_ is the sorted label set and predict
    returns labels from it."""
    Xtr, ytr, Xte, yte, _ = _blobs(22, n_train=60, n_test=30)
    clf = KAHMClassifier(n_components=3, n_layers=1, random_state=0).fit(Xtr, labels[ytr])
    np.testing.assert_array_equal(clf.classes_, np.sort(labels))
    pred = clf.predict(Xte)
    assert pred.dtype == clf.classes_.dtype
    assert np.mean(pred == labels[yte]) >= 0.99


def test_predict_proba_and_decision_function_multiclass(blob_clf):
    """predict_proba rows sum to 1 and argmax = predict (also on random data);
    decision_function has shape (m, C) with argmax = predict."""
    clf, _, _, Xte, _ = blob_clf
    rng = np.random.default_rng(23)
    for X in (Xte, 20 * rng.normal(size=(50, 5))):
        P = clf.predict_proba(X)
        assert P.shape == (len(X), 3)
        np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=1e-14)
        assert np.all(P > 0)
        np.testing.assert_array_equal(clf.classes_[np.argmax(P, axis=1)], clf.predict(X))
        dec = clf.decision_function(X)
        assert dec.shape == (len(X), 3)
        np.testing.assert_array_equal(clf.classes_[np.argmax(dec, axis=1)], clf.predict(X))


def test_binary_decision_function_sign_and_score():
    """Binary: decision_function is (m,), (Γ_0² − Γ_1²)/(Γ_0² + Γ_1²), positive means
    classes_[1], monotone in predict_proba[:, 1]; score = accuracy."""
    Xtr, ytr, Xte, yte, _ = _blobs(24, n_train=60, n_test=30)
    keep_tr, keep_te = ytr < 2, yte < 2
    y_names = np.array(["neg", "pos"])
    clf = KAHMClassifier(n_components=3, n_layers=1, random_state=0).fit(
        Xtr[keep_tr], y_names[ytr[keep_tr]]
    )
    rng = np.random.default_rng(241)
    X = np.vstack([Xte[keep_te], 15 * rng.normal(size=(40, 5))])
    dec = clf.decision_function(X)
    assert dec.shape == (len(X),)
    pred = clf.predict(X)
    np.testing.assert_array_equal(pred, clf.classes_[(dec > 0).astype(int)])
    assert np.any(dec > 0) and np.any(dec < 0)
    D = clf.class_distances(X)
    expected = (D[:, 0] ** 2 - D[:, 1] ** 2) / (D[:, 0] ** 2 + D[:, 1] ** 2)
    np.testing.assert_allclose(dec, expected, rtol=1e-12, atol=1e-15)
    # ranks rows exactly like predict_proba[:, 1] (scikit-learn's consistency check)
    proba1 = clf.predict_proba(X)[:, 1]
    order = np.argsort(dec, kind="stable")
    assert np.all(np.diff(proba1[order]) >= -1e-15)
    y_true = y_names[yte[keep_te]]
    assert clf.score(Xte[keep_te], y_true) == pytest.approx(np.mean(clf.predict(Xte[keep_te]) == y_true))
    assert clf.score(Xte[keep_te], y_true) >= 0.99


def test_class_distances_equal_direct_wide_kahms():
    """class_distances[:, c] = the distance of a WideKAHM fitted directly on class c's rows
    (S = 1, so no seed is involved); with S > 1 it equals the stored class models."""
    Xtr, ytr, Xte, _, _ = _blobs(25, n_train=100, n_test=30)
    clf = KAHMClassifier(n_components=3, n_layers=2, random_state=0).fit(Xtr, ytr)
    D = clf.class_distances(Xte)
    for c in range(3):
        direct = WideKAHM(3, 2, block_size=1000).fit(Xtr[ytr == c]).distance(Xte)
        np.testing.assert_array_equal(D[:, c], direct)
    clf2 = KAHMClassifier(n_components=3, n_layers=2, block_size=50, random_state=0).fit(Xtr, ytr)
    np.testing.assert_array_equal(clf2.n_branches_, 2)
    D2 = clf2.class_distances(Xte)
    for c, model in enumerate(clf2.models_):
        np.testing.assert_array_equal(D2[:, c], model.distance(Xte))
        assert model.branch_sizes_.sum() == 100


def test_fit_with_partition_equals_per_class_wide_fits():
    """fit(partition=...) equals fitting every class WideKAHM with that class's partition."""
    Xtr, ytr, Xte, _, _ = _blobs(26, n_train=90, n_test=30)
    rng = np.random.default_rng(26)
    part = rng.integers(0, 3, size=len(ytr)) * 10  # ids 0, 10, 20 inside every class
    clf = KAHMClassifier(n_components=3, n_layers=2, random_state=0).fit(Xtr, ytr, partition=part)
    D = clf.class_distances(Xte)
    for c in range(3):
        rows = ytr == c
        direct = WideKAHM(3, 2).fit(Xtr[rows], partition=part[rows])
        np.testing.assert_array_equal(clf.models_[c].branch_sizes_, direct.branch_sizes_)
        np.testing.assert_array_equal(D[:, c], direct.distance(Xte))
    np.testing.assert_array_equal(clf.n_branches_, 3)


# --------------------------------------------------------------------------- bad input
def test_bad_input_raises():
    """NaN, 1-D X, mismatched X/y lengths, a 1-sample class (named), n_components < 1,
    a wrong feature count at predict → ValueError/TypeError with a clear message."""
    Xtr, ytr, _, _, _ = _blobs(27, n_train=20, n_test=5)
    bad = Xtr.copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        KAHMClassifier(3).fit(bad, ytr)
    with pytest.raises(ValueError, match="2D array"):
        KAHMClassifier(3).fit(Xtr[:, 0], ytr)
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        KAHMClassifier(3).fit(Xtr, ytr[:-1])
    y1 = ytr.copy()
    y1[0] = 42
    with pytest.raises(ValueError, match=r"class\(es\) \[42\] have 1 sample"):
        KAHMClassifier(3).fit(Xtr, y1)
    for nc, exc in ((0, ValueError), (-1, ValueError), (1.5, TypeError)):
        with pytest.raises(exc, match="n_components"):
            KAHMClassifier(nc).fit(Xtr, ytr)
    clf = KAHMClassifier(3, n_layers=1).fit(Xtr, ytr)
    with pytest.raises(ValueError, match="features"):
        clf.predict(np.zeros((2, 4)))
    with pytest.raises(ValueError, match="NaN"):
        clf.predict(bad)
    with pytest.raises(ValueError, match="continuous"):
        KAHMClassifier(3).fit(Xtr, ytr + 0.5)


# --------------------------------------------------------------------------- digits
def _digits_accuracy(digits, n_layers):
    clf = KAHMClassifier(n_components=20, n_layers=n_layers, block_size=1000, random_state=0)
    return clf.fit(digits.X_train, digits.y_train).score(digits.X_test, digits.y_test)


def test_digits_acceptance(digits):
    """Digits acceptance: n = 20, L = 5, N_b = 1000, stratified 70/30 split (seed 0), features
    scaled to [0, 1] by the public bounds 0–16: test accuracy ≥ 0.99."""
    assert digits.X_train.min() == 0.0 and digits.X_train.max() == 1.0 and digits.bounds.public
    assert _digits_accuracy(digits, 5) >= 0.99


def test_digits_depth_does_not_matter(digits):
    """docs/oracles.md#oracle-digits (docs/algorithm.md#depth-in-practice): L = 1 and L = 5 give
    the same digits accuracy within 0.01."""
    assert abs(_digits_accuracy(digits, 1) - _digits_accuracy(digits, 5)) <= 0.01
