"""The Dask pipeline against the in-memory classifier, on real scheduler/worker processes.

Given the same partition labels, seed and noise, the pipeline and
``KAHMClassifier.fit(X, y, partition=labels)`` build the same cluster models and give the same
predictions. The noise is fixed on both sides with ``insecure_noise_seed`` (tests only: it
voids the guarantee and warns); both draw it block-addressed, so chunking does not change it.
Also: resume after a lost cluster and the cap on the rows of a task
(tests/system/test_cli_run.py runs the whole pipeline from the command line).
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import zarr
from distributed import Client

from kahm_dask import KAHMClassifier
from kahm_dask.partition import kmeans_partition
from kahm_dask.pipeline.predict import DISTANCES, PREDICTIONS, predict_to_store
from kahm_dask.pipeline.stores.dataset import write_dataset
from kahm_dask.pipeline.stores.manifest import read_manifest
from kahm_dask.pipeline.stores.model import cluster_dir, load_cluster
from kahm_dask.pipeline.training import TrainSettings, train_pipeline
from kahm_dask.pipeline.training import tasks as tasks_mod
from kahm_dask.pipeline.training import train as train_mod
from kahm_dask.recipe import TrainParams
from tests._kit import interrupt_after_training, subprocess_cluster
from tests.pipeline.training.conftest import HELD


@pytest.fixture(scope="module")
def scheduler_address(tmp_path_factory):
    """A real `dask scheduler` and two `dask worker` processes (with nannies) on 127.0.0.1."""
    with subprocess_cluster(tmp_path_factory.mktemp("cluster"), 2, nanny=True) as cluster:
        yield cluster.address


def _within_class_partition(X, y, block_size, seed=0):
    """Within-class k-means labels (the core rules), the same input for both paths."""
    labels = np.zeros(len(y), dtype=np.int64)
    for i, c in enumerate(np.unique(y)):
        rows = y == c
        S = max(1, int(np.floor(rows.sum() / block_size + 0.5)))
        labels[rows] = kmeans_partition(X[rows], S, min_cluster_size=30, random_state=seed + i)
    return labels


@pytest.mark.filterwarnings("ignore::kahm_dask.privacy.randomness.PrivacyLeakWarning")
@pytest.mark.parametrize("epsilon", [None, 2.0])
def test_pipeline_on_remote_cluster_equals_in_memory(tmp_path, digits, scheduler_address, epsilon, route):
    block_size = 60  # ~2 clusters per digit class: the min/argmin reductions are exercised
    labels = _within_class_partition(digits.X_train, digits.y_train, block_size)
    assert labels.max() >= 1
    store = write_dataset(tmp_path / "train.zarr", digits.X_train, digits.y_train, chunk_rows=200)
    params = TrainParams(20, 5, epsilon=epsilon)
    # the same noise on both sides: a fixed (insecure, test-only) seed and the same bounds
    noise = dict(insecure_noise_seed=123) if epsilon is not None else {}
    settings = TrainSettings(params, seed=7, block_size=block_size, bounds=(0.0, 1.0), **noise)
    with Client(scheduler_address) as client:
        summary = train_pipeline(store, tmp_path / "m.zarr", tmp_path / "work", settings, client,
                                 partition=labels, progress=False)
        group = predict_to_store(tmp_path / "m.zarr", da.from_array(digits.X_test, chunks=(128, 64)),
                                 tmp_path / "pred.zarr", client)
    assert summary["n_clusters"] == len(set(zip(digits.y_train, labels, strict=True)))
    assert summary["rows_held"] == HELD[route]

    clf = KAHMClassifier(20, 5, block_size, random_state=7, epsilon=epsilon, bounds=(0.0, 1.0), **noise)
    clf.fit(digits.X_train, digits.y_train, partition=labels)
    classes = np.asarray(group.attrs["classes"])
    np.testing.assert_array_equal(classes[group[PREDICTIONS][:]], clf.predict(digits.X_test))
    np.testing.assert_allclose(group[DISTANCES][:], clf.class_distances(digits.X_test), rtol=1e-10, atol=1e-12)
    if epsilon is not None:  # the same DP rows, cluster by cluster
        first = cluster_dir(tmp_path / "m.zarr", 0, 0)
        fab = zarr.open_group(str(first), mode="r")["dp_rows"][:]
        rows0 = digits.y_train == clf.classes_[0]
        np.testing.assert_allclose(fab, clf.dp_data_[clf.classes_[0]][labels[rows0] == 0], rtol=1e-10, atol=1e-12)


def test_resume_recomputes_only_missing_clusters(tmp_path, digits, route):
    labels = _within_class_partition(digits.X_train, digits.y_train, 60)
    store = write_dataset(tmp_path / "train.zarr", digits.X_train, digits.y_train, chunk_rows=300)
    settings = TrainSettings(TrainParams(10, 2, epsilon=1.0), seed=3, block_size=60, bounds=(0.0, 1.0))
    first = train_pipeline(store, tmp_path / "m.zarr", tmp_path / "w", settings, partition=labels, progress=False)
    assert first["n_resumed"] == 0
    before = load_cluster(cluster_dir(tmp_path / "m.zarr", 3, 1)).distance(digits.X_test)
    interrupt_after_training(tmp_path / "m.zarr", tmp_path / "w", (3, 1))  # a cluster lost mid-run
    second = train_pipeline(store, tmp_path / "m.zarr", tmp_path / "w", settings, partition=labels, progress=False)
    assert second["n_resumed"] == first["n_clusters"] - 1
    assert first["rows_held"] == second["rows_held"] == HELD[route]
    after = load_cluster(cluster_dir(tmp_path / "m.zarr", 3, 1)).distance(digits.X_test)
    np.testing.assert_array_equal(before, after)


def test_max_cluster_rows_bounds_every_task(tmp_path, digits, route):
    """partition.max_cluster_rows splits the k-means clusters so no task gets more rows (the
    memory bound of the out-of-core DP run); the model store records the capped clusters."""
    store = write_dataset(tmp_path / "train.zarr", digits.X_train, digits.y_train, chunk_rows=300)
    settings = TrainSettings(TrainParams(10, 1), seed=3, block_size=60, max_cluster_rows=50)
    summary = train_pipeline(store, tmp_path / "m.zarr", tmp_path / "w", settings, progress=False)
    sizes = [c["n_rows"] for c in read_manifest(tmp_path / "m.zarr")["clusters"]]
    assert max(sizes) <= 50 and sum(sizes) == digits.X_train.shape[0]
    assert summary["n_clusters"] == len(sizes) > 10 * 2
    assert summary["rows_held"] == HELD[route]




#: The rows of each cluster task, in the order the worker ran them (module level: the in-process
#: worker resolves the wrappers below by reference, so it appends here).
_RAN: list[int] = []


def _recorded_rows(rows, *args):
    _RAN.append(len(next(iter(rows.values()))))  # rows: source name → (n, p)
    return tasks_mod.train_cluster_rows(rows, *args)


def _recorded_slice(work, staged, c, s, a, b, params, served=None):
    _RAN.append(b - a)
    return tasks_mod.train_cluster(work, staged, c, s, a, b, params, served)


def test_cluster_tasks_run_largest_first(tmp_path, digits, route, monkeypatch):
    """On one single-threaded worker the cluster tasks run in decreasing size (the
    longest-processing-time rule), whatever order the partition lists them in."""
    from distributed import LocalCluster

    monkeypatch.setattr(train_mod, "train_cluster_rows", _recorded_rows)
    monkeypatch.setattr(train_mod, "train_cluster", _recorded_slice)
    _RAN.clear()
    store = write_dataset(tmp_path / "train.zarr", digits.X_train, digits.y_train, chunk_rows=300)
    settings = TrainSettings(TrainParams(10, 1), seed=3, block_size=60)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        summary = train_pipeline(store, tmp_path / "m.zarr", tmp_path / "w", settings, client, progress=False)
    sizes = [c["n_rows"] for c in read_manifest(tmp_path / "m.zarr")["clusters"]]
    assert summary["rows_held"] == HELD[route] and len(_RAN) == len(sizes) > 10
    assert sizes != sorted(sizes, reverse=True)  # the partition's order is not already the answer
    assert _RAN == sorted(sizes, reverse=True)
