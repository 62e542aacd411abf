"""Federated minimum-distance classification (docs/federated.md): exactness against the
centralised classifier, the site boundary (answers only; membership evaluated site-locally),
no noise shared between sites, and the site splits."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from sklearn.base import BaseEstimator

import kahm_dask.federated.classifier as federated_classifier
from kahm_dask import KAHMClassifier
from kahm_dask.federated import (
    MIN_ROWS_PER_CLASS,
    FederatedClassifier,
    Site,
    SiteAnswer,
    combine,
    fit_sites,
    label_heterogeneity,
    site_fit,
    site_label_counts,
    site_noise_seed,
    site_seed,
    split_sites,
)
from kahm_dask.partition import kmeans_partition
from kahm_dask.privacy.ledger import PrivacyLedger
from kahm_dask.privacy.membership import membership_evaluation
from kahm_dask.privacy.randomness import PrivacyLeakWarning

N_COMP, N_LAYERS = 10, 2


@pytest.fixture(scope="module")
def centralised(digits):
    return KAHMClassifier(N_COMP, N_LAYERS, random_state=0).fit(digits.X_train, digits.y_train)


# --------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("epsilon", [None, 2.0])
def test_one_site_holding_everything_equals_centralised(digits, epsilon):
    clf = KAHMClassifier(N_COMP, N_LAYERS, random_state=3, epsilon=epsilon, bounds=(0, 1),
                         dp_data="noisy")
    clf.fit(digits.X_train, digits.y_train)
    fed = FederatedClassifier([Site(clf)])
    decision = fed.decide(digits.X_test)
    np.testing.assert_array_equal(decision.label, clf.predict(digits.X_test))
    np.testing.assert_array_equal(decision.min_distance, clf.class_distances(digits.X_test).min(axis=1))
    assert (decision.site == 0).all()


def test_sites_equal_to_centralised_branches_give_identical_predictions(digits):
    """One site per (class, branch) of a centralised model with several branches per class."""
    X, y = digits.X_train, digits.y_train
    labels = np.zeros(y.size, dtype=np.int64)
    for c in np.unique(y):
        rows = y == c
        labels[rows] = kmeans_partition(X[rows], 3, min_cluster_size=12, random_state=int(c))
    central = KAHMClassifier(N_COMP, N_LAYERS, block_size=40, random_state=0).fit(X, y, partition=labels)
    assert central.n_branches_.min() >= 2

    sites = []
    for c, wide in zip(central.classes_, central.models_, strict=True):
        for s, branch in enumerate(wide.branches_):
            rows = (y == c) & (labels == np.unique(labels[y == c])[s])
            with site_fit():  # one class: a site's model
                local = KAHMClassifier(N_COMP, N_LAYERS, block_size=40).fit(
                    X[rows], y[rows], partition=np.zeros(rows.sum(), dtype=np.int64)
                )
            # the site's model is exactly that branch
            np.testing.assert_array_equal(
                local.models_[0].branches_[0]._evaluate_rows(digits.X_test)[1],
                branch._evaluate_rows(digits.X_test)[1],
            )
            sites.append(Site(local))
    assert len(sites) == central.n_branches_.sum()
    fed = FederatedClassifier(sites)
    np.testing.assert_array_equal(fed.predict(digits.X_test), central.predict(digits.X_test))
    np.testing.assert_array_equal(
        fed.min_distance(digits.X_test), central.class_distances(digits.X_test).min(axis=1)
    )


def test_only_site_answers_cross_the_boundary(digits, centralised, monkeypatch):
    """The combiner receives SiteAnswer objects of two fresh read-only (m,) arrays, nothing else."""
    X, y = digits.X_train, digits.y_train
    sites = fit_sites(KAHMClassifier(N_COMP, N_LAYERS, random_state=1), X, y,
                      split_sites(y, 3, "label_skew", classes_per_site=4, random_state=0))
    received = []

    def spy(*args, **kwargs):
        received.append((args, kwargs))
        return combine(*args, **kwargs)

    monkeypatch.setattr(federated_classifier, "combine", spy)
    fed = FederatedClassifier(sites)
    label = fed.predict(digits.X_test)
    assert len(received) == 1
    (answers,), kwargs = received[0]
    assert kwargs == {} and len(answers) == 3
    assert [f.name for f in dataclasses.fields(SiteAnswer)] == ["min_distance", "label"]
    m = digits.X_test.shape[0]
    for a in answers:
        assert type(a) is SiteAnswer
        for arr in (a.min_distance, a.label):
            assert type(arr) is np.ndarray and arr.shape == (m,) and not arr.flags.writeable
            for data in (X, digits.X_test):
                assert not np.shares_memory(arr, data)
        with pytest.raises(dataclasses.FrozenInstanceError):
            a.label = a.label
    assert set(label) <= set(y)

    site = sites[0]
    assert [n for n in dir(site) if not n.startswith("_")] == ["answer"]
    with pytest.raises(AttributeError):
        site.model = centralised  # no attribute can be attached to a Site
    with pytest.raises(TypeError, match="class_distances"):
        Site(object())


def test_combine_ties_go_to_lowest_site_index():
    answers = [
        SiteAnswer(np.array([2.0, 1.0, 1.0, np.inf]), np.array([0, 0, 0, 0])),
        SiteAnswer(np.array([1.0, 1.0, 3.0, np.inf]), np.array([1, 1, 1, 1])),
        SiteAnswer(np.array([1.0, 5.0, 1.0, np.inf]), np.array([2, 2, 2, 2])),
    ]
    decision = combine(answers)
    np.testing.assert_array_equal(decision.site, [1, 0, 0, 0])
    np.testing.assert_array_equal(decision.label, [1, 0, 0, 0])
    np.testing.assert_array_equal(decision.min_distance, [1.0, 1.0, 1.0, np.inf])


def test_combine_and_answer_validation():
    with pytest.raises(ValueError, match="at least one site"):
        combine([])
    with pytest.raises(TypeError, match="SiteAnswer"):
        combine([(np.zeros(2), np.zeros(2))])
    with pytest.raises(ValueError, match="different numbers"):
        combine([SiteAnswer(np.zeros(2), np.zeros(2)), SiteAnswer(np.zeros(3), np.zeros(3))])
    with pytest.raises(ValueError, match="NaN"):
        SiteAnswer(np.array([np.nan]), np.array([0]))
    with pytest.raises(ValueError, match="same shape"):
        SiteAnswer(np.zeros(2), np.zeros(3))


def test_federated_membership_metrics_match_centralised_for_one_site(digits, centralised):
    fed = FederatedClassifier([Site(centralised)])
    kw = {"max_train_rows": 300, "random_state": 5}
    got = fed.membership_evaluation([digits.X_train], digits.X_test, **kw)
    want = membership_evaluation(centralised, digits.X_train, digits.X_test, **kw)
    assert got.sites == (want,)
    assert (got.inference, got.attack) == want
    assert fed.score(digits.X_test, digits.y_test) == centralised.score(digits.X_test, digits.y_test)


class _Recorder(BaseEstimator):
    """A fitted classifier that records (as row bytes) every row it is asked about."""

    def __init__(self, model, seen: set) -> None:
        self.model, self.seen = model, seen
        self.classes_ = model.classes_

    def fit(self, X, y):  # pragma: no cover - makes check_is_fitted accept the recorder
        return self

    def class_distances(self, X):
        X = np.asarray(X, dtype=np.float64)
        self.seen.update(row.tobytes() for row in X)
        return self.model.class_distances(X)


def _row_set(X) -> set:
    return {row.tobytes() for row in np.asarray(X, dtype=np.float64)}


def test_membership_evaluation_keeps_every_sites_training_rows_at_that_site(digits):
    """Attack test (site boundary): the evaluation asks site q's model about site q's own
    training rows and the shared test rows only, never about another site's training rows."""
    X, y = digits.X_train, digits.y_train
    split = split_sites(y, 3, "label_skew", classes_per_site=4, random_state=0)
    seen = [set() for _ in split]
    sites = [
        Site(_Recorder(KAHMClassifier(N_COMP, 1, random_state=q).fit(X[rows], y[rows]), seen[q]))
        for q, rows in enumerate(split)
    ]
    fed = FederatedClassifier(sites)
    result = fed.membership_evaluation([X[rows] for rows in split], digits.X_test,
                                       max_train_rows=150, random_state=0)
    test_rows = _row_set(digits.X_test)
    for q, rows in enumerate(split):
        own = _row_set(X[rows])
        foreign = _row_set(np.delete(X, rows, axis=0)) - own - test_rows
        assert len(foreign) > 500  # the other sites' rows are there to be leaked
        assert not seen[q] & foreign, f"site {q} was queried with another site's training rows"
        assert seen[q] <= own | test_rows
        assert len(seen[q] & (own - test_rows)) > 100  # it evaluated its own members (150)
        assert result.sites[q][1].n_members == 150
        assert result.sites[q][1].n_nonmembers == digits.X_test.shape[0]
    # the combined summary is made of per-site summaries only
    assert result.attack.auc == max(a.auc for _, a in result.sites)
    assert (result.inference, result.attack) == result.sites[result.worst_site]
    assert sum(i.n_train_used for i, _ in result.sites) == 3 * 150
    summary = result.summary()
    assert summary["attack_auc"] == result.attack.auc and len(summary["sites"]) == 3
    assert set(summary["sites"][0]) >= {"mis", "attack_auc", "n_train_used"}

    # the old pooled form (all sites' training rows in one array) is refused
    with pytest.raises(TypeError, match="one array of training rows per site"):
        fed.membership_evaluation(X, digits.X_test)
    with pytest.raises(ValueError, match="3 sites"):
        fed.membership_evaluation([X[split[0]]], digits.X_test)


