"""LSDD, membership-inference score and attack (docs/algorithm.md#membership).

Oracles: docs/algorithm.md#oracle-lsdd-gaussians, docs/algorithm.md#oracle-lsdd-exact,
docs/algorithm.md#oracle-mis-members.
"""

import numpy as np
import pytest
from scipy.spatial.distance import pdist

from kahm_dask._random import as_generator, child_seed_sequence
from kahm_dask.privacy.membership import (
    LAMBDA_GRID,
    SIGMA_FACTORS,
    lsdd,
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
# Classifier level (docs/algorithm.md#oracle-mis-members)
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
