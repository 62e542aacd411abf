"""LSDD, membership-inference score and attack (docs/algorithm.md#membership).

Oracles: docs/oracles.md#oracle-lsdd-gaussians, docs/oracles.md#oracle-lsdd-exact,
docs/oracles.md#oracle-mis-members.

The cross-validation in the eigenbasis of H (and the shared mis / mis_norm pass) is checked
against the solve-based implementation it replaced, benchmarks/_membership_reference.py (the
one reference, also the benchmark's baseline): the same selected (sigma, lambda) on every case,
and l2 / mis / mis_norm within ``l2_agreement_bound`` there, a first-order perturbation bound
(backward error of the Cholesky solve ~ 3 b_c^2 eps ||H + lam I||, summation error ~ n eps of
the kernel means, and for mis_norm the rounding-level difference of the kernel arguments)
propagated through ``l2 = h^T M^-1 h + lam ||M^-1 h||^2``; no tolerance is a number chosen to
pass. The closed form itself is checked against direct solves on random PSD matrices.
"""

import numpy as np
import pytest
import scipy.linalg
from scipy.spatial.distance import cdist, pdist

from benchmarks._membership_reference import _sigma_scale as _reference_sigma_scale
from benchmarks._membership_reference import (
    kernel_perturbation_bound,
    l2_agreement_bound,
    reference_attack_from_distances,
    reference_lsdd,
    reference_mis,
    sigma_perturbation_bound,
)
from kahm_dask._random import as_generator, child_seed_sequence
from kahm_dask.privacy import lsdd as lsdd_module
from kahm_dask.privacy.lsdd import (
    LAMBDA_GRID,
    SIGMA_FACTORS,
    _kernel_fold_sums,
    _median,
    _median_pairwise_distance_1d,
    _psd_eigh,
    _ridge_quadratics,
    lsdd,
    lsdd_runs,
)
from kahm_dask.privacy.membership import (
    membership_attack,
    membership_attack_from_distances,
    membership_evaluation,
    membership_inference_from_distances,
    membership_inference_score,
    training_row_subset,
)


def _is_sigma_factor(ratio: float) -> bool:
    return bool(np.isclose(ratio, SIGMA_FACTORS, rtol=1e-12, atol=0).any())


def _true_l2_unit_gaussians(mu: float) -> float:
    return (1 - np.exp(-(mu**2) / 4)) / np.sqrt(np.pi)


# ---------------------------------------------------------------------------------------------
# LSDD (docs/algorithm.md#lsdd)
# ---------------------------------------------------------------------------------------------


def test_oracle30_identical_distributions():
    rng = np.random.default_rng(300)
    res = lsdd(rng.normal(size=1000), rng.normal(size=1000), random_state=0)
    assert abs(res.l2) <= 0.02
    assert res.l2_clipped == max(0.0, res.l2)


@pytest.mark.parametrize("mu", [1.0, 2.0])
def test_oracle30_gaussian_mean_gap(mu):
    rng = np.random.default_rng(301)
    res = lsdd(rng.normal(size=1000), rng.normal(mu, size=1000), random_state=0)
    assert res.l2 == pytest.approx(_true_l2_unit_gaussians(mu), rel=0.2)
    assert res.n_centers == 300 and res.lambda_ in LAMBDA_GRID


@pytest.mark.parametrize("dim", [1, 2])
def test_oracle30b_exact_estimator(dim):
    rng = np.random.default_rng(302)
    a = rng.normal(size=(40, dim)).squeeze()
    b = rng.normal(0.7, size=(30, dim)).squeeze()
    sigma, lam = 0.6, 0.05
    res = lsdd(a, b, sigma_list=[sigma], lambda_list=[lam], n_centers=1000)
    assert (res.sigma, res.lambda_, res.n_centers) == (sigma, lam, 70)
    # direct evaluation of steps 3-4 of docs/algorithm.md#lsdd with every pooled point as a centre
    A, B = a.reshape(40, dim), b.reshape(30, dim)
    C = np.concatenate([A, B])
    sq = lambda X, Y: ((X[:, None, :] - Y[None, :, :]) ** 2).sum(axis=2)  # noqa: E731
    H = (np.sqrt(np.pi) * sigma) ** dim * np.exp(-sq(C, C) / (4 * sigma**2))
    h = np.exp(-sq(A, C) / (2 * sigma**2)).mean(axis=0) - np.exp(
        -sq(B, C) / (2 * sigma**2)
    ).mean(axis=0)
    theta = np.linalg.solve(H + lam * np.eye(70), h)
    expected = 2 * h @ theta - theta @ H @ theta
    assert res.l2 == pytest.approx(expected, rel=1e-9)
    assert expected != pytest.approx(
        h @ theta, rel=1e-3
    )  # the estimator is told apart from h^T theta


