"""One per-cluster recipe (kahm_dask/recipe.py) and one minimum-cluster-size rule
(kahm_dask/partition.py), shared by the in-memory classifier and the Dask pipeline
(docs/algorithm.md#pipeline, docs/algorithm.md#kmeans-partition); the pipeline's task builds the
same cluster (tests/pipeline/training/test_tasks.py)."""

from __future__ import annotations

import logging
import pickle
import warnings

import numpy as np
import pytest

from kahm_dask import DeepKAHM, KAHMClassifier, WideKAHM
from kahm_dask.deep import _query_blocks
from kahm_dask.kahm import EVAL_BLOCK_ROWS
from kahm_dask.partition import kmeans_partition, partition_with_min_size
from kahm_dask.privacy.fabrication import fabricate_partitioned
from kahm_dask.privacy.randomness import PrivacyLeakWarning
from kahm_dask.recipe import TrainParams
from tests._kit import RECIPE_SETTINGS, ignore_warnings, recipe_fits, recipe_params
from tests._kit import assert_same_deep as _assert_same_deep
from tests._kit import recipe_data as _data

SETTINGS = RECIPE_SETTINGS


def _ignore_leaks():
    """The test-only noise seed and the private r warn (PrivacyLeakWarning): expected here."""
    return ignore_warnings(PrivacyLeakWarning)


@pytest.fixture(scope="module")
def fitted():
    """For every setting: the classifier fitted with a given partition and the noisy rows of
    the release it used (:func:`tests._kit.recipe_fits`)."""
    return recipe_fits()


@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_classifier_branch_is_the_recipe_on_its_rows(fitted, name):
    """fit(partition=...) builds branch s of class c, its DP rows and its M̃ by one call of
    TrainParams.fit_cluster on that branch's (noisy) rows."""
    X, y, part, noisy, out = fitted
    clf, params = out[name], recipe_params(SETTINGS[name])
    passes = []
    for c in (0, 1):
        rows = y == c
        assert isinstance(clf.models_[c], WideKAHM)
        for s in (0, 1):
            branch = part[rows] == s
            private_rows = X[rows][branch]
            source = private_rows if not params.private else noisy[c][branch]
            with _ignore_leaks():
                fit = params.fit_cluster(source, private_rows if params.reads_private_rows else None)
            _assert_same_deep(clf.models_[c].branches_[s], fit.model)
            if params.private:
                assert clf.dp_data_[c][branch].tobytes() == fit.dp_rows.tobytes()
            else:
                assert fit.dp_rows is None and fit.n_passes is None
            passes.append(fit.n_passes)
        np.testing.assert_array_equal(clf.models_[c].branch_sizes_, np.bincount(part[rows]))
    if params.fabricates:
        assert [p for c in (0, 1) for p in clf.fabrication_passes_[c]] == passes
        assert name != "fabricated" or passes == [2] * 4
    else:
        assert not hasattr(clf, "fabrication_passes_")


@pytest.mark.parametrize("name", ["fabricated", "fabricated-private-r"])
def test_per_branch_recipe_equals_remark4_then_wide_fit(fitted, name):
    """With a given partition, the per-branch recipe is docs/algorithm.md#training-pipeline's
    fit: fabricate_partitioned over the partition, then WideKAHM.fit with it."""
    X, y, part, noisy, out = fitted
    clf = out[name]
    kw = {k: v for k, v in SETTINGS[name].items() if k != "dp_data"}  # the fabrication's own settings
    for c in (0, 1):
        rows = y == c
        with _ignore_leaks():
            fab, _, passes = fabricate_partitioned(X[rows], noisy[c], 3, partition=part[rows], **kw)
        wide = WideKAHM(3, 2, 30).fit(fab, partition=part[rows])
        assert fab.tobytes() == clf.dp_data_[c].tobytes() and passes == clf.fabrication_passes_[c]
        for a, b in zip(wide.branches_, clf.models_[c].branches_, strict=True):
            _assert_same_deep(a, b)


