"""The model store's clusters (kahm_dask/pipeline/stores/model.py, docs/reliability.md §3).

A cluster is committed by renaming a complete temporary directory (arrays, attributes and the
completion marker) into place. These tests create the states an interrupted or duplicated
writer can leave — a partial temporary directory, a cluster directory without marker, a damaged
marker, two writers of the same cluster at once — and check that no reader ever sees half a
cluster (tests/pipeline/training/test_resume.py: a rerun repairs what is missing; the slow tests
in tests/system/test_interrupted_run.py do the same with real SIGKILLs).
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
import warnings

import numpy as np
import pytest
import zarr
from zarr.core.group import AsyncGroup

import kahm_dask.pipeline.stores.model as model_mod
from kahm_dask.deep import DeepKAHM
from kahm_dask.pipeline.stores.model import (
    cached_cluster,
    cluster_dir,
    cluster_done,
    dp_rows_array,
    load_cluster,
    save_cluster,
)
from kahm_dask.storage.codecs import MODEL_CHUNK_BYTES, model_chunks

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
    """The arrays are written concurrently: one failing (the third) while the others still
    write leaves nothing behind, because the error is raised only once every write has ended."""
    real = AsyncGroup.create_array
    calls = []

    async def flaky(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        await asyncio.sleep(0.05)  # the other writes finish after the failure
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(AsyncGroup, "create_array", flaky)
    with pytest.raises(OSError, match="No space left"):
        save_cluster(tmp_path, 0, 0, model, {"n_rows": 40})
    time.sleep(0.3)  # a write still running after the error would land by now
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


def test_model_cache_budget_comes_from_the_worker_memory_limit(monkeypatch):
    """An eighth of the Dask worker's memory limit; the environment variable overrides it; outside
    a worker (or without a limit) the fixed default."""
    from distributed import Client, LocalCluster

    monkeypatch.delenv("KAHM_DASK_MODEL_CACHE_MB", raising=False)
    assert model_mod.model_cache_bytes() == model_mod.MODEL_CACHE_DEFAULT_BYTES
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, memory_limit="800MiB",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        assert client.submit(model_mod.model_cache_bytes, pure=False).result() == 100 * 2**20
        monkeypatch.setenv("KAHM_DASK_MODEL_CACHE_MB", "7")
        assert client.submit(model_mod.model_cache_bytes, pure=False).result() == 7 * 2**20
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, memory_limit=0,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        monkeypatch.delenv("KAHM_DASK_MODEL_CACHE_MB")
        assert client.submit(model_mod.model_cache_bytes, pure=False).result() == model_mod.MODEL_CACHE_DEFAULT_BYTES


def test_model_cache_evicts_the_least_recently_used_beyond_its_budget(tmp_path, model, monkeypatch):
    """The cache holds at most the budget's bytes of models (at least one model), oldest use out first."""
    one = model_mod._model_bytes(model)
    monkeypatch.setattr(model_mod, "model_cache_bytes", lambda: 2 * one)
    monkeypatch.setattr(model_mod, "_CACHE", type(model_mod._CACHE)())
    paths = [save_cluster(tmp_path, 0, s, model, {"n_rows": 40}) for s in range(3)]
    cached_cluster(paths[0]), cached_cluster(paths[1])
    cached_cluster(paths[0])  # now the most recent
    cached_cluster(paths[2])
    assert [key[0] for key in model_mod._CACHE] == [str(paths[0]), str(paths[2])]
    monkeypatch.setattr(model_mod, "model_cache_bytes", lambda: 1)
    cached_cluster(paths[1])
    assert [key[0] for key in model_mod._CACHE] == [str(paths[1])]