def test_cross_validation_matches_reference_loop():
    """Step 5 re-implemented with explicit fold loops on the same folds selects the same pair."""
    rng = np.random.default_rng(303)
    a, b = rng.normal(size=37), rng.normal(0.8, 1.3, size=29)
    sigmas, lambdas, K, seed = [0.3, 0.7, 1.5], [1e-3, 0.05, 1.0], 4, 11
    res = lsdd(a, b, sigma_list=sigmas, lambda_list=lambdas, n_folds=K, random_state=seed)
    fold_rng = as_generator(
        child_seed_sequence(np.random.SeedSequence(seed), 2)
    )  # documented fold stream
    fold_a = fold_rng.permutation(np.arange(a.size) % K)
    fold_b = fold_rng.permutation(np.arange(b.size) % K)
    C = np.concatenate([a, b])  # all 66 points are centres; their order does not matter
    best, best_score = None, np.inf
    for sigma in sigmas:
        H = np.sqrt(np.pi) * sigma * np.exp(-((C[:, None] - C[None, :]) ** 2) / (4 * sigma**2))

        def phi(x, sigma=sigma):
            return np.exp(-((x[:, None] - C[None, :]) ** 2) / (2 * sigma**2))

        for lam in lambdas:
            score = 0.0
            for k in range(K):
                h_tr = phi(a[fold_a != k]).mean(0) - phi(b[fold_b != k]).mean(0)
                h_te = phi(a[fold_a == k]).mean(0) - phi(b[fold_b == k]).mean(0)
                theta = np.linalg.solve(H + lam * np.eye(C.size), h_tr)
                score += theta @ H @ theta - 2 * h_te @ theta
            if score < best_score:
                best, best_score = (sigma, lam), score
    assert (res.sigma, res.lambda_) == best


def test_default_sigma_grid_is_median_scaled():
    rng = np.random.default_rng(304)
    a, b = 50.0 * rng.normal(size=300), 50.0 * rng.normal(size=200)
    res = lsdd(a, b)
    median = np.median(pdist(np.concatenate([a, b])[:, None]))
    assert _is_sigma_factor(res.sigma / median)


def test_median_subset_for_large_pools():
    rng = np.random.default_rng(305)
    a, b = rng.normal(size=1500), rng.normal(size=1500)
    grid = dict(lambda_list=[0.1], n_centers=20)  # 11 sigmas, one lambda: CV still runs
    sub = lsdd(a, b, median_subset=2000, **grid)
    exact = lsdd(a, b, median_subset=None, **grid)
    median_exact = np.median(pdist(np.concatenate([a, b])[:, None]))
    assert _is_sigma_factor(exact.sigma / median_exact)
    assert sub.sigma / median_exact == pytest.approx(exact.sigma / median_exact, rel=0.05)


def test_zero_median_falls_back_to_sd_then_one():
    a = np.zeros(30)
    b = np.concatenate([np.zeros(27), [1.0, 2.0, 4.0]])
    res = lsdd(a, b, lambda_list=[0.1])
    sd = np.concatenate([a, b]).std()
    assert _is_sigma_factor(res.sigma / sd)
    constant = lsdd(np.zeros(10), np.zeros(10), lambda_list=[0.1])
    assert _is_sigma_factor(constant.sigma) and constant.l2 == 0.0


def test_lsdd_reproducible_and_seeded():
    rng = np.random.default_rng(306)
    a, b = rng.normal(size=400), rng.normal(0.5, size=400)
    kw = dict(n_centers=40)
    assert lsdd(a, b, random_state=1, **kw) == lsdd(a, b, random_state=1, **kw)
    assert lsdd(a, b, random_state=1, **kw).l2 != lsdd(a, b, random_state=2, **kw).l2


@pytest.mark.parametrize(
    "a, b, kwargs, error, match",
    [
        (np.zeros((5, 2)), np.zeros((5, 3)), {}, ValueError, "same dimension"),
        (
            np.array([0.0, np.nan, 1, 2, 3]),
            np.zeros(5),
            {},
            ValueError,
            "a must contain only finite",
        ),
        (np.zeros(5), np.zeros(0), {}, ValueError, "b must be a non-empty"),
        (np.zeros(3), np.arange(10.0), {}, ValueError, "n_folds=5"),
        (np.zeros(10), np.zeros(10), {"sigma_list": [0.0]}, ValueError, "sigma_list"),
        (np.zeros(10), np.zeros(10), {"lambda_list": [-1.0]}, ValueError, "lambda_list"),
        (np.zeros(10), np.zeros(10), {"n_folds": 1}, ValueError, "n_folds"),
        (np.zeros(10), np.zeros(10), {"n_centers": 0}, ValueError, "n_centers"),
    ],
)
def test_lsdd_input_checks(a, b, kwargs, error, match):
    with pytest.raises(error, match=match):
        lsdd(a, b, **kwargs)


