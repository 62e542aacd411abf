"""Atomic writes and resume, without killing processes (docs/reliability.md §3).

The model store commits a cluster by renaming a complete temporary directory (arrays,
attributes and the completion marker) into place. These tests create the states an
interrupted or duplicated writer can leave — a partial temporary directory, a cluster
directory without marker, a damaged marker, two writers of the same cluster at once — and
check that no reader ever sees half a cluster and that a rerun repairs what is missing.
The slow tests in ``test_interrupted_run.py`` do the same with real SIGKILLs.
"""

from __future__ import annotations

import shutil
import threading
import warnings

import dask.array as da
import numpy as np
import pytest
import zarr

from kahm_dask.deep import DeepKAHM
from kahm_dask.pipeline.modelstore import (
    cached_cluster,
    cluster_dir,
    cluster_done,
    load_cluster,
    save_cluster,
)
from kahm_dask.pipeline.predict import DISTANCES, PREDICTIONS, class_distance_array, predict_to_store
from kahm_dask.pipeline.store import write_dataset
from kahm_dask.pipeline.tasks import TrainParams
from kahm_dask.pipeline.train import TrainSettings, train_pipeline

RNG = np.random.default_rng(5)


@pytest.fixture(scope="module")
def model() -> DeepKAHM:
    return DeepKAHM(3, 2).fit(RNG.random((40, 4)))


@pytest.fixture(autouse=True)
def _quiet_zarr():
    with warnings.catch_warnings():  # listing a group that holds _COMPLETE.json warns
        warnings.filterwarnings("ignore", message=".*not recognized as a component of a Zarr hierarchy")
        yield


def _same_model(a: DeepKAHM, b: DeepKAHM, Q: np.ndarray) -> bool:
    return np.array_equal(a.distance(Q), b.distance(Q))


def test_concurrent_writers_of_one_cluster_never_expose_a_partial_or_missing_cluster(tmp_path, model):
    """Two executions of one task (a worker presumed dead but still running, or a leftover
    worker of a killed run) write the same cluster while a reader loads it."""
    first_complete, stop = threading.Event(), threading.Event()
    write_errors, read_errors = [], []
    Q = RNG.random((5, 4))

    def writer():
        for _ in range(15):
            try:
                save_cluster(tmp_path, 0, 0, model, {"n_rows": 40}, RNG.random((40, 4)))
                first_complete.set()
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                write_errors.append(repr(exc))

    def reader():
        first_complete.wait(30)
        while not stop.is_set():
            try:
                assert _same_model(load_cluster(cluster_dir(tmp_path, 0, 0)), model, Q)
            except Exception as exc:  # noqa: BLE001
                read_errors.append(repr(exc))

    threads = [threading.Thread(target=writer) for _ in range(3)]
    r = threading.Thread(target=reader)
    r.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    r.join()
    assert write_errors == [] and read_errors == []
    assert [p.name for p in (tmp_path / "clusters").iterdir()] == ["c0_s0"]  # no temporary left


def test_a_complete_cluster_is_never_replaced(tmp_path, model):
    first = save_cluster(tmp_path, 0, 0, model, {"n_rows": 40, "run": 1})
    other = DeepKAHM(2, 1).fit(RNG.random((30, 4)))
    save_cluster(tmp_path, 0, 0, other, {"n_rows": 30, "run": 2})  # a duplicate execution
    assert cluster_done(tmp_path, 0, 0)["run"] == 1
    assert _same_model(load_cluster(first), model, RNG.random((5, 4)))