# --------------------------------------------------------------------------- splits
SCHEMES = [
    ("iid", 5, {}),
    ("per_class", 10, {}),
    ("label_skew", 5, {"classes_per_site": 3}),
    ("dirichlet", 5, {"alpha": 0.5}),
]


@pytest.mark.parametrize("scheme, n_sites, kw", SCHEMES)
def test_split_covers_all_rows_disjointly_with_valid_shares(digits, scheme, n_sites, kw):
    y = digits.y_train
    sites = split_sites(y, n_sites, scheme, random_state=0, **kw)
    assert len(sites) == n_sites
    allrows = np.concatenate(sites)
    np.testing.assert_array_equal(np.sort(allrows), np.arange(y.size))  # coverage + disjointness
    for rows in sites:
        assert rows.dtype == np.int64 and (np.diff(rows) > 0).all()
    counts, _ = site_label_counts(y, sites)
    assert ((counts == 0) | (counts >= MIN_ROWS_PER_CLASS)).all()
    assert (counts.sum(axis=1) > 0).all()
    again = split_sites(y, n_sites, scheme, random_state=0, **kw)
    assert all(np.array_equal(a, b) for a, b in zip(sites, again, strict=True))


def test_per_class_split_is_one_site_per_class(digits):
    y = digits.y_train
    sites = split_sites(y, 10, "per_class")
    for q, rows in enumerate(sites):
        np.testing.assert_array_equal(rows, np.flatnonzero(y == np.unique(y)[q]))
    assert label_heterogeneity(y, sites) == pytest.approx(0.9, abs=0.01)  # 1 − 1/C
    with pytest.raises(ValueError, match="one site per class"):
        split_sites(y, 5, "per_class")