# ---------------------------------------------------------------------------------------------
# Attack (docs/algorithm.md#mis-reporting)
# ---------------------------------------------------------------------------------------------


def test_attack_perfect_separation():
    rng = np.random.default_rng(310)
    res = membership_attack_from_distances(rng.uniform(0, 1, 300), rng.uniform(2, 3, 200))
    assert (res.auc, res.advantage, res.tpr_at_1pct_fpr, res.tpr_at_0_1pct_fpr) == (
        1.0,
        1.0,
        1.0,
        1.0,
    )
    assert (res.n_members, res.n_nonmembers) == (300, 200)


def test_attack_identical_distributions():
    rng = np.random.default_rng(311)
    n1, n2 = 5000, 4000
    res = membership_attack_from_distances(rng.exponential(size=n1), rng.exponential(size=n2))
    assert abs(res.auc - 0.5) <= 5 * np.sqrt((n1 + n2 + 1) / (12 * n1 * n2))
    assert res.tpr_at_1pct_fpr <= 0.03


def test_attack_known_answer():
    nonmembers = np.arange(1.0, 101.0)  # 100 non-members at distances 1..100
    members = np.concatenate([np.full(20, 0.5), np.full(30, 1.5), np.full(50, 200.0)])
    res = membership_attack_from_distances(members, nonmembers)
    # 20 members above every non-member; 30 more between non-members 1 and 2 (FPR 1%)
    assert res.tpr_at_0_1pct_fpr == pytest.approx(0.2)
    assert res.tpr_at_1pct_fpr == pytest.approx(0.5)
    assert res.auc == pytest.approx((20 * 100 + 30 * 99) / (100 * 100))
    assert res.advantage == pytest.approx(0.5)  # |TPR - FPR| at TPR 0.5, FPR 1


def test_attack_infinite_distances_score_lowest():
    res = membership_attack_from_distances([np.inf, np.inf, 0.1], [1.0, 2.0])
    assert res.auc == pytest.approx(2 / 6)
    assert membership_attack_from_distances([np.inf], [np.inf]).auc == 0.5
    assert membership_attack_from_distances([1.0, 1.0], [1.0, 1.0]).auc == 0.5


@pytest.mark.parametrize("bad", [np.nan, -1.0, -np.inf])
def test_distance_checks(bad):
    with pytest.raises(ValueError, match="dist_train"):
        membership_attack_from_distances([0.5, bad], [1.0, 2.0])
    with pytest.raises(ValueError, match="dist_test"):
        membership_inference_from_distances([0.5, 1.0], [1.0, bad])


# ---------------------------------------------------------------------------------------------
# mis from distances (docs/algorithm.md#mis, docs/algorithm.md#mis-reporting)
# ---------------------------------------------------------------------------------------------


def test_mis_from_distances_infinite_values_left_out_and_counted():
    rng = np.random.default_rng(320)
    d_tr, d_te = rng.exponential(size=150), rng.exponential(1.5, size=120)
    kw = dict(n_centers=40)
    ref = membership_inference_from_distances(d_tr, d_te, **kw)
    with_inf = membership_inference_from_distances(
        np.concatenate([d_tr, [np.inf] * 3]), np.concatenate([[np.inf] * 2, d_te]), **kw
    )
    assert (with_inf.mis, with_inf.mis_norm) == (ref.mis, ref.mis_norm)
    assert (with_inf.n_infinite, with_inf.n_train_used, with_inf.n_test) == (5, 153, 122)
    assert ref.median_distance == np.median(np.concatenate([d_tr, d_te]))
    with pytest.raises(ValueError, match="all 2 distances are \\+inf"):
        membership_inference_from_distances(d_tr, [np.inf, np.inf])


def test_mis_norm_is_lsdd_on_median_scaled_distances():
    rng = np.random.default_rng(321)
    d_tr, d_te = rng.exponential(2.0, size=100), rng.exponential(3.0, size=100)
    d_tr[:60] = 0.0
    d_te[:60] = 0.0  # pooled median 0 -> m~ = 1
    res = membership_inference_from_distances(d_tr, d_te, random_state=4, n_centers=30)
    assert res.median_distance == 1.0 and res.mis_norm == res.mis
    lsdd_seed = child_seed_sequence(np.random.SeedSequence(4), 1)
    assert res.mis == lsdd(d_tr, d_te, random_state=lsdd_seed, n_centers=30).l2


# ---------------------------------------------------------------------------------------------
# Classifier level (docs/oracles.md#oracle-mis-members)
# ---------------------------------------------------------------------------------------------