def test_cached_centre_is_the_stored_centre_read_once_and_renewed_by_a_retrained_cluster(tmp_path, model,
                                                                                       monkeypatch):
    monkeypatch.setattr(model_mod, "_CACHE", type(model_mod._CACHE)())
    monkeypatch.setattr(model_mod, "_CENTRES", type(model_mod._CENTRES)())
    path = save_cluster(tmp_path, 0, 0, model, {"n_rows": 40})
    reads = []
    real = model_mod.cluster_centre
    monkeypatch.setattr(model_mod, "cluster_centre", lambda p: reads.append(p) or real(p))
    centre = model_mod.cached_centre(path)
    assert np.array_equal(centre, model.layers_[0].mean_) and np.array_equal(centre, real(path))
    assert np.array_equal(model_mod.cached_centre(path), centre) and len(reads) == 1  # read once
    other = DeepKAHM(3, 2).fit(RNG.random((40, 4)) + 5.0)
    shutil.rmtree(path)
    save_cluster(tmp_path, 0, 0, other, {"n_rows": 40})  # retrained at the same path: a new marker
    assert np.array_equal(model_mod.cached_centre(path), other.layers_[0].mean_) and len(reads) == 2


def test_cached_centre_comes_from_a_cached_model_without_a_read(tmp_path, model, monkeypatch):
    monkeypatch.setattr(model_mod, "_CACHE", type(model_mod._CACHE)())
    monkeypatch.setattr(model_mod, "_CENTRES", type(model_mod._CENTRES)())
    path = save_cluster(tmp_path, 0, 0, model, {"n_rows": 40})
    cached_cluster(path)
    monkeypatch.setattr(model_mod, "cluster_centre", lambda p: pytest.fail("read from the store"))
    assert np.array_equal(model_mod.cached_centre(path), model.layers_[0].mean_)


def test_centre_cache_keeps_its_share_of_the_budget(tmp_path, model, monkeypatch):
    monkeypatch.setattr(model_mod, "_CENTRES", type(model_mod._CENTRES)())
    monkeypatch.setattr(model_mod, "model_cache_bytes", lambda: 2 * model.layers_[0].mean_.nbytes
                        / model_mod.CENTRE_CACHE_SHARE)
    paths = [save_cluster(tmp_path, 0, s, model, {"n_rows": 40}) for s in range(3)]
    for path in paths:
        model_mod.cached_centre(path)
    assert [key[0] for key in model_mod._CENTRES] == [str(paths[1]), str(paths[2])]


def test_dp_rows_are_found_under_their_name_and_under_the_name_of_older_stores(tmp_path, model):
    rows = RNG.random((40, 4))
    save_cluster(tmp_path / "m.zarr", 0, 0, model, {"n_rows": 40}, rows)
    save_cluster(tmp_path / "m.zarr", 0, 1, model, {"n_rows": 40})
    group = zarr.open_group(str(cluster_dir(tmp_path / "m.zarr", 0, 0)), mode="r")
    assert "dp_rows" in group and "fabricated" not in group
    assert dp_rows_array(group)[...].tobytes() == rows.tobytes()
    assert dp_rows_array(zarr.open_group(str(cluster_dir(tmp_path / "m.zarr", 0, 1)), mode="r")) is None
    older = zarr.open_group(str(tmp_path / "older.zarr"), mode="w", zarr_format=3)
    older.create_array("fabricated", data=rows)  # the name before the noisy rows became the default
    assert dp_rows_array(older)[...].tobytes() == rows.tobytes()


def test_model_arrays_are_stored_with_zstd_level_1_and_read_back_bit_for_bit(tmp_path, model):
    """Every layer array of a cluster carries the model store's codec (zstd, level 1: as small as
    Zarr's default level 3 on model arrays, and faster to write; kahm_dask/storage/codecs.py)
    and its chunks (whole rows up to 8 MiB); the DP rows carry the rows' codec (zstd level 1
    too), and the model read back is the model written."""
    from zarr.codecs import ZstdCodec

    dp_rows = RNG.random((40, 4))
    save_cluster(tmp_path / "m", 0, 0, model, {"class": 0}, dp_rows)
    group = zarr.open_group(str(cluster_dir(tmp_path / "m", 0, 0)), mode="r")
    layers = [group[f"layer{k}"] for k in range(len(model.layers_))]
    codecs = {name: arr.metadata.codecs for layer in layers for name, arr in layer.arrays()}
    assert codecs and all(ZstdCodec(level=1) in c for c in codecs.values()), codecs
    chunks = {name: arr.chunks for layer in layers for name, arr in layer.arrays()}
    written = {name: arr for arrays, _ in model.to_state()[0] for name, arr in arrays.items()}
    assert chunks == {name: model_chunks(arr) for name, arr in written.items()}
    assert ZstdCodec(level=1) in dp_rows_array(group).metadata.codecs
    np.testing.assert_array_equal(dp_rows_array(group)[...], dp_rows)
    loaded = load_cluster(cluster_dir(tmp_path / "m", 0, 0))
    for (written, _), (read, _) in zip(model.to_state()[0], loaded.to_state()[0], strict=True):
        assert written.keys() == read.keys()
        for name in written:
            np.testing.assert_array_equal(read[name], written[name])
    assert _same_model(model, loaded, RNG.random((5, 4)))


