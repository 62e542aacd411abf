"""Determinism: the same seed gives bit-identical models and predictions across runs and
across 1 vs 2 workers (issue item 5; docs/reliability.md §5).

Why it holds: every random draw comes from one root ``SeedSequence`` spawned per row block
(noise), class (partition) and attempt, never from the worker or the task order; every task
is a pure function of its inputs; BLAS runs one thread per task (a multi-threaded BLAS may
sum in another order); reductions (min over clusters, argmin over classes) are exact.
The slow tests also compare runs that were interrupted (test_worker_loss,
test_interrupted_run) with the same baseline.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from kahm_dask import KAHMClassifier
from kahm_dask.datasets import make_class_blobs
from kahm_dask.pipeline.store import write_dataset
from kahm_dask.pipeline.tasks import TrainParams
from kahm_dask.pipeline.train import TrainSettings, train_pipeline

from .conftest import assert_same_fingerprint, pipeline_yaml, run_fingerprint, run_pipeline_file


@pytest.fixture(scope="module")
def blobs():
    X, y = make_class_blobs(400, 8, 3, random_state=4)
    return X[:300], y[:300], X[300:]


def _state(clf: KAHMClassifier) -> bytes:
    """Everything a fitted classifier holds (its pickle), for bitwise comparison."""
    return pickle.dumps({k: v for k, v in vars(clf).items() if k.endswith("_")})


@pytest.mark.parametrize("kw", [{}, {"epsilon": 2.0}, {"epsilon": 2.0, "dp_data": "noisy"},
                                {"epsilon": 1.0, "r_source": "passes", "r_value": 3, "cluster_on": "noisy"}],
                         ids=["non-private", "fabricated", "noisy", "post-processed"])
def test_estimator_same_seed_same_bits(blobs, kw):
    X, y, Q = blobs
    a = KAHMClassifier(5, 3, 100, random_state=7, **kw).fit(X, y)
    b = KAHMClassifier(5, 3, 100, random_state=7, **kw).fit(X, y)
    assert _state(a) == _state(b)
    assert a.class_distances(Q).tobytes() == b.class_distances(Q).tobytes()
    if kw:
        c = KAHMClassifier(5, 3, 100, random_state=8, **kw).fit(X, y)
        assert not np.array_equal(a.class_distances(Q), c.class_distances(Q))


def test_pipeline_same_seed_same_bits_with_threads(tmp_path, blobs):
    X, y, _ = blobs
    store = write_dataset(tmp_path / "s.zarr", X, y, chunk_rows=64)
    settings = TrainSettings(TrainParams(5, 3, epsilon=2.0), seed=5, block_size=100)  # S = 1
    fps = []
    for run in ("a", "b"):
        train_pipeline(store, tmp_path / f"{run}.zarr", tmp_path / f"{run}.work", settings, progress=False)
        fps.append(run_fingerprint(tmp_path / f"{run}.zarr"))
    assert_same_fingerprint(*fps)


@pytest.mark.slow
def test_pipeline_one_worker_equals_two_workers(tmp_path, baseline_fingerprint):
    cfg = pipeline_yaml(tmp_path / "p.yaml", tmp_path / "run", n_workers=1)
    run_pipeline_file(cfg)
    one = run_fingerprint(tmp_path / "run" / "model.zarr", tmp_path / "run" / "predictions.zarr")
    assert_same_fingerprint(baseline_fingerprint, one)


@pytest.mark.slow
def test_dask_ml_partition_is_the_same_on_threads_one_and_two_workers():
    """The k-means partition (dask-ml, k-means||) is the only stage with a reduction whose
    order could depend on the cluster; its labels must not (a resumed run recomputes it)."""
    from distributed import Client, LocalCluster

    from kahm_dask.pipeline.data import synthetic_blobs
    from kahm_dask.pipeline.partition import partition_classes

    X, y = synthetic_blobs(600, 8, 1, seed=3, chunk_rows=150)  # one class, S = 2
    kw = dict(n_components=5, block_size=300, s_rule="round", min_cluster_size=None,
              seed=np.random.SeedSequence(17), init_max_iter=2, max_iter=10)
    bounds = [(0, 0, X.shape[0])]
    labels = [partition_classes(X, bounds, **kw)]
    for n_workers in (1, 2):
        with LocalCluster(n_workers=n_workers, threads_per_worker=1, dashboard_address=":0") as cluster, \
                Client(cluster):
            labels.append(partition_classes(X, bounds, **kw))
    assert labels[0].max() >= 1  # S = 2 clusters per class: k-means really ran
    for other in labels[1:]:
        np.testing.assert_array_equal(other, labels[0])