@pytest.mark.parametrize("n_sites, k", [(5, 2), (10, 2), (4, 3)])
def test_label_skew_class_counts(digits, n_sites, k):
    y = digits.y_train
    sites = split_sites(y, n_sites, "label_skew", classes_per_site=k, random_state=1)
    counts, _ = site_label_counts(y, sites)
    held = counts > 0
    assert (held.sum(axis=1) == k).all()  # k classes per site
    assert held.any(axis=0).all()  # every class held by some site
    for c in range(counts.shape[1]):
        share = counts[held[:, c], c]
        assert share.max() - share.min() <= 1  # split evenly among its holders
    with pytest.raises(ValueError, match="cannot cover"):
        split_sites(y, 2, "label_skew", classes_per_site=2)
    with pytest.raises(ValueError, match="exceeds"):
        split_sites(y, 2, "label_skew", classes_per_site=11)


def test_dirichlet_is_seeded_and_non_iid_measurably(digits):
    y = digits.y_train
    a = split_sites(y, 5, "dirichlet", alpha=0.5, random_state=7)
    b = split_sites(y, 5, "dirichlet", alpha=0.5, random_state=7)
    c = split_sites(y, 5, "dirichlet", alpha=0.5, random_state=8)
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    assert not all(np.array_equal(p, q) for p, q in zip(a, c, strict=True))
    het = {
        alpha: np.mean([label_heterogeneity(y, split_sites(y, 5, "dirichlet", alpha=alpha, random_state=s))
                        for s in range(3)])
        for alpha in (0.1, 1.0, 100.0)
    }
    iid = label_heterogeneity(y, split_sites(y, 5, "iid", random_state=0))
    assert het[0.1] > het[1.0] > het[100.0]
    assert het[0.1] > 0.4 and het[100.0] < 0.1 and iid < 0.1


