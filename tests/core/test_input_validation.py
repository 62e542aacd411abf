"""Bad input to the core (docs/reliability.md §1): the estimator and the validation helpers.

Every case is one row of a table: what is fed in, the exception, a pattern that must name the
problem and, where the message can carry one, a pattern naming the fix. The other entry points
have theirs: the dataset store (tests/pipeline/stores/test_input_validation.py), the pipeline YAML
(tests/pipeline/config/test_input_validation.py), the pipeline's functions
(tests/pipeline/training/test_input_validation.py, tests/pipeline/test_predict.py) and the command
line (tests/system/test_cli_input_validation.py).
Duplicate rows and constant features are not errors: they must train (λ* > 0 keeps
K + λ*I positive definite).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from kahm_dask import KAHMClassifier
from kahm_dask._validation import (
    check_class_sizes,
    check_finite_rows,
    check_label_types,
    check_n_components,
)
from tests._kit import BAD_INPUT_X as X
from tests._kit import BAD_INPUT_Y as Y
from tests._kit import MIXED_LABELS as MIXED_LIST
from tests._kit import Rejection as Case
from tests._kit import assert_rejects as _check
from tests._kit import with_entry as _with

RNG = np.random.default_rng(1)


def _clf(**kw) -> KAHMClassifier:
    return KAHMClassifier(n_components=3, n_layers=2, random_state=0, **kw)


@pytest.fixture(scope="module")
def fitted() -> KAHMClassifier:
    return _clf().fit(X, Y)


# --------------------------------------------------------------------------- the estimator

EPSILON_RULE = (r"'epsilon' parameter of KAHMClassifier must be None or a float > 0 \(at least 2\.8e-13\) and at most "
                r"709\.783 \(e\^ε overflows above it\)")
ESTIMATOR = {
    "nan": Case(lambda f: _clf().fit(_with(np.nan), Y), ValueError, r"contains NaN", r"imput"),
    "inf": Case(lambda f: _clf().fit(_with(np.inf), Y), ValueError, r"infinity"),
    "-inf": Case(lambda f: _clf().fit(_with(-np.inf), Y), ValueError, r"infinity"),
    "rank 1": Case(lambda f: _clf().fit(X[:, 0], Y), ValueError, r"Expected 2D array", r"reshape"),
    "rank 3": Case(lambda f: _clf().fit(X[:, :, None], Y), ValueError, r"dim 3.*dim <= 2"),
    "empty": Case(lambda f: _clf().fit(X[:0], Y[:0]), ValueError, r"0 sample\(s\).*minimum of 2"),
    "single-row class": Case(lambda f: _clf().fit(X[:21], Y[:21]), ValueError, r"\[1\] have 1 sample",
                             r"at least 2 samples per class"),
    "X/y lengths": Case(lambda f: _clf().fit(X, Y[:-1]), ValueError, r"inconsistent numbers of samples"),
    "continuous labels": Case(lambda f: _clf().fit(X, RNG.random(40)), ValueError,
                              r"Unknown label type: continuous"),
    "predict: feature count": Case(lambda f: f.predict(X[:, :4]), ValueError,
                                   r"X has 4 features, but KAHMClassifier is expecting 5 features"),
    "predict: nan": Case(lambda f: f.predict(_with(np.nan)), ValueError, r"contains NaN", r"imput"),
    "predict: inf": Case(lambda f: f.predict(_with(np.inf)), ValueError, r"infinity"),
    "predict: rank 1": Case(lambda f: f.predict(X[0]), ValueError, r"Expected 2D array", r"reshape"),
    "predict: unfitted": Case(lambda f: _clf().predict(X), Exception, r"not fitted", r"call 'fit'"),
    "epsilon = 0": Case(lambda f: _clf(epsilon=0.0).fit(X, Y), ValueError,
                        EPSILON_RULE + r"\. Got 0\.0"),
    "epsilon < 0": Case(lambda f: _clf(epsilon=-1.0).fit(X, Y), ValueError,
                        EPSILON_RULE + r"\. Got -1\.0"),
    "epsilon nan": Case(lambda f: _clf(epsilon=np.nan).fit(X, Y), ValueError,
                        EPSILON_RULE + r"\. Got nan"),
    "epsilon inf": Case(lambda f: _clf(epsilon=np.inf).fit(X, Y), ValueError,
                        EPSILON_RULE + r"\. Got inf"),
    "one class": Case(lambda f: _clf(epsilon=1.0).fit(X, np.full(len(Y), 3)), ValueError,
                      r"the training rows hold one class \(3\); a classifier needs at least two"),
    "epsilon 1e6": Case(lambda f: _clf(epsilon=1e6).fit(X, Y), ValueError,
                        EPSILON_RULE + r"\. Got 1000000\.0"),
    "epsilon str": Case(lambda f: _clf(epsilon="2").fit(X, Y), TypeError,
                        EPSILON_RULE + r"\. Got '2'"),
    "delta = 1": Case(lambda f: _clf(epsilon=1.0, delta=1.0).fit(X, Y), ValueError,
                      r"'delta' parameter of KAHMClassifier must be a float >= 0 and < 1\. Got 1\.0"),
    "delta < 0": Case(lambda f: _clf(epsilon=1.0, delta=-0.1).fit(X, Y), ValueError,
                      r"'delta' parameter of KAHMClassifier must be a float >= 0 and < 1\. Got -0\.1"),
    "delta > 1": Case(lambda f: _clf(epsilon=1.0, delta=1.5).fit(X, Y), ValueError,
                      r"'delta' parameter of KAHMClassifier must be a float >= 0 and < 1\. Got 1\.5"),
    "d = 0": Case(lambda f: _clf(epsilon=1.0, d=0.0).fit(X, Y), ValueError,
                  r"'d' parameter of KAHMClassifier must be None, a finite float > 0 or an array-like\. Got 0\.0"),
    "d < 0": Case(lambda f: _clf(epsilon=1.0, d=-1.0).fit(X, Y), ValueError,
                  r"'d' parameter of KAHMClassifier must be None, a finite float > 0 or an array-like\. Got -1\.0"),
    "n_components = 0": Case(lambda f: KAHMClassifier(n_components=0).fit(X, Y), ValueError,
                             r"'n_components' parameter of KAHMClassifier must be an int >= 1\. Got 0"),
    "n_layers = 0": Case(lambda f: KAHMClassifier(n_layers=0).fit(X, Y), ValueError,
                         r"'n_layers' parameter of KAHMClassifier must be an int >= 1\. Got 0"),
    "block_size = 0": Case(lambda f: KAHMClassifier(block_size=0).fit(X, Y), ValueError,
                           r"'block_size' parameter of KAHMClassifier must be an int >= 1\. Got 0"),
    "dp_data unknown": Case(lambda f: _clf(epsilon=1.0, dp_data="raw").fit(X, Y), ValueError,
                            r"'dp_data' parameter of KAHMClassifier must be one of 'fabricated', 'noisy'\. Got 'raw'"),
}

ESTIMATOR.update({
    # np.asarray would turn these into the strings '0' and 'a' (the model would then predict
    # '0' for label 0), or scikit-learn's 'Unknown label type: unknown' (naming neither).
    "mixed label types (list)": Case(lambda f: _clf().fit(X, MIXED_LIST), ValueError,
                                     r"mixes label types", r"astype\(str\)"),
    "mixed label types (object array)": Case(
        lambda f: _clf().fit(X, np.array(MIXED_LIST, dtype=object)), ValueError,
        r"mixes label types", r"astype\(str\)"),
})


@pytest.mark.parametrize("case", list(ESTIMATOR.values()), ids=list(ESTIMATOR))
def test_estimator_rejects(case, fitted):
    _check(case, fitted)


def test_estimator_warns_when_n_components_exceeds_features():
    with pytest.warns(UserWarning, match=r"n_components=20 exceeds the number of features \(5\)"):
        KAHMClassifier(n_components=20, n_layers=2, random_state=0).fit(X, Y)


def test_n_components_above_features_is_capped_and_trains():
    clf = KAHMClassifier(n_components=20, n_layers=2, random_state=0).fit(X, Y)
    dims = [d for m in clf.models_ for b in m.branches_ for d in b.layer_dims_]
    assert max(dims) <= X.shape[1]
    assert np.isfinite(clf.class_distances(X)).all()


# --------------------------------------------------------------------------- degenerate data


def _blobs(n_per_class=30, p=6, seed=1):
    rng = np.random.default_rng(seed)
    centres = np.array([[0.2] * p, [0.8] * p])
    Xb = np.vstack([c + 0.05 * rng.standard_normal((n_per_class, p)) for c in centres])
    return Xb, np.repeat([0, 1], n_per_class)


@pytest.mark.parametrize("epsilon", [None, 2.0])
def test_duplicate_rows_and_constant_features_train(epsilon):
    Xb, yb = _blobs()
    Xd = np.repeat(Xb[::3], 3, axis=0)  # every row three times
    Xd[:, 2] = 0.5  # a constant feature
    Xd[:, 4] = 0.0  # another one
    yd = np.repeat(yb[::3], 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no overflow, no division by zero
        clf = KAHMClassifier(n_components=4, n_layers=3, random_state=0, epsilon=epsilon).fit(Xd, yd)
        D = clf.class_distances(Xb)
    assert np.isfinite(D).all()
    if epsilon is None:
        assert np.mean(clf.predict(Xb) == yb) == 1.0
        for model in clf.models_:
            for branch in model.branches_:
                for layer in branch.layers_:  # K + λ*I is positive definite
                    assert layer.lambda_ > 0
                    assert layer.kernel_eigenvalues_.min() + layer.lambda_ > 0


def test_all_rows_of_a_class_identical_trains():
    Xb, yb = _blobs()
    # rank-0 class: its KAHM is the class mean (docs/decisions.md#decision-rank-zero)
    Xb[yb == 0] = 0.3
    clf = KAHMClassifier(n_components=4, n_layers=2, random_state=0).fit(Xb, yb)
    assert np.isfinite(clf.class_distances(Xb)).all()
    assert np.mean(clf.predict(Xb) == yb) == 1.0


# --------------------------------------------------------------------------- the helpers


def test_validation_helpers():
    assert check_label_types([1, 2, 3]) == [1, 2, 3]
    assert check_label_types(np.array(["a", "b"])).tolist() == ["a", "b"]
    with pytest.raises(ValueError, match=r"y mixes label types \(number, string\).*astype\(str\)"):
        check_label_types([0, "a"])
    with pytest.raises(ValueError, match=r"bool, number"):
        check_label_types(np.array([True, 2], dtype=object))
    check_class_sizes({"a": 2, "b": 5})
    with pytest.raises(ValueError, match=r"\['b'\] have fewer than 2 samples \('b': 1\)"):
        check_class_sizes({"a": 2, "b": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_n_components(5, 5)
    with pytest.warns(UserWarning, match=r"n_components=6 exceeds the number of features \(5\)"):
        check_n_components(6, 5)
    check_finite_rows(X)
    with pytest.raises(ValueError, match=r"row 13, column 2: nan.*impute"):
        check_finite_rows(_with(np.nan), row_offset=10)