class FakeClassifier:
    """Per-class distances c * ||x - centre_c||; records every input of class_distances."""

    def __init__(
        self, centres: np.ndarray, scale: float = 1.0, fabricated: np.ndarray | None = None
    ):
        self.centres, self.scale, self.fabricated = centres, scale, fabricated
        self.calls: list[np.ndarray] = []

    def class_distances(self, X: np.ndarray) -> np.ndarray:
        self.calls.append(np.array(X, copy=True))
        return self.scale * np.linalg.norm(X[:, None, :] - self.centres[None], axis=2)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(330)
    centres = 4.0 * rng.normal(size=(3, 5))
    labels_tr, labels_te = rng.integers(0, 3, 240), rng.integers(0, 3, 200)
    X_train = centres[labels_tr] + 0.6 * rng.normal(size=(240, 5))  # members sit closer
    X_test = centres[labels_te] + 1.0 * rng.normal(size=(200, 5))
    fabricated = X_train + rng.normal(size=X_train.shape)  # what a DP model was built on
    return centres, X_train, X_test, fabricated


def test_oracle31_original_training_rows_feed_score_and_attack(data):
    centres, X_train, X_test, fabricated = data
    clf = FakeClassifier(centres, fabricated=fabricated)
    mi = membership_inference_score(clf, X_train, X_test, n_centers=60)
    att = membership_attack(clf, X_train, X_test)
    assert len(clf.calls) == 4  # training and test distances computed once per function
    for calls in (clf.calls[:2], clf.calls[2:]):
        np.testing.assert_array_equal(calls[0], X_train)
        np.testing.assert_array_equal(calls[1], X_test)
        assert not np.array_equal(calls[0], fabricated)
    assert (mi.n_train_used, mi.n_test, att.n_members, att.n_nonmembers) == (240, 200, 240, 200)
    assert mi.n_infinite == 0 and att.auc > 0.6 and mi.mis > 0


def test_oracle31_seeded_subset_is_shared(data):
    centres, X_train, X_test, _ = data
    clf = FakeClassifier(centres)
    mi = membership_inference_score(
        clf, X_train, X_test, max_train_rows=50, random_state=9, n_centers=60
    )
    att = membership_attack(clf, X_train, X_test, max_train_rows=50, random_state=9)
    rows = training_row_subset(240, 50, 9)
    assert rows.size == 50 == np.unique(rows).size
    np.testing.assert_array_equal(clf.calls[0], X_train[rows])
    np.testing.assert_array_equal(clf.calls[2], X_train[rows])  # same rows feed the attack
    assert (mi.n_train_used, att.n_members) == (50, 50)
    assert not np.array_equal(training_row_subset(240, 50, 10), rows)
    np.testing.assert_array_equal(training_row_subset(240, 500, 9), np.arange(240))
    # consistency with the array-level functions on the recorded distances
    d_tr, d_te = (centres_dist(centres, X) for X in (X_train[rows], X_test))
    assert mi == membership_inference_from_distances(d_tr, d_te, random_state=9, n_centers=60)
    assert att == membership_attack_from_distances(d_tr, d_te)


def centres_dist(centres: np.ndarray, X: np.ndarray) -> np.ndarray:
    return np.linalg.norm(X[:, None, :] - centres[None], axis=2).min(axis=1)


def test_membership_evaluation_computes_distances_once(data):
    centres, X_train, X_test, _ = data
    clf = FakeClassifier(centres)
    mi, att = membership_evaluation(
        clf, X_train, X_test, max_train_rows=100, random_state=3, n_centers=60
    )
    assert len(clf.calls) == 2
    assert mi == membership_inference_score(
        clf, X_train, X_test, max_train_rows=100, random_state=3, n_centers=60
    )
    assert att == membership_attack(clf, X_train, X_test, max_train_rows=100, random_state=3)


def test_oracle31_scale(data):
    centres, X_train, X_test, _ = data
    base = membership_inference_score(FakeClassifier(centres), X_train, X_test)
    for c in (1e-3, 10.0):
        scaled = membership_inference_score(FakeClassifier(centres, scale=c), X_train, X_test)
        assert scaled.mis_norm == pytest.approx(base.mis_norm, rel=1e-9)
        assert scaled.median_distance == pytest.approx(c * base.median_distance, rel=1e-12)
        assert scaled.mis * c / base.mis == pytest.approx(1.0, rel=0.3)  # raw mis ~ 1/c
    scaled_att = membership_attack(FakeClassifier(centres, scale=10.0), X_train, X_test)
    assert scaled_att == membership_attack(FakeClassifier(centres), X_train, X_test)


def test_infinite_class_distances_are_counted(data):
    centres, X_train, X_test, _ = data

    class Partial(FakeClassifier):
        def class_distances(self, X):
            D = super().class_distances(X)
            D[:3] = np.inf  # the first three rows of every call are far from all classes
            return D

    mi, att = membership_evaluation(Partial(centres), X_train, X_test, n_centers=60)
    assert mi.n_infinite == 6
    assert att.n_members == 240