def test_small_class_shares_are_merged_and_empty_sites_rejected():
    y = np.array([0] * 3 + [1] * 20)
    sites = split_sites(y, 3, "iid", random_state=0)
    counts, _ = site_label_counts(y, sites)
    assert ((counts == 0) | (counts >= 2)).all() and counts[:, 0].sum() == 3
    assert (counts[:, 0] > 0).sum() == 1  # 3 rows of class 0: one site holds them all
    with pytest.raises(ValueError, match="without rows"):
        split_sites(np.array([0, 0, 1, 1]), 3, "iid", random_state=0)
    with pytest.raises(ValueError, match="fewer than 2 rows"):
        split_sites(np.array([0, 1, 1]), 1, "iid")


def test_split_option_validation(digits):
    y = digits.y_train
    with pytest.raises(ValueError, match="scheme must be one of"):
        split_sites(y, 2, "random")
    with pytest.raises(ValueError, match="alpha is only used"):
        split_sites(y, 2, "iid", alpha=1.0)
    with pytest.raises(ValueError, match="classes_per_site is only used"):
        split_sites(y, 2, "dirichlet", alpha=1.0, classes_per_site=2)
    with pytest.raises(ValueError, match="needs classes_per_site"):
        split_sites(y, 2, "label_skew")
    with pytest.raises(ValueError, match="needs alpha"):
        split_sites(y, 2, "dirichlet")


# --------------------------------------------------------------------------- fitting sites
def test_fit_sites_seeds_and_partitions(digits):
    seeds = [site_seed(11, q) for q in range(4)]
    assert seeds == [site_seed(11, q) for q in range(4)] and len(set(seeds)) == 4
    assert all(isinstance(s, int) and 0 <= s < 2**64 for s in seeds)
    y = digits.y_train
    sites = split_sites(y, 2, "iid", random_state=0)
    with pytest.raises(ValueError, match="partitions"):
        fit_sites(KAHMClassifier(N_COMP, N_LAYERS, random_state=11), digits.X_train, y, sites,
                  partitions=[None])
    # site_seed seeds the site's k-means: the non-private site model is reproducible
    fitted = fit_sites(KAHMClassifier(N_COMP, 1, random_state=11), digits.X_train, y, sites)
    own = KAHMClassifier(N_COMP, 1, random_state=seeds[1]).fit(digits.X_train[sites[1]], y[sites[1]])
    np.testing.assert_array_equal(fitted[1].answer(digits.X_test).min_distance,
                                  own.class_distances(digits.X_test).min(axis=1))


def _released_rows(site: Site) -> np.ndarray:
    """The DP rows a site's model was built on (what it would release), in class order."""
    model = site._model  # the test looks behind the boundary
    return np.concatenate([model.dp_data_[c] for c in model.classes_])


