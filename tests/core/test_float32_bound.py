"""The proven bound on the float32 evaluation's distance error (docs/algorithm.md#float32-error-bound).

Properties checked: every float32 distance lies within its bound of the float64 evaluation's
(digits and breast cancer through the classifier's class models, a high-dimensional random case
with λ* and with a forced tiny λ, near and far queries); the float64 evaluation's image bound is
0; a multi-layer branch has no bound (+inf); the bound has teeth: weights perturbed far beyond
float32 rounding break it; and each formula of ``kahm_dask.float32_bound`` on inputs where its
value is known.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from kahm_dask import KAHM, KAHMClassifier, WideKAHM
from kahm_dask.float32_bound import (
    U32,
    U64,
    distance_bound,
    gemm_constant,
    image_bound,
    nonnegative_sum_upper,
    row_norms_upper,
)


def _assert_within(gamma32: np.ndarray, gamma64: np.ndarray, bound: np.ndarray) -> None:
    finite = np.isfinite(gamma64)
    assert np.all(np.abs(gamma32[finite] - gamma64[finite]) <= bound[finite])
    assert np.all(bound >= 0)


def _class_bounds_hold(clf: KAHMClassifier, X: np.ndarray) -> tuple[float, float]:
    """Check every class model's bound on X; returns the largest observed error and the largest
    relative bound (finite rows)."""
    D64 = clf.class_distances(X)
    worst_err, worst_rel = 0.0, 0.0
    for c, wide in enumerate(clf.models_):
        g32, bound = wide._distances_with_bound(np.asarray(X, dtype=np.float64), "float32")
        _assert_within(g32, D64[:, c], bound)
        worst_err = max(worst_err, float(np.max(np.abs(g32 - D64[:, c]))))
        worst_rel = max(worst_rel, float(np.max(bound / D64[:, c])))
    return worst_err, worst_rel


def test_digits_class_distances_within_the_bound(digits):
    clf = KAHMClassifier(random_state=0).fit(digits.X_train, digits.y_train)
    worst_err, worst_rel = _class_bounds_hold(clf, np.vstack([digits.X_test, digits.X_train]))
    assert worst_err > 0  # float32 does differ, so the check above could fail
    assert worst_rel < 0.05  # and the bound says something: c_N·κ with N ≈ 100, not ~1


def test_breast_cancer_class_distances_within_the_bound():
    X, y = load_breast_cancer(return_X_y=True)
    clf = KAHMClassifier(random_state=0).fit(X, y)
    worst_err, _ = _class_bounds_hold(clf, X)
    assert worst_err > 0


@pytest.mark.parametrize("regularization", [None, 1e-6])
def test_high_dimensional_near_and_far_queries_within_the_bound(regularization):
    rng = np.random.default_rng(3)
    basis = rng.normal(size=(30, 784)) / np.sqrt(30)

    def rows(m: int) -> np.ndarray:
        return rng.normal(size=(m, 30)) @ basis + 0.3 * rng.normal(size=(m, 784)) + 5.0

    Y, Q = rows(800), rows(600)
    Q[400:] *= 3.0  # far from the samples
    kahm = KAHM(n_components=20, regularization=regularization).fit(Y)
    g32, bound = kahm._distances_with_bound(Q, "float32")
    g64 = kahm._evaluate(Q, "float64")[1]
    _assert_within(g32, g64, bound)
    assert np.max(np.abs(g32 - g64)) > 0


def test_float64_image_bound_is_zero_and_guarded_rows_unbounded(digits):
    kahm = KAHM(n_components=10).fit(digits.X_train[:300])
    Q = digits.X_test[:50].copy()
    Q[0, 0] = np.nan  # a guarded row
    out, bound = np.empty_like(Q), np.empty(len(Q))
    kahm._images_into(Q, out, np.float64, bound=bound)
    assert bound[0] == np.inf and np.all(bound[1:] == 0)
    g32, b32 = kahm._distances_with_bound(Q, "float32")
    assert g32[0] == np.inf and b32[0] == np.inf and np.all(np.isfinite(b32[1:]))


def test_a_multi_layer_branch_has_no_bound(digits):
    wide = WideKAHM(n_components=10, n_layers=2, block_size=1000, random_state=0).fit(digits.X_train[:400])
    _, bound = wide._distances_with_bound(digits.X_test[:20], "float32")
    assert np.all(bound == np.inf)


def test_weights_perturbed_beyond_float32_rounding_break_the_bound(digits):
    """The bound assumes β̂ = fl32(β): weights off by 5 % relative (random signs) move some distance
    by more than it allows. (It is a worst case: γ_N = N·u where rounding errors of random sign
    grow like √N·u, so here it sits about 10⁴ times above the error float32 really makes.)"""
    kahm = KAHM(n_components=10).fit(digits.X_train[:300])
    Q = digits.X_test
    g64 = kahm._evaluate(Q, "float64")[1]
    beta32 = kahm._beta32()[0]
    signs = np.random.default_rng(0).choice([-1.0, 1.0], size=beta32.shape)
    beta32 *= (1.0 + 5e-2 * signs).astype(np.float32)  # the cached operand, in place
    g32, bound = kahm._distances_with_bound(Q, "float32")
    assert np.any(np.abs(g32 - g64) > bound)


def test_gemm_constant_is_the_sum_of_the_unit_roundoffs_and_gammas():
    n = 1000
    expected = (2 * U32 + n * U32 / (1 - n * U32) + n * U64 / (1 - n * U64)) * (1 + 4 * U32)
    assert gemm_constant(n) == pytest.approx(expected, rel=4 * U64)
    assert gemm_constant(2**24) == np.inf  # N u ≥ 1: no bound


def test_nonnegative_sum_upper_covers_the_exact_sum():
    rng = np.random.default_rng(1)
    terms = rng.random((200, 5000)).astype(np.float32)
    computed = terms @ np.ones(5000, dtype=np.float32)
    exact = terms.astype(np.float64).sum(axis=1)  # float64 sums of float32 terms: exact to 2⁻⁵³·5000
    assert np.all(nonnegative_sum_upper(computed, 5000) >= exact * (1 - 5000 * U64))


def test_row_norms_upper_are_upper_bounds_in_float32():
    rng = np.random.default_rng(2)
    beta32 = rng.normal(size=(300, 785)).astype(np.float32)
    up = row_norms_upper(beta32).astype(np.float64)
    exact = np.sqrt(np.sum(beta32[:, :-1].astype(np.float64) ** 2, axis=1))
    assert np.all(up[:, 0] >= exact) and np.all(up[:, 0] <= exact * (1 + 2**-20))
    assert np.all(up[:, 1] >= np.abs(beta32[:, -1])) and np.all(up[:, 1] <= np.abs(beta32[:, -1]) * (1 + 2**-20))


def test_image_bound_formula_and_its_guard():
    S = np.array([[1.0, 0.5]] * 3)
    den, norms = np.array([2.0, 1e-30, np.nan]), np.array([3.0, 3.0, 3.0])
    B = image_bound(S, den, norms, n_rows=100, n_features=4, beta_max=1.0, threshold=1e-20)
    c = gemm_constant(100)
    expected = (c * 1.0 + 3.0 * c * 0.5) / (2 - c * 0.5)  # (T + ‖x̂‖ T_p)/(|Ô_p| − T_p)
    assert expected <= B[0] <= 1.01 * expected + 1e-14
    assert B[1] == np.inf and B[2] == np.inf  # the float64 evaluation may guard these rows


def test_distance_bound_adds_the_norm_roundings_and_keeps_infinite_rows():
    bound = distance_bound(np.array([1e-6, 0.0, 1e-6]), np.array([2.0, 2.0, np.inf]), 10)
    assert bound[0] >= 1e-6 + 13 * U64 * 4.0 and bound[1] > 0 and bound[2] == np.inf
