"""The model store's clusters (kahm_dask/pipeline/stores/model.py, docs/reliability.md §3).

A cluster is committed by renaming a complete temporary directory (arrays, attributes and the
completion marker) into place. These tests create the states an interrupted or duplicated
writer can leave — a partial temporary directory, a cluster directory without marker, a damaged
marker, two writers of the same cluster at once — and check that no reader ever sees half a
cluster (tests/pipeline/training/test_resume.py: a rerun repairs what is missing; the slow tests
in tests/system/test_interrupted_run.py do the same with real SIGKILLs).
"""

from __future__ import annotations

import shutil
import threading
import warnings

import numpy as np
import pytest
import zarr

from kahm_dask.deep import DeepKAHM
from kahm_dask.pipeline.stores.model import cached_cluster, cluster_dir, cluster_done, load_cluster, save_cluster

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