def test_failure_while_writing_leaves_no_cluster_and_no_temporary(tmp_path, model, monkeypatch):
    real = zarr.Group.create_array
    calls = []

    def flaky(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(zarr.Group, "create_array", flaky)
    with pytest.raises(OSError, match="No space left"):
        save_cluster(tmp_path, 0, 0, model, {"n_rows": 40})
    assert list((tmp_path / "clusters").iterdir()) == []
    assert cluster_done(tmp_path, 0, 0) is None


def test_incomplete_cluster_directory_is_unreadable_and_replaced(tmp_path, model):
    """A cluster directory without marker (a writer of an older version killed between its
    rename and its marker, or a partial copy) is never read and is replaced on resume."""
    done = save_cluster(tmp_path, 0, 0, model, {"n_rows": 40})
    (done / "_COMPLETE.json").unlink()
    shutil.rmtree(done / "layer1")  # and half of it is missing
    assert cluster_done(tmp_path, 0, 0) is None
    with pytest.raises(FileNotFoundError, match="missing or incomplete"):
        load_cluster(done)
    with pytest.raises(FileNotFoundError, match="missing or incomplete"):
        cached_cluster(str(done))
    save_cluster(tmp_path, 0, 0, model, {"n_rows": 40})
    assert _same_model(load_cluster(done), model, RNG.random((5, 4)))
    assert sorted(p.name for p in (tmp_path / "clusters").iterdir()) == ["c0_s0"]


def test_damaged_marker_counts_as_incomplete(tmp_path, model):
    done = save_cluster(tmp_path, 0, 0, model, {"n_rows": 40})
    (done / "_COMPLETE.json").write_text('{"n_rows": 4')  # truncated
    assert cluster_done(tmp_path, 0, 0) is None  # → the task retrains it instead of crashing
    save_cluster(tmp_path, 0, 0, model, {"n_rows": 40})
    assert cluster_done(tmp_path, 0, 0) == {"n_rows": 40}


# --------------------------------------------------------------------------- through the pipeline


@pytest.fixture
def small(tmp_path):
    from kahm_dask.datasets import make_class_blobs

    X, y = make_class_blobs(240, 6, 3, random_state=1)
    store = write_dataset(tmp_path / "s.zarr", X, y, chunk_rows=50)
    labels = np.zeros(len(y), dtype=np.int64)
    for c in range(3):  # two clusters per class, given (no k-means: fast)
        rows = np.flatnonzero(y == c)
        labels[rows[len(rows) // 2 :]] = 1
    return store, labels, X


def _train(store, labels, tmp_path, **params):
    settings = TrainSettings(TrainParams(**{"n_components": 4, "n_layers": 2, "epsilon": 2.0,
                                            "r_source": "passes", "r_value": 3, **params}), seed=4)
    return train_pipeline(store, tmp_path / "m.zarr", tmp_path / "w", settings, partition=labels,
                          progress=False)


def _distances(model_path, X):
    return class_distance_array(model_path, da.from_array(X, chunks=(60, X.shape[1]))).compute(scheduler="threads")


def test_rerun_repairs_every_kind_of_damage_and_gives_the_same_model(tmp_path, small):
    store, labels, X = small
    first = _train(store, labels, tmp_path)
    reference = _distances(tmp_path / "m.zarr", X)
    clusters = tmp_path / "m.zarr" / "clusters"
    shutil.rmtree(clusters / "c0_s1")  # lost
    (clusters / "c1_s0" / "_COMPLETE.json").unlink()  # renamed, not marked (older writer)
    (clusters / "c2_s1" / "_COMPLETE.json").write_text("{")  # damaged marker
    partial = clusters / ".c2_s0.tmp-0123456789abcdef"  # a writer killed mid-write
    shutil.copytree(clusters / "c2_s0", partial)
    shutil.rmtree(partial / "layer1")

    second = _train(store, labels, tmp_path)
    assert second["n_resumed"] == first["n_clusters"] - 3
    np.testing.assert_array_equal(_distances(tmp_path / "m.zarr", X), reference)


def test_cached_cluster_reloads_a_cluster_retrained_at_the_same_path(tmp_path, small):
    """A long-lived worker keeps loaded clusters in a per-process cache; retraining a model
    into the same path must not serve the old clusters."""
    store, labels, X = small
    _train(store, labels, tmp_path)
    old = _distances(tmp_path / "m.zarr", X)  # fills this process's cache
    shutil.rmtree(tmp_path / "m.zarr")
    shutil.rmtree(tmp_path / "w")
    _train(store, labels, tmp_path, n_layers=3)  # another model, same paths
    new = _distances(tmp_path / "m.zarr", X)
    fresh = np.stack([
        np.min([load_cluster(cluster_dir(tmp_path / "m.zarr", c, s)).distance(X) for s in (0, 1)], axis=0)
        for c in range(3)
    ], axis=1)
    assert not np.array_equal(new, old)
    np.testing.assert_array_equal(new, fresh)


def test_rerun_with_other_settings_does_not_mix_models(tmp_path, small):
    store, labels, X = small
    _train(store, labels, tmp_path, n_layers=2)
    try:
        summary = _train(store, labels, tmp_path, n_layers=3)
    except ValueError as exc:
        assert "other settings" in str(exc)
        return
    assert summary["n_resumed"] == 0
    for d in (tmp_path / "m.zarr" / "clusters").iterdir():
        assert len(load_cluster(d).layers_) == 3


def test_failed_prediction_keeps_the_previous_predictions(tmp_path, small, monkeypatch):
    from distributed import Client, LocalCluster

    from kahm_dask.pipeline import predict as predict_mod

    store, labels, X = small
    _train(store, labels, tmp_path)
    Xd = da.from_array(X, chunks=(60, X.shape[1]))
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, Client(cluster) as client:
        before = predict_to_store(tmp_path / "m.zarr", Xd, tmp_path / "p.zarr", client)[PREDICTIONS][:]
        real = predict_mod._cluster_block

        def fails_on_the_last_block(x, path):
            if x.shape[0] and np.array_equal(x[-1], X[-1]):
                raise MemoryError("worker ran out of memory")
            return real(x, path)

        monkeypatch.setattr(predict_mod, "_cluster_block", fails_on_the_last_block)
        with pytest.raises(MemoryError):
            predict_to_store(tmp_path / "m.zarr", Xd, tmp_path / "p.zarr", client)
    group = zarr.open_group(str(tmp_path / "p.zarr"), mode="r")
    assert "classes" in group.attrs  # a complete result, not a partial one
    np.testing.assert_array_equal(group[PREDICTIONS][:], before)
    assert np.isfinite(group[DISTANCES][:]).all()