@pytest.mark.parametrize(
    "X_train, X_test, match",
    [
        (np.zeros(10), np.zeros((5, 5)), "X_train must be a 2-D"),
        (np.zeros((10, 5)), np.zeros((5, 4)), "same feature count"),
        (np.zeros((1, 5)), np.zeros((5, 5)), "X_train"),
        (np.zeros((10, 5)), np.zeros((1, 5)), "X_test"),
        (np.full((10, 5), np.nan), np.zeros((5, 5)), "X_train"),
    ],
)
def test_classifier_level_input_checks(data, X_train, X_test, match):
    clf = FakeClassifier(data[0])
    with pytest.raises(ValueError, match=match):
        membership_attack(clf, X_train, X_test)
    with pytest.raises(ValueError, match=match):
        membership_inference_score(clf, X_train, X_test)


def test_classifier_contract_checks(data):
    centres, X_train, X_test, _ = data
    with pytest.raises(TypeError, match="class_distances"):
        membership_attack(object(), X_train, X_test)

    class Wrong(FakeClassifier):
        def class_distances(self, X):
            return super().class_distances(X)[:, 0]

    with pytest.raises(ValueError, match="must return an array of shape"):
        membership_attack(Wrong(centres), X_train, X_test)
    with pytest.raises(ValueError, match="max_train_rows"):
        membership_attack(FakeClassifier(centres), X_train, X_test, max_train_rows=1)


# ---------------------------------------------------------------------------------------------
# The eigenbasis cross-validation agrees with the solve-based reference
# (benchmarks/_membership_reference.py; tolerance: l2_agreement_bound there)
# ---------------------------------------------------------------------------------------------

EPS = np.finfo(np.float64).eps


def _skewed(rng, n, scale=1.0):
    """Positive, right-skewed values shaped like min-over-class distances."""
    return scale * rng.gamma(2.0, 1.0, n) * rng.lognormal(0.0, 0.4, n)


def _same_grid_point(new: float, ref: float, grid_ratio: float) -> bool:
    """The two sigmas are the same point of a grid whose neighbours differ by >= grid_ratio."""
    return abs(np.log(new / ref)) < 0.5 * np.log(grid_ratio)


# Smallest ratio of neighbouring SIGMA_FACTORS (2.2 / 2.0): two sigmas closer than half of it
# in log scale are the same grid point.
_SIGMA_GRID_RATIO = min(b / a for a, b in zip(SIGMA_FACTORS, SIGMA_FACTORS[1:], strict=False))


def _assert_agrees(new, ref, a, b, *, seed, n_centers=300, rho=8 * EPS):
    """Same lambda and number of centres as the reference (the caller checks sigma), l2 within
    l2_agreement_bound of it."""
    assert (new.lambda_, new.n_centers) == (ref.lambda_, ref.n_centers)
    bound = l2_agreement_bound(
        a, b, ref.sigma, ref.lambda_, random_state=seed, n_centers=n_centers, rho=rho
    )
    assert abs(new.l2 - ref.l2) <= bound, (new.l2, ref.l2, bound)
    assert new.l2_clipped == max(0.0, new.l2)


