"""Atomic writes and resume, without killing processes (docs/reliability.md §3).

The model store commits a cluster by renaming a complete temporary directory (arrays,
attributes and the completion marker) into place. These tests create the states an
interrupted or duplicated writer can leave — a partial temporary directory, a cluster
directory without marker, a damaged marker, two writers of the same cluster at once — and
check that no reader ever sees half a cluster and that a rerun repairs what is missing.
The slow tests in ``test_interrupted_run.py`` do the same with real SIGKILLs.

Every other file and directory is written with :mod:`kahm_dask.storage.atomic`. Its helpers are
tested first on their own, then through each writer that uses them: a write that fails
half-way (a full disk) must leave the old file or directory intact and no temporary behind.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
import warnings
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import zarr

from kahm_dask.deep import DeepKAHM
from kahm_dask.pipeline.predict import DISTANCES, PREDICTIONS, class_distance_array, predict_to_store
from kahm_dask.pipeline.runs.report import write_privacy_statement, write_report
from kahm_dask.pipeline.stores.dataset import is_complete, mark_complete, open_dataset, write_dataset
from kahm_dask.pipeline.stores.model import cached_cluster, cluster_dir, cluster_done, load_cluster, save_cluster
from kahm_dask.pipeline.training import TrainSettings, train_pipeline
from kahm_dask.privacy.ledger import PrivacyLedger
from kahm_dask.recipe import TrainParams
from kahm_dask.storage import atomic as _atomic
from kahm_dask.storage.atomic import (
    atomic_directory,
    replace_directory,
    sibling_path,
    write_json_atomic,
    write_text_atomic,
)
from kahm_dask.storage.location import as_location
from tests._kit import interrupt_after_training

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


def _leftovers(directory: Path) -> list[str]:
    """Temporary or moved-aside files and directories in ``directory``."""
    return sorted(p.name for p in directory.iterdir() if ".tmp" in p.name or ".old-" in p.name)


class _HalfWriter:
    """A text file whose ``write`` stores half the text, then fails as on a full disk."""

    def __init__(self, fh) -> None:
        self._fh = fh

    def __enter__(self) -> _HalfWriter:
        return self

    def __exit__(self, *exc) -> None:
        self._fh.close()

    def write(self, text: str) -> int:
        self._fh.write(text[: len(text) // 2])
        self._fh.flush()
        raise OSError(errno.ENOSPC, "No space left on device")


def _fill_disk(monkeypatch) -> None:
    """From now on, every file written by :mod:`kahm_dask.storage.atomic` fails half-way."""

    def half_open(path, mode="r", **kwargs):
        fh = open(path, mode, **kwargs)
        return _HalfWriter(fh) if "w" in mode else fh

    monkeypatch.setattr(_atomic, "open", half_open, raising=False)


@pytest.fixture
def disk_full(monkeypatch) -> None:
    _fill_disk(monkeypatch)


# --------------------------------------------------------------------------- kahm_dask.storage.atomic


def test_sibling_path_is_a_hidden_unique_sibling(tmp_path):
    a, b = sibling_path(tmp_path / "x.zarr", "tmp"), sibling_path(str(tmp_path / "x.zarr"), "tmp")
    assert a.parent == tmp_path and a != b
    assert a.name.startswith(".x.zarr.tmp-") and len(a.name) == len(".x.zarr.tmp-") + 32
    assert sibling_path(tmp_path / "x", "old").name.startswith(".x.old-")


def test_write_text_atomic_creates_parents_and_replaces(tmp_path):
    path = tmp_path / "a" / "b" / "note.md"
    assert write_text_atomic(path, "ε = 1\n") == path
    assert path.read_bytes() == "ε = 1\n".encode()
    write_text_atomic(str(path), "new")
    assert path.read_text() == "new"
    assert _leftovers(path.parent) == []


def test_write_json_atomic_passes_dumps_options_and_fails_before_writing(tmp_path):
    path = write_json_atomic(tmp_path / "d.json", {"b": 1, "a": [1, 2]}, indent=2, sort_keys=True)
    assert path.read_text() == json.dumps({"a": [1, 2], "b": 1}, indent=2)
    with pytest.raises(TypeError, match="not JSON serializable"):
        write_json_atomic(path, {"x": object()})
    assert json.loads(path.read_text()) == {"a": [1, 2], "b": 1}
    assert _leftovers(tmp_path) == []


def test_write_text_atomic_failure_mid_write_keeps_the_old_file(tmp_path, disk_full):
    path = tmp_path / "note.txt"
    path.write_text("old")
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(path, "new text")
    assert path.read_text() == "old"
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(tmp_path / "fresh.txt", "new text")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["note.txt"]


def test_write_text_atomic_interrupted_before_the_rename(tmp_path, monkeypatch):
    path = tmp_path / "note.txt"
    path.write_text("old")

    def interrupt(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(_atomic.os, "fsync", interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(path, "new")
    assert path.read_text() == "old" and _leftovers(tmp_path) == []


def _make_dir(path: Path, content: str) -> Path:
    path.mkdir()
    (path / "f.txt").write_text(content)
    return path


def test_replace_directory_into_a_free_and_an_occupied_place(tmp_path):
    replace_directory(_make_dir(tmp_path / "new1", "one"), tmp_path / "target")
    assert (tmp_path / "target" / "f.txt").read_text() == "one"
    replace_directory(str(_make_dir(tmp_path / "new2", "two")), str(tmp_path / "target"))
    assert (tmp_path / "target" / "f.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]


def test_replace_directory_restores_the_old_target_if_the_move_fails(tmp_path, monkeypatch):
    _make_dir(tmp_path / "target", "old")
    new = _make_dir(tmp_path / "new", "new")
    real = os.replace

    def fails_for_new(src, dst):
        if Path(src) == new:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real(src, dst)

    monkeypatch.setattr(_atomic.os, "replace", fails_for_new)
    with pytest.raises(OSError, match="cross-device"):
        replace_directory(new, tmp_path / "target")
    assert (tmp_path / "target" / "f.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "target"]


def test_atomic_directory_commits_on_success_and_cleans_up_on_error(tmp_path):
    target = tmp_path / "sub" / "out"
    with atomic_directory(target) as tmp:
        assert tmp.parent == target.parent and not tmp.exists()
        _make_dir(tmp, "first")
    assert (target / "f.txt").read_text() == "first"
    for error in (RuntimeError("failed"), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            with atomic_directory(target) as tmp:
                _make_dir(tmp, "second")
                raise error
        assert (target / "f.txt").read_text() == "first"
        assert sorted(p.name for p in target.parent.iterdir()) == ["out"]


# --------------------------------------------------------------------------- each writer


def test_report_failure_mid_write_keeps_the_old_report(tmp_path, monkeypatch):
    write_report(tmp_path, {"name": "a", "accuracy": 0.5}, plots=False)
    statement = write_privacy_statement(tmp_path / "public", "# Privacy\n\nε = 1\n")
    before = {p.name: p.read_bytes() for p in (tmp_path / "report.json", tmp_path / "report.md", statement)}
    assert json.loads(before["report.json"]) == {"name": "a", "accuracy": 0.5}
    assert "ε = 1" in statement.read_text(encoding="utf-8")
    _fill_disk(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        write_report(tmp_path, {"name": "b", "accuracy": 0.9}, plots=False)
    with pytest.raises(OSError, match="No space left"):
        write_privacy_statement(tmp_path / "public", "# Privacy\n\nε = 2\n")
    after = {p.name: p.read_bytes() for p in (tmp_path / "report.json", tmp_path / "report.md", statement)}
    assert after == before
    assert _leftovers(tmp_path) == [] and _leftovers(tmp_path / "public") == []


def test_ledger_failure_mid_write_keeps_the_old_ledger(tmp_path, monkeypatch):
    path = tmp_path / "ledgers" / "s.json"
    PrivacyLedger(path, budget=(5.0, 0.0)).spend(1.0, 0.0, release_id="a", what="rows")
    before = path.read_bytes()
    _fill_disk(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        PrivacyLedger(path).spend(2.0, 0.0, release_id="b", what="rows")
    assert path.read_bytes() == before
    assert PrivacyLedger(path).spent() == (1.0, 0.0) and PrivacyLedger(path).budget == (5.0, 0.0)
    assert _leftovers(path.parent) == []


def test_train_seed_and_settings_failure_mid_write_keep_the_old_files(tmp_path, monkeypatch):
    from kahm_dask.pipeline.training import work as work_mod

    work, model = tmp_path / "w", tmp_path / "m.zarr"
    work.mkdir()
    seed = work_mod.kmeans_seed(None, work)
    assert work_mod.kmeans_seed(None, work) == seed  # kept in the work store
    models = (as_location(work / "model.zarr"), as_location(model))
    work_mod.check_same_settings(models, as_location(work), {"seed": seed, "clusters": []})
    seed_file, settings_file = work / work_mod.SEED_FILE, work / "settings.json"
    assert json.loads(settings_file.read_text()) == {"seed": seed, "clusters": []}
    seed_file.write_text("{")  # damaged: the next run draws and writes a new seed
    _fill_disk(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        work_mod.kmeans_seed(None, work)
    with pytest.raises(OSError, match="No space left"):
        work_mod.check_same_settings(models, as_location(work), {"seed": seed + 1, "clusters": []})
    assert seed_file.read_text() == "{"
    assert json.loads(settings_file.read_text()) == {"seed": seed, "clusters": []}
    assert _leftovers(work) == []


def test_completion_marker_failure_mid_write_keeps_the_old_marker(tmp_path, monkeypatch):
    mark_complete(tmp_path, {"noise_id": "a"})
    _fill_disk(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        mark_complete(tmp_path, {"noise_id": "b"})
    assert is_complete(tmp_path) == {"noise_id": "a"}
    assert _leftovers(tmp_path) == []


def test_dataset_store_failure_mid_write_keeps_the_old_store(tmp_path, monkeypatch):
    X = RNG.random((30, 3))
    y = np.arange(30) % 2
    write_dataset(tmp_path / "s.zarr", X, y, chunk_rows=10)
    real = zarr.Group.create_array

    def fails_on_class_index(self, name, *args, **kwargs):
        if name == "1":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(zarr.Group, "create_array", fails_on_class_index)
    with pytest.raises(OSError, match="No space left"):
        write_dataset(tmp_path / "s.zarr", X[:20] + 1, y[:20], overwrite=True)
    with pytest.raises(OSError, match="No space left"):
        write_dataset(tmp_path / "t.zarr", X, y)
    store = open_dataset(tmp_path / "s.zarr")
    np.testing.assert_array_equal(store.X().compute(), X)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]


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
    staged = interrupt_after_training(tmp_path / "m.zarr", tmp_path / "w")  # before the commit
    clusters = staged / "clusters"
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

        def fails_on_the_last_block(x, path, *args):
            if x.shape[0] and np.array_equal(x[-1], X[-1]):
                raise MemoryError("worker ran out of memory")
            return real(x, path, *args)

        monkeypatch.setattr(predict_mod, "_cluster_block", fails_on_the_last_block)
        with pytest.raises(MemoryError):
            predict_to_store(tmp_path / "m.zarr", Xd, tmp_path / "p.zarr", client)
    group = zarr.open_group(str(tmp_path / "p.zarr"), mode="r")
    assert "classes" in group.attrs  # a complete result, not a partial one
    np.testing.assert_array_equal(group[PREDICTIONS][:], before)
    assert np.isfinite(group[DISTANCES][:]).all()
    assert _leftovers(tmp_path) == []  # the partial predictions were removed