def test_sites_with_identical_rows_release_different_noise(digits):
    """No noise reuse across sites: two sites holding the same rows, fitted from one estimator
    with one random_state, release different noisy rows (the noise is not seed-driven)."""
    rows = np.arange(300)
    estimator = KAHMClassifier(N_COMP, 1, random_state=0, epsilon=2.0, bounds=(0, 1), dp_data="noisy")
    a, b = (_released_rows(s) for s in fit_sites(estimator, digits.X_train, digits.y_train, [rows, rows]))
    assert a.shape == b.shape == (300, 64)
    assert np.mean(a == b) < 0.05  # two independent discrete Laplace draws rarely coincide
    # ... and a refit of the same site (same site seed) releases new noise too
    (again,) = fit_sites(estimator, digits.X_train, digits.y_train, [rows])
    assert np.mean(_released_rows(again) == a) < 0.05


def test_insecure_noise_seed_gives_each_site_its_own_noise(digits):
    """The test-only seeded noise is derived per site: reproducible, never shared by two sites."""
    rows = np.arange(200)
    assert len({site_noise_seed(7, q) for q in range(5)}) == 5
    assert len({site_noise_seed(7, q) for q in range(5)} | {site_seed(7, q) for q in range(5)}) == 10
    estimator = KAHMClassifier(N_COMP, 1, random_state=0, epsilon=2.0, bounds=(0, 1),
                               dp_data="noisy", insecure_noise_seed=7)
    with pytest.warns(PrivacyLeakWarning, match="fixed seed"):
        s0, s1 = fit_sites(estimator, digits.X_train, digits.y_train, [rows, rows])
        (again,) = fit_sites(estimator, digits.X_train, digits.y_train, [rows])
        own = KAHMClassifier(N_COMP, 1, random_state=site_seed(0, 1), epsilon=2.0, bounds=(0, 1),
                             dp_data="noisy", insecure_noise_seed=site_noise_seed(7, 1))
        own.fit(digits.X_train[rows], digits.y_train[rows])
    assert np.mean(_released_rows(s0) == _released_rows(s1)) < 0.05
    np.testing.assert_array_equal(_released_rows(again), _released_rows(s0))
    np.testing.assert_array_equal(_released_rows(s1), np.concatenate([own.dp_data_[c] for c in own.classes_]))


def test_every_site_keeps_its_own_ledger(digits):
    sites = split_sites(digits.y_train, 2, "iid", random_state=0)
    shared = KAHMClassifier(N_COMP, 1, epsilon=2.0, bounds=(0, 1), ledger=PrivacyLedger())
    with pytest.raises(ValueError, match="own privacy ledger"):
        fit_sites(shared, digits.X_train, digits.y_train, sites)
    ledgers = [PrivacyLedger(), PrivacyLedger()]
    estimator = KAHMClassifier(N_COMP, 1, epsilon=2.0, bounds=(0, 1), dp_data="noisy")
    fit_sites(estimator, digits.X_train, digits.y_train, sites, ledgers=ledgers)
    for ledger in ledgers:  # one release of ε = 2 per site (disjoint rows: parallel composition)
        assert ledger.spent()[0] == pytest.approx(2.0, rel=1e-3)


def test_one_class_is_refused_unless_it_is_a_sites():
    """Issue 38: rows of one class trained (and spent ε) into a model of one answer. A site
    may hold one class; the pooled rows of a federation may not."""
    rng = np.random.default_rng(0)
    X, y = rng.uniform(size=(60, 4)) + np.repeat([[0.0], [5.0]], 30, axis=0), np.repeat([4, 7], 30)  # apart
    with pytest.raises(ValueError, match=r"^the training rows hold one class \(4\); a classifier needs at least two\."):
        KAHMClassifier(3, 1).fit(X[:30], y[:30])
    with pytest.raises(ValueError, match=r"one class \(4\)"):
        fit_sites(KAHMClassifier(3, 1), X[:30], y[:30], [np.arange(15), np.arange(15, 30)])
    sites = fit_sites(KAHMClassifier(3, 1, random_state=0), X, y, [np.arange(30), np.arange(30, 60)])
    assert FederatedClassifier(sites).predict(X).tolist() == y.tolist()