_LSDD_CASES = {
    # name: (n1, n2, dim, lsdd kwargs); skewed positive data, "normal-data" normal
    "tiny": (40, 30, 1, {}),
    "small": (300, 200, 1, {}),
    "quickstart-size": (1257, 540, 1, {}),
    "median-subset": (2500, 1800, 1, {"n_centers": 100}),
    "exact-median": (900, 1300, 1, {"median_subset": None, "n_centers": 80}),
    "n1-equals-n_folds": (5, 9, 1, {}),
    "two-folds-of-one": (2, 7, 1, {"n_folds": 2}),
    "ten-folds": (10, 23, 1, {"n_folds": 10}),
    "single-grid-point": (60, 50, 1, {"sigma_list": [0.4], "lambda_list": [0.02]}),
    "one-sigma": (60, 50, 1, {"sigma_list": [0.4]}),
    "one-lambda": (60, 50, 1, {"lambda_list": [0.05]}),
    "user-grid-all-centres": (
        80,
        70,
        1,
        {"sigma_list": [0.2, 0.5, 1.0, 3.0], "lambda_list": [1e-3, 0.1, 1.0], "n_centers": 1000},
    ),
    "tiny-lambda": (120, 90, 1, {"lambda_list": [1e-9, 1e-6, 1e-3]}),
    "two-dimensional": (200, 150, 2, {"n_centers": 120}),
    "normal-data": (500, 400, 1, {"n_centers": 150}),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", list(_LSDD_CASES))
def test_lsdd_matches_solve_based_reference(case, seed):
    n1, n2, dim, kwargs = _LSDD_CASES[case]
    rng = np.random.default_rng([400, seed])
    if case == "normal-data":  # negative values too
        a, b = rng.normal(size=(n1, dim)), rng.normal(0.5, 1.2, size=(n2, dim))
    else:
        a, b = _skewed(rng, (n1, dim)), _skewed(rng, (n2, dim), 1.2)
    if dim == 1:
        a, b = a[:, 0], b[:, 0]
    new = lsdd(a, b, random_state=seed, **kwargs)
    ref = reference_lsdd(a, b, random_state=seed, **kwargs)
    assert new.sigma == ref.sigma  # same scale (exact median), same grid point
    _assert_agrees(new, ref, a, b, seed=seed, n_centers=kwargs.get("n_centers", 300))


def test_lsdd_constant_samples_match_reference():
    for a, b in ((np.zeros(10), np.zeros(12)), (np.full(8, 2.5), np.full(9, 2.5))):
        new, ref = lsdd(a, b), reference_lsdd(a, b)
        assert new == ref and new.l2 == 0.0


def test_lsdd_too_few_values_for_the_folds_raises_like_reference():
    a, b = np.arange(4.0), np.arange(10.0)
    with pytest.raises(ValueError) as new_error:
        lsdd(a, b)
    with pytest.raises(ValueError) as ref_error:
        reference_lsdd(a, b)
    assert str(new_error.value) == str(ref_error.value)
    assert lsdd(a, b, sigma_list=[1.0], lambda_list=[0.1]).l2 > 0  # no CV: no fold check


def _distances(rng, n_train, n_test, n_inf_train, n_inf_test, zero_share=0.0):
    d_tr, d_te = _skewed(rng, n_train, 0.9), _skewed(rng, n_test)  # members a little closer
    d_tr[rng.random(n_train) < zero_share] = 0.0
    d_te[rng.random(n_test) < zero_share] = 0.0
    d_tr[rng.choice(n_train, n_inf_train, replace=False)] = np.inf
    d_te[rng.choice(n_test, n_inf_test, replace=False)] = np.inf
    return d_tr, d_te


_MIS_CASES = {
    # name: (n_train, n_test, +inf in train, +inf in test, share of zeros, lsdd kwargs)
    "quickstart-size": (1257, 540, 3, 2, 0.0, {}),
    "few-centres": (400, 300, 0, 5, 0.0, {"n_centers": 60}),
    "median-subset": (3000, 1000, 10, 0, 0.0, {"n_centers": 150}),
    "user-grid": (200, 150, 1, 1, 0.0, {"sigma_list": [0.1, 0.3, 1.0], "lambda_list": [0.01, 0.1]}),
    "median-zero": (300, 200, 2, 2, 0.6, {"n_centers": 80}),
}


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("case", list(_MIS_CASES))
def test_mis_and_mis_norm_match_solve_based_reference(case, seed):
    """mis (raw run) and mis_norm (median-scaled run), now from one shared pass, against two
    independent reference LSDD calls; +inf distances left out as the public function does."""
    n_train, n_test, inf_train, inf_test, zeros, kwargs = _MIS_CASES[case]
    rng = np.random.default_rng([410, seed])
    d_tr, d_te = _distances(rng, n_train, n_test, inf_train, inf_test, zeros)
    mi = membership_inference_from_distances(d_tr, d_te, random_state=seed, **kwargs)
    ref_raw, ref_norm, median = reference_mis(d_tr, d_te, random_state=seed, **kwargs)
    assert mi.median_distance == median and mi.n_infinite == inf_train + inf_test
    lsdd_seed = child_seed_sequence(np.random.SeedSequence(seed), 1)
    a, b = d_tr[np.isfinite(d_tr)], d_te[np.isfinite(d_te)]
    raw, norm = lsdd_runs(a, b, (1.0, median), random_state=lsdd_seed, **kwargs)
    assert (mi.mis, mi.mis_norm) == (raw.l2, norm.l2)
    n_centers = kwargs.get("n_centers", 300)

    assert raw.sigma == ref_raw.sigma
    _assert_agrees(raw, ref_raw, a, b, seed=lsdd_seed, n_centers=n_centers)

    # mis_norm: the new code takes sigma = (raw median scale) / m~ and computes the kernels in
    # raw units; the reference recomputes the median on the scaled distances. The sigmas are
    # the same grid point and differ by rounding only (sigma_perturbation_bound); the kernel
    # entries then by kernel_perturbation_bound, which l2_agreement_bound propagates.
    a_n, b_n = a / median, b / median
    R = max(a_n.max(), b_n.max())
    if "sigma_list" in kwargs:  # the new code's tau = m~ sigma: one rounding
        rho_sigma_max = EPS
    else:  # M: the median pairwise distance in units of m~
        pool = np.concatenate([a, b])[:, None]
        median_rng = as_generator(child_seed_sequence(lsdd_seed, 0))
        M = _reference_sigma_scale(pool, kwargs.get("median_subset", 2000), median_rng) / median
        rho_sigma_max = sigma_perturbation_bound(R, M)
    assert _same_grid_point(norm.sigma, ref_norm.sigma, _SIGMA_GRID_RATIO)
    assert abs(norm.sigma / ref_norm.sigma - 1.0) <= rho_sigma_max
    rho = kernel_perturbation_bound(rho_sigma_max, R, ref_norm.sigma)
    _assert_agrees(norm, ref_norm, a_n, b_n, seed=lsdd_seed, n_centers=n_centers, rho=rho)


# ---------------------------------------------------------------------------------------------
# The closed form itself, the exact median and the blocked kernel sums
# ---------------------------------------------------------------------------------------------


def _random_psd(rng, n, n_zero):
    """H = V diag(w) V^T with eigenvalues spread over 14 decades and n_zero exact zeros."""
    V, _ = np.linalg.qr(rng.normal(size=(n, n)))
    w = np.concatenate([np.zeros(n_zero), np.logspace(-12, 2.5, n - n_zero)])
    H = (V * w) @ V.T
    return (H + H.T) / 2.0, w


@pytest.mark.parametrize("seed, n, n_zero, K", [(0, 20, 0, 1), (1, 60, 10, 5), (2, 150, 40, 3)])
def test_ridge_quadratics_equal_direct_solves(seed, n, n_zero, K):
    """sum_k theta_k^T H theta_k and sum_k h_te,k^T theta_k from the eigenbasis equal the values
    from Cholesky solves of (H + lam I) theta_k = h_tr,k for a random PSD H (rank-deficient,
    so rounding gives negative eigenvalues that _psd_eigh clips).

    Bound (first order; both ways are backward stable with ||E|| <= eta ||M||, M = H + lam I,
    eta = 3 n^2 eps: Cholesky, Higham ASNA Thm 10.3 with || |R^T| |R| || <= n ||M||; a symmetric
    eigensolver's backward error is of the same order, and clipping negative eigenvalues moves
    them by less; the products V^T h and the final sums add <= eta relative to ||h||):
    theta^T H theta = h^T M^-1 H M^-1 h changes by <= 3 ||E|| ||theta||^2 + 2 ||e|| ||theta||
    (||M^-1 H|| <= 1) and h_te^T M^-1 h_tr by <= ||E|| ||phi|| ||theta|| + ||e_tr|| ||phi||
    + ||e_te|| ||theta|| (phi = M^-1 h_te); the two results differ by at most twice that.
    """
    rng = np.random.default_rng([420, seed])
    H, exact_w = _random_psd(rng, n, n_zero)
    h_tr, h_te = rng.normal(size=(n, K)), rng.normal(size=(n, K))
    lambdas = np.logspace(-6, 1, 8)
    w, V = _psd_eigh(H.copy())
    assert (w >= 0).all()
    eta = 3 * n**2 * EPS
    norm_H = np.linalg.norm(H, 2)
    # Weyl: within the backward error (of eigh, and of forming H) of the eigenvalues H was
    # built with
    assert np.all(np.abs(np.sort(w) - exact_w) <= 2 * eta * norm_H)
    quad, cross = _ridge_quadratics(w, V.T @ h_tr, V.T @ h_te, lambdas)
    for j, lam in enumerate(lambdas):
        M = H + lam * np.eye(n)
        theta = scipy.linalg.solve(M, h_tr, assume_a="pos")
        phi = scipy.linalg.solve(M, h_te, assume_a="pos")
        nt, nphi = np.linalg.norm(theta, axis=0), np.linalg.norm(phi, axis=0)
        ntr, nte = np.linalg.norm(h_tr, axis=0), np.linalg.norm(h_te, axis=0)
        norm_M = norm_H + lam
        bound_quad = 2 * eta * np.sum(3 * norm_M * nt**2 + 2 * ntr * nt)
        bound_cross = 2 * eta * np.sum(norm_M * nphi * nt + ntr * nphi + nte * nt)
        assert abs(quad[j] - np.sum(theta * (H @ theta))) <= bound_quad
        assert abs(cross[j] - np.sum(h_te * theta)) <= bound_cross


def test_median_is_numpy_median():
    rng = np.random.default_rng(430)
    for n in (1, 2, 3, 10, 11, 1000, 1001):
        values = rng.lognormal(size=n)
        assert _median(values) == np.median(values)


def _median_samples():
    rng = np.random.default_rng(431)
    yield "skewed", _skewed(rng, 1797)
    yield "normal, negative values", rng.normal(size=2000)
    yield "ties", np.round(rng.exponential(size=1500), 1)
    yield "many zeros", np.where(rng.random(1200) < 0.6, 0.0, rng.exponential(size=1200))
    yield "median 0", np.concatenate([np.zeros(900), rng.exponential(size=100)])
    yield "median half the smallest gap", np.concatenate([np.zeros(708), [0.3], np.ones(292)])
    yield "three values", rng.integers(0, 3, 999).astype(np.float64) * 1e-3
    yield "large offset", rng.normal(1e6, 1e-3, 777)
    yield "half one value", np.concatenate([rng.lognormal(size=500), np.full(500, 0.7)])
    yield "small n", rng.exponential(size=30)
    yield "n = 2", np.array([3.0, 1.0])
    yield "all equal", np.full(100, 4.2)


@pytest.mark.parametrize("x", [pytest.param(x, id=name) for name, x in _median_samples()])
def test_median_pairwise_distance_is_exact(x, monkeypatch):
    """Exactly np.median(pdist(x)), without forming the distances when n >= 64."""
    expected = np.median(pdist(x[:, None]))
    if x.size >= 64 and np.unique(x).size > 1:
        monkeypatch.setattr(lsdd_module, "pdist", _no_pdist)
    assert _median_pairwise_distance_1d(x) == expected


def _no_pdist(*args, **kwargs):
    raise AssertionError("the band search fell back to forming all distances")


def test_kernel_fold_sums_entries_bit_for_bit_and_sums_within_bound():
    rng = np.random.default_rng(432)
    x, centres = _skewed(rng, (7, 1)), _skewed(rng, (50, 1))
    widths = np.array([0.3, 1.1, 4.0])
    sq = cdist(x, centres, "sqeuclidean")
    # one row per fold: the sums are the kernel entries themselves, as the old code made them
    one_per_fold = _kernel_fold_sums(x, np.arange(7), 7, centres, widths)
    for u, sigma in enumerate(widths):
        np.testing.assert_array_equal(one_per_fold[u], np.exp(-sq / (2.0 * sigma * sigma)))
    # many rows, several blocks per fold: sums of n non-negative terms, any order: within
    # gamma_n relative of each other (Higham, ASNA §4.2), twice for two orders
    x = _skewed(rng, (5000, 1))
    folds = rng.permutation(np.arange(5000) % 4)
    sums = _kernel_fold_sums(x, folds, 4, centres, widths)
    indicator = (folds[None, :] == np.arange(4)[:, None]).astype(np.float64)
    sq = cdist(x, centres, "sqeuclidean")
    for u, sigma in enumerate(widths):
        direct = indicator @ np.exp(-sq / (2.0 * sigma * sigma))
        assert np.all(np.abs(sums[u] - direct) <= 2 * 5000 * EPS * direct)


def test_attack_equals_rank_based_reference():
    rng = np.random.default_rng(433)
    for trial in range(20):
        d_tr, d_te = np.round(_skewed(rng, 300), 1), np.round(_skewed(rng, 200, 1.1), 1)
        d_tr[rng.random(300) < 0.05] = np.inf
        d_te[rng.random(200) < 0.05] = np.inf
        if trial == 0:
            d_tr[:] = np.inf
        if trial == 1:
            d_tr[:], d_te[:] = np.inf, np.inf
        att = membership_attack_from_distances(d_tr, d_te)
        assert (
            att.auc,
            att.advantage,
            att.tpr_at_1pct_fpr,
            att.tpr_at_0_1pct_fpr,
        ) == reference_attack_from_distances(d_tr, d_te)
    huge = membership_attack_from_distances([np.inf, 1.7e308, 1.0], [np.finfo(float).max, 2.0])
    assert huge == membership_attack_from_distances([np.inf, 3.0, 1.0], [4.0, 2.0])


def test_the_quickstarts_membership_metric_factors_few_matrices(monkeypatch):
    """The work the metric does, counted (speed itself is benchmarks/bench_membership.py's): at
    the quickstart's size (1257 members, 540 non-members) the old code made 200 dense solves
    (99 per LSDD call, mis and mis_norm, plus the refits) and was 33 of the quickstart's 53 s;
    now one eigendecomposition per σ for both estimates and one Cholesky refit each."""
    import scipy.linalg

    from kahm_dask.privacy import lsdd as mod

    calls = {"solve": 0, "eigh": 0, "cholesky": 0}
    for name in calls:
        real = getattr(scipy.linalg, name)

        def counted(*a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(*a, **k)

        monkeypatch.setattr(scipy.linalg, name, counted)
        if hasattr(mod.scipy.linalg, name):
            monkeypatch.setattr(mod.scipy.linalg, name, counted)
    rng = np.random.default_rng(0)
    membership_inference_from_distances(rng.gamma(4.0, 0.3, 1257), rng.gamma(4.0, 0.32, 540), random_state=0)
    factorisations = sum(calls.values())
    assert calls["eigh"] <= len(SIGMA_FACTORS) and factorisations <= len(SIGMA_FACTORS) + 4, calls
