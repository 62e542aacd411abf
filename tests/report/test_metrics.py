"""Each score's defining property: its value on identical and on disjoint samples, a case worked
by hand, its range, and what the DP noise does to it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kahm_dask.datasets import make_class_blobs
from kahm_dask.report.metrics import (
    boundary_adherence,
    correlation_attenuation,
    correlation_similarity,
    detection_auc,
    dp_within_bounds,
    efficacy,
    feature_kinds,
    ks_complement,
    marginal_similarity,
    tv_complement,
)

RNG = np.random.default_rng(12)


def test_ks_complement_is_one_for_the_same_sample_zero_for_disjoint_ones_and_one_minus_the_largest_cdf_gap():
    x = RNG.normal(size=300)
    assert ks_complement(x, x) == 1.0 and ks_complement(x, RNG.permutation(x)) == 1.0
    assert ks_complement(x, x + 100.0) == 0.0
    # F_R and F_D of [0, 1, 2, 3] and [1, 2, 3, 4] differ by 1/4 at most
    assert ks_complement(np.arange(4.0), np.arange(1.0, 5.0)) == pytest.approx(0.75)


def test_tv_complement_counts_dp_values_in_the_nearest_real_category():
    real = np.array([0.0, 0.0, 1.0, 1.0])
    assert tv_complement(real, real) == 1.0
    # noisy values snap to 0 (−0.2, 0.1, 0.4) and 1 (1.3): shares 3/4, 1/4 against 1/2, 1/2
    assert tv_complement(real, np.array([-0.2, 0.1, 0.4, 1.3])) == pytest.approx(0.75)
    assert tv_complement(np.zeros(5), np.array([7.0])) == 1.0  # one category: everything is in it
    assert tv_complement(real, np.array([5.0, 5.0])) == pytest.approx(0.5)  # all in 1: shares 0, 1


def test_features_with_few_values_are_discrete_and_get_the_tv_complement():
    real = np.column_stack([RNG.integers(0, 3, 200).astype(float), RNG.normal(size=200)])
    assert feature_kinds(real).tolist() == ["discrete", "continuous"]
    dp = real + np.array([0.1, 0.0])  # the discrete column snaps back to its categories
    assert marginal_similarity(real, dp).tolist() == [1.0, 1.0]


def test_correlation_similarity_is_one_for_the_same_correlations_zero_for_reversed_ones_and_in_range():
    x = RNG.normal(size=500)
    real = np.column_stack([x, x])
    assert correlation_similarity(real, real) == pytest.approx(1.0)
    assert correlation_similarity(real, np.column_stack([x, -x])) == pytest.approx(0.0)
    for _ in range(5):
        a, b = RNG.normal(size=(100, 6)), RNG.normal(size=(100, 6))
        assert 0.0 <= correlation_similarity(a, b @ RNG.normal(size=(6, 6))) <= 1.0
    constant = np.column_stack([x, np.zeros(500), x])  # pairs with a constant feature are left out
    assert correlation_similarity(constant, constant) == pytest.approx(1.0)


def test_independent_noise_attenuates_correlations_by_the_variance_ratio():
    # unit-variance features with ρ = 0.8, noise of variance σ² = 1: ρ shrinks by 1 / (1 + σ²) = 1/2;
    # a correlation's standard error at n = 20 000 is about (1 − ρ²)/√n < 0.003, so 0.02 is ample
    n, rho = 20_000, 0.8
    z = RNG.normal(size=(n, 2))
    real = np.column_stack([z[:, 0], rho * z[:, 0] + math.sqrt(1 - rho**2) * z[:, 1]])
    assert correlation_attenuation(real, real) == pytest.approx(1.0)
    assert correlation_attenuation(real, real + RNG.normal(size=real.shape)) == pytest.approx(0.5, abs=0.02)


def test_boundary_adherence_is_the_share_of_dp_values_in_the_real_range():
    real = np.array([[0.0, 10.0], [1.0, 20.0]])
    dp = np.array([[0.5, 5.0], [2.0, 15.0], [-1.0, 20.0], [1.0, 25.0]])
    assert boundary_adherence(real, dp).tolist() == [0.5, 0.5]
    assert dp_within_bounds(dp, np.array([0.0, 0.0]), np.array([1.0, 30.0])).tolist() == [0.5, 1.0]


def test_detection_is_near_one_half_for_one_distribution_and_near_one_for_separated_ones():
    n, p = 1000, 5
    # the null spread of the AUC (Mann–Whitney) at n rows each: √((2n + 1) / (12 n²)) ≈ 0.013
    spread = math.sqrt((2 * n + 1) / (12 * n * n))
    a, b = RNG.normal(size=(n, p)), RNG.normal(size=(n, p))
    assert abs(detection_auc(a, b) - 0.5) < 4 * spread
    assert detection_auc(a, b + 3.0) > 0.99
    # zero-mean noise only widens the spread: the squared features see it
    assert detection_auc(a, b + RNG.laplace(scale=1.0, size=b.shape)) > 0.7
    assert detection_auc(a, b) == detection_auc(a, b)  # seeded: the same score every time


def test_efficacy_trains_each_model_on_dp_and_on_real_rows_and_tests_on_the_test_rows():
    X, y = make_class_blobs(600, n_features=8, n_classes=3, random_state=0)
    noisy = X[:400] + RNG.laplace(scale=0.2, size=(400, 8))
    table = efficacy({"DP": (noisy, y[:400]), "real": (X[:400], y[:400])}, X[400:], y[400:])
    assert [(r.model, r.trained_on) for r in table] == [(m, t) for m in ("KAHM", "LogisticRegression")
                                                        for t in ("DP", "real")]
    for row in table:
        assert row.recall.shape == (3,) and row.classes.tolist() == [0, 1, 2]
        counts = np.bincount(y[400:], minlength=3)
        assert row.accuracy == pytest.approx(float(row.recall @ counts) / counts.sum())  # recall weighted by class
    trtr_kahm = table[1]
    assert trtr_kahm.accuracy > 0.9