def test_recipe_parameters_are_small_frozen_and_picklable():
    params = TrainParams(4, 2, epsilon=1.0, dp_data="fabricated", r_source="private")
    assert pickle.loads(pickle.dumps(params)) == params
    assert params.private and params.fabricates and params.reads_private_rows
    assert not TrainParams(4, 2, epsilon=1.0, dp_data="noisy", r_source="private").reads_private_rows
    assert not TrainParams(4, 2).private and not TrainParams(4, 2).fabricates
    with pytest.raises(AttributeError):
        params.epsilon = 2.0
    with pytest.raises(ValueError, match="needs the subset's original rows"):
        params.fit_cluster(np.random.default_rng(0).uniform(size=(40, 3)))


def test_fabrication_settings_without_fabrication_warn():
    """With dp_data="noisy" (the default) nothing is fabricated: a stopping rule set away from its
    default would be ignored silently, so it warns and names the setting; fabricating, or not
    private, or the defaults, it does not."""
    with pytest.warns(UserWarning, match=r"r_source, r_value set the fabrication.*dp_data='fabricated'"):
        TrainParams(4, 2, epsilon=1.0, r_source="threshold", r_value=0.1)
    with pytest.warns(UserWarning, match=r"^max_passes sets the fabrication"):
        TrainParams(4, 2, epsilon=1.0, max_passes=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TrainParams(4, 2, epsilon=1.0)
        TrainParams(4, 2, epsilon=1.0, dp_data="fabricated", r_value=3, max_passes=5)
        TrainParams(4, 2, r_value=3)  # not private: no DP rows at all
    X, y, _ = _data(0)
    with pytest.warns(UserWarning, match="r_value sets the fabrication"):
        KAHMClassifier(3, 1, random_state=0, epsilon=1.0, bounds=(0, 1), r_value=2).fit(X, y)


def test_wide_assemble_equals_fit():
    """WideKAHM.assemble of branches fitted on each part gives the fitted WideKAHM."""
    X, _, part = _data(1)
    wide = WideKAHM(3, 2).fit(X, partition=part)
    branches = [DeepKAHM(3, 2).fit(X[part == s]) for s in (0, 1)]
    built = WideKAHM(3, 2).assemble(branches, part)
    assert built.branches_[1] is branches[1] and built.n_branches_ == 2
    np.testing.assert_array_equal(built.branch_sizes_, wide.branch_sizes_)
    Q = np.random.default_rng(2).uniform(size=(50, 5))
    for a, b in zip(built.transform_with_distance(Q), wide.transform_with_distance(Q), strict=True):
        assert a.tobytes() == b.tobytes()
    with pytest.raises(ValueError, match="1 branches for a partition into 2 parts"):
        WideKAHM(3, 2).assemble(branches[:1], part)


# ------------------------------------------------------- the minimum-cluster-size rule
def _small_first(n_rows: int, accept_at: int, calls: list):
    """A fake clustering step: a cluster of 1 row while S > accept_at, then equal parts."""

    def step(S: int, seed: np.random.SeedSequence) -> np.ndarray:
        calls.append((S, seed))
        labels = np.arange(n_rows) % S
        if S > accept_at:
            labels[:] = np.arange(n_rows) % (S - 1)
            labels[0] = S - 1
        return labels

    return step


def test_retry_rule_lowers_S_with_a_new_seed_per_attempt(caplog):
    calls = []
    seed = np.random.SeedSequence(11)
    with caplog.at_level(logging.INFO, logger="kahm_dask.test"):
        labels = partition_with_min_size(
            100, 5, _small_first(100, 3, calls), min_cluster_size=10, seed=seed,
            logger=logging.getLogger("kahm_dask.test"),
        )
    assert [S for S, _ in calls] == [5, 4, 3]
    # attempt a uses child(seed, a): distinct streams, the same for the same root
    assert [s.spawn_key for _, s in calls] == [(0,), (1,), (2,)]
    assert all(s.entropy == seed.entropy for _, s in calls)
    assert len({int(s.generate_state(1)[0]) for _, s in calls}) == 3
    assert labels.dtype == np.int64 and np.bincount(labels).min() >= 10 and labels.max() == 2
    assert [r.getMessage() for r in caplog.records] == [
        "k-means: a cluster of 1 rows < 10; retrying with S = 4",
        "k-means: a cluster of 1 rows < 10; retrying with S = 3",
        "k-means: 100 rows into 3 clusters (attempt 3)",
    ]


def test_retry_rule_ends_in_one_branch_of_zeros():
    calls = []
    labels = partition_with_min_size(50, 4, _small_first(50, 1, calls), min_cluster_size=5,
                                     seed=np.random.SeedSequence(0))
    assert [S for S, _ in calls] == [4, 3, 2]  # at most S − 1 attempts
    assert labels.dtype == np.int64 and not labels.any() and labels.shape == (50,)
    calls.clear()
    for n_rows, n_clusters in ((50, 1), (1, 3)):  # S = 1 from the start: no clustering
        labels = partition_with_min_size(n_rows, n_clusters, _small_first(n_rows, 1, calls),
                                         min_cluster_size=5, seed=np.random.SeedSequence(0))
        assert labels.shape == (n_rows,) and not labels.any()
    assert calls == []


def test_kmeans_partition_is_the_rule_around_sklearn_kmeans():
    """kmeans_partition = partition_with_min_size with scikit-learn's KMeans seeded by the
    first word of each attempt's stream."""
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(3)
    Y = np.vstack([rng.normal(size=(80, 4)), rng.normal(size=(80, 4)) + 8, rng.normal(size=(8, 4)) - 8])

    def step(S, seed):
        return KMeans(S, n_init=10, max_iter=10_000, tol=1e-4,
                      random_state=int(seed.generate_state(1)[0])).fit_predict(Y)

    expected = partition_with_min_size(len(Y), 3, step, min_cluster_size=30, seed=np.random.SeedSequence(4))
    got = kmeans_partition(Y, 3, min_cluster_size=30, random_state=4, n_init=10)
    np.testing.assert_array_equal(got, expected)
    assert np.bincount(got).tolist() in ([80, 88], [88, 80])


# ----------------------------------------------------------- one blocked evaluation
@pytest.mark.parametrize("n_rows,chunk_rows", [(0, None), (1, None), (1500, None), (1500, 1000), (700, 64)])
def test_query_blocks_cover_rows_within_chunks(n_rows, chunk_rows):
    blocks = list(_query_blocks(n_rows, chunk_rows))
    covered = np.concatenate([np.arange(b.start, b.stop) for b in blocks]) if blocks else np.empty(0)
    np.testing.assert_array_equal(covered, np.arange(n_rows))
    chunk = chunk_rows or max(n_rows, 1)
    for b in blocks:
        assert 0 < b.stop - b.start <= min(EVAL_BLOCK_ROWS, chunk)
        assert b.start // chunk == (b.stop - 1) // chunk  # never across a chunk boundary


@pytest.mark.parametrize("chunk_size", [1000, 100])
def test_views_of_the_one_evaluation_agree_bitwise(chunk_size):
    """transform, distance and transform_with_distance of deep and wide KAHMs are views of
    the same blocked evaluation (queries span several blocks and chunks)."""
    X, _, part = _data(4, n=160)
    Q = np.random.default_rng(5).uniform(size=(1100, 5))
    for model in (DeepKAHM(3, 3, chunk_size=chunk_size).fit(X),
                  WideKAHM(3, 3, chunk_size=chunk_size).fit(X, partition=np.arange(160) % 2)):
        images, gamma, index = model.transform_with_distance(Q)
        assert images.tobytes() == model.transform(Q).tobytes()
        assert gamma.tobytes() == model.distance(Q).tobytes()
        g, i = model._distance_rows(Q)
        assert g.tobytes() == gamma.tobytes() and i.tobytes() == index.tobytes()
        np.testing.assert_allclose(np.linalg.norm(Q - images, axis=1), gamma, rtol=1e-12)