# ---------------------------------------------------------------- the chunk rule (storage/codecs.py)


@pytest.mark.parametrize("shape", [(1000, 785), (2000, 4097), (7, 3), (1, 2**21), (784,), (20, 784), (0, 5), (3, 0)])
def test_model_chunks_are_whole_rows_within_the_cap(shape):
    """Whole rows (every axis but the first is one chunk), at least one row, and no more rows
    than fit in MODEL_CHUNK_BYTES unless a single row is larger; never more rows than exist."""
    arr = np.zeros(shape)
    chunks = model_chunks(arr)
    assert len(chunks) == arr.ndim and all(c >= 1 for c in chunks)
    assert chunks[1:] == tuple(max(1, n) for n in shape[1:])
    row_bytes = arr.itemsize * int(np.prod(shape[1:], dtype=np.int64))
    assert chunks[0] == 1 or chunks[0] * row_bytes <= MODEL_CHUNK_BYTES
    assert chunks[0] <= max(1, shape[0])
    # as many rows as the cap allows: one more would cross it (or the array ends)
    assert chunks[0] == max(1, shape[0]) or (chunks[0] + 1) * max(row_bytes, arr.itemsize) > MODEL_CHUNK_BYTES


def test_a_scalar_model_array_is_one_chunk():
    assert model_chunks(np.float64(1.0).reshape(())) == ()


def test_a_model_of_float32_rows_is_stored_at_the_data_size_and_loads_to_the_same_model(tmp_path):
    """Float32 rows give weights β of float32 values (docs/algorithm.md#weights-precision): the
    store keeps β as float32, so a cluster's arrays take about the rows' bytes (β is N × (p + 1)
    of the rows' N × p; codes, eigenvalues and the subspace add N·(n + 1) + O(n·p) float64, a few
    percent when p ≫ 2(n + 1), as in images), and the loaded model is the fitted one value for
    value. A model of float64 rows keeps float64 β."""
    rows = RNG.random((300, 256)).astype(np.float32)
    fitted = DeepKAHM(5, 1).fit(rows)
    save_cluster(tmp_path / "m", 0, 0, fitted, {"class": 0})
    group = zarr.open_group(str(cluster_dir(tmp_path / "m", 0, 0)), mode="r")
    arrays = dict(group["layer0"].arrays())
    assert arrays["beta"].dtype == np.float32
    stored = sum(arr.nbytes for arr in arrays.values())
    N, p, n = 300, 256, fitted.layers_[0].n_components_
    assert stored == 4 * N * (p + 1) + 8 * (N * (n + 1) + n * p + n + p)
    assert stored <= 1.1 * rows.nbytes
    loaded = load_cluster(cluster_dir(tmp_path / "m", 0, 0))
    assert _same_model(fitted, loaded, RNG.random((20, 256)))

    save_cluster(tmp_path / "m64", 0, 0, DeepKAHM(5, 1).fit(rows.astype(np.float64) + 1e-9), {"class": 0})
    group = zarr.open_group(str(cluster_dir(tmp_path / "m64", 0, 0)), mode="r")
    assert group["layer0"]["beta"].dtype == np.float64
