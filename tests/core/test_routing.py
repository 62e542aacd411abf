"""Routing (docs/algorithm.md#routing), the k-means space (docs/algorithm.md#kmeans-space) and
the estimator's threads: properties each must satisfy."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from kahm_dask import KAHMClassifier, WideKAHM
from kahm_dask.datasets import make_class_blobs
from kahm_dask.partition import kmeans_partition, kmeans_space
from kahm_dask.routing import nearest_centres, rows_per_centre

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("k", [1, 2, 5, 7])
def test_nearest_centres_are_the_k_smallest_distances_in_order(k):
    Yq, C = RNG.normal(size=(300, 6)), RNG.normal(size=(7, 6))
    probes = nearest_centres(Yq, C, k)
    d2 = ((Yq[:, None, :] - C[None, :, :]) ** 2).sum(axis=2)
    assert probes.shape == (300, k)
    np.testing.assert_array_equal(probes, np.argsort(d2, axis=1, kind="stable")[:, :k])


def test_rows_per_centre_inverts_the_probe_lists():
    probes = nearest_centres(RNG.normal(size=(50, 3)), RNG.normal(size=(6, 3)), 2)
    lists = rows_per_centre(probes, 6)
    assert len(lists) == 6 and sum(len(r) for r in lists) == probes.size
    for s, rows in enumerate(lists):
        np.testing.assert_array_equal(rows, np.flatnonzero((probes == s).any(axis=1)))


@pytest.fixture(scope="module")
def wide():
    X, _ = make_class_blobs(3000, 8, 4, random_state=0)  # four modes in one class: S = 10
    model = WideKAHM(5, 2, 300, random_state=0).fit(X[:2600])
    return model, X[2600:]


def test_n_probe_at_least_s_is_bit_identical_to_every_branch(wide):
    model, Q = wide
    exhaustive = model._distance_rows(Q)
    for n_probe in (model.n_branches_, model.n_branches_ + 5):
        routed = model._distance_rows(Q, n_probe=n_probe)
        for a, b in zip(exhaustive, routed, strict=True):
            assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("n_probe", [1, 3])
def test_routed_distance_is_the_minimum_over_the_probed_branches(wide, n_probe):
    model, Q = wide
    gamma, branch = model._distance_rows(Q, n_probe=n_probe)
    per_branch = np.column_stack([b.distance(Q) for b in model.branches_])  # (m, S)
    probes = nearest_centres(Q, model.centres_, n_probe)
    probed = np.take_along_axis(per_branch, probes, axis=1)
    np.testing.assert_allclose(gamma, probed.min(axis=1), rtol=1e-12)
    assert np.all(np.isin(branch, probes.ravel()))
    assert np.all(gamma >= per_branch.min(axis=1) * (1 - 1e-12))  # never below exhaustive
    model.set_params(n_probe=n_probe)
    try:
        np.testing.assert_allclose(model.distance(Q), gamma, rtol=1e-12)
    finally:
        model.set_params(n_probe=None)


def test_centres_are_the_branch_means(wide):
    model, _ = wide
    assert model.centres_.shape == (model.n_branches_, model.n_features_in_)
    np.testing.assert_array_equal(model.centres_[1], model.branches_[1].layers_[-1].mean_)


def test_classifier_routing_exhaustive_and_close(digits):
    s = digits
    clf = KAHMClassifier(10, 2, 200, random_state=0).fit(s.X_train, s.y_train)
    D = clf.class_distances(s.X_test)
    clf.set_params(n_probe=int(clf.n_branches_.max()))
    assert clf.class_distances(s.X_test).tobytes() == D.tobytes()
    clf.set_params(n_probe=2)
    routed = clf.predict(s.X_test)
    assert np.mean(routed == clf.classes_[D.argmin(axis=1)]) >= 0.98
    assert clf.score(s.X_test, s.y_test) >= 0.97


def test_set_params_after_a_prediction_takes_effect(digits):
    """n_probe and eval_dtype changed after a prediction of the same rows act, as on a fresh
    estimator with those settings (a module-global cache keyed on eval_dtype but not n_probe
    returned the exhaustive distances; the old test compared that cached result with itself)."""
    s = digits
    clf = KAHMClassifier(10, 1, 40, random_state=0).fit(s.X_train, s.y_train)  # about 3 branches a class
    exhaustive = clf.class_distances(s.X_test)
    for changes in ({"n_probe": 1}, {"n_probe": 2, "eval_dtype": "float32"}):
        clf.set_params(**changes)
        fresh = KAHMClassifier(10, 1, 40, random_state=0, **changes).fit(s.X_train, s.y_train)
        np.testing.assert_array_equal(clf.class_distances(s.X_test), fresh.class_distances(s.X_test))
        assert not np.array_equal(clf.class_distances(s.X_test), exhaustive)


def test_threads_give_the_same_model(digits):
    s = digits
    with threadpool_limits(limits=1):  # the single-threaded fit runs BLAS as the threads do
        one = KAHMClassifier(10, 2, 200, random_state=0, n_jobs=1).fit(s.X_train, s.y_train)
        D1 = one.class_distances(s.X_test)
    two = KAHMClassifier(10, 2, 200, random_state=0, n_jobs=2).fit(s.X_train, s.y_train)
    assert two.class_distances(s.X_test).tobytes() == D1.tobytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # DP path in threads: warnings still reach the caller
        dp = KAHMClassifier(10, 2, 200, random_state=0, n_jobs=2, epsilon=2.0, bounds=(0, 1))
        assert dp.fit(s.X_train, s.y_train).score(s.X_test, s.y_test) > 0.8


def test_kmeans_space_keeps_distances_up_to_the_discarded_part():
    Y = RNG.normal(size=(120, 3)) @ RNG.normal(size=(3, 40))  # rank 3 in 40 dimensions
    Z = kmeans_space(Y, 3)
    dY = np.linalg.norm(Y[:, None] - Y[None], axis=2)
    np.testing.assert_allclose(np.linalg.norm(Z[:, None] - Z[None], axis=2), dY, atol=1e-9)
    W = kmeans_space(RNG.normal(size=(30, 60)), 5)  # N < p: the N × N Gram path
    assert W.shape == (30, 5)
    Y2 = RNG.normal(size=(30, 60))
    Z2 = kmeans_space(Y2, 5)
    assert np.all(np.linalg.norm(Z2[:, None] - Z2[None], axis=2)
                  <= np.linalg.norm(Y2[:, None] - Y2[None], axis=2) + 1e-9)


def test_kmeans_in_principal_space_finds_separated_modes():
    centres = RNG.normal(size=(4, 200)) * 8
    Y = np.repeat(centres, 60, axis=0) + RNG.normal(size=(240, 200))
    labels = kmeans_partition(Y, 4, min_cluster_size=10, random_state=0, kmeans_dims=10)
    truth = np.repeat(np.arange(4), 60)
    # the same partition up to renaming
    assert len({(a, b) for a, b in zip(labels, truth, strict=True)}) == 4


