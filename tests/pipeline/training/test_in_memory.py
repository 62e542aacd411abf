"""Stages 2–4 in worker memory (kahm_dask/pipeline/training/in_memory.py): for rows that fit, the
run builds each class's and each cluster's rows in memory instead of two copies in the work
store, and gives the same model store as the Zarr route bit for bit."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from kahm_dask.datasets import make_class_blobs
from kahm_dask.pipeline.cluster import connect
from kahm_dask.pipeline.config import ClusterConfig
from kahm_dask.pipeline.stores.dataset import write_dataset
from kahm_dask.pipeline.training import TrainSettings, train_pipeline
from kahm_dask.pipeline.training import train as train_mod
from kahm_dask.pipeline.training.in_memory import cluster_class, fits_in_memory
from kahm_dask.pipeline.training.layout import class_layout
from kahm_dask.pipeline.training.partition import IN_TASK_FACTOR
from kahm_dask.pipeline.training.tasks import GROUPED_X, GROUPED_X_NOISY
from kahm_dask.recipe import TrainParams
from tests._kit import assert_same_fingerprint, run_fingerprint

COPIES = ("X_by_class", "X_noisy_by_class", GROUPED_X, GROUPED_X_NOISY)


@pytest.fixture(scope="module")
def blobs():
    X, y = make_class_blobs(900, 7, 3, random_state=8)
    return X, y


def _both_routes(tmp_path, monkeypatch, store, settings, client=None, **kw):
    """Train on the memory route, then on the Zarr route; returns both summaries and fingerprints."""
    out = []
    for route in ("memory", "zarr"):
        if route == "zarr":
            monkeypatch.setattr(train_mod, "fits_in_memory", lambda *a, **k: False)
        summary = train_pipeline(store, tmp_path / f"{route}.zarr", tmp_path / f"{route}.work", settings, client,
                                 progress=False, **kw)
        fp = run_fingerprint(tmp_path / f"{route}.zarr")
        if settings.params.private:
            fp["manifest"]["kahm_dask_model"]["privacy"].pop("release_id")  # random per release
        out.append((summary, fp))
    return out


@pytest.mark.filterwarnings("ignore::kahm_dask.privacy.randomness.PrivacyLeakWarning")
@pytest.mark.parametrize("case", ["non-private", "dp noisy", "dp fabricated, private r, original clusters",
                                  "float32 rows, capped clusters"])
def test_memory_route_gives_the_zarr_routes_model_bit_for_bit(tmp_path, monkeypatch, blobs, case):
    X, y = blobs
    dtype = np.float32 if "float32" in case else np.float64
    store = write_dataset(tmp_path / "s.zarr", X.astype(dtype), y, chunk_rows=128)
    params = {
        "non-private": TrainParams(5, 2),
        "dp noisy": TrainParams(5, 2, epsilon=2.0),
        "dp fabricated, private r, original clusters": TrainParams(5, 2, epsilon=2.0, dp_data="fabricated",
                                                                   r_source="private"),
        "float32 rows, capped clusters": TrainParams(5, 1),
    }[case]
    settings = TrainSettings(params, seed=3, block_size=100, bounds=(X.min(), X.max()),
                             cluster_on="original" if "original" in case else "noisy",
                             max_cluster_rows=60 if "capped" in case else None,
                             insecure_noise_seed=11 if params.private else None)
    (memory, a), (zarr_route, b) = _both_routes(tmp_path, monkeypatch, store, settings)
    assert memory["rows_held"] == "worker memory" and zarr_route["rows_held"] == "work store copies"
    assert memory["n_clusters"] > 3  # k-means ran: several clusters per class
    assert_same_fingerprint(a, b)
    assert not any((tmp_path / "memory.work" / name).exists() for name in COPIES)
    assert any((tmp_path / "zarr.work" / name).exists() for name in COPIES)


def test_memory_route_on_worker_processes_gives_the_same_model(tmp_path, monkeypatch, blobs):
    """The class results live in the workers that computed them; the cluster tasks get their rows
    from there (2 processes)."""
    X, y = blobs
    store = write_dataset(tmp_path / "s.zarr", X, y, chunk_rows=100)
    settings = TrainSettings(TrainParams(5, 2), seed=3, block_size=100)
    with connect(ClusterConfig(n_workers=2, threads_per_worker=1, processes=True)) as client:
        (memory, a), (_, b) = _both_routes(tmp_path, monkeypatch, store, settings, client)
    assert memory["rows_held"] == "worker memory"
    assert_same_fingerprint(a, b)


def test_a_caller_partition_is_used_as_given_on_the_memory_route(tmp_path, monkeypatch, blobs):
    X, y = blobs
    store = write_dataset(tmp_path / "s.zarr", X, y, chunk_rows=100)
    labels = (np.arange(len(y)) % 4).astype(np.int64)  # no k-means would give this
    settings = TrainSettings(TrainParams(5, 1), seed=3, block_size=100, max_cluster_rows=10)  # not applied to it
    (memory, a), (_, b) = _both_routes(tmp_path, monkeypatch, store, settings, partition=labels)
    assert_same_fingerprint(a, b)
    counts = {(int(c), int(s)): int(n) for (c, s), n in zip(*np.unique(np.c_[y, labels], axis=0, return_counts=True),
                                                            strict=True)}
    assert {(i["class"], i["cluster"]): i["n_rows"] for i in memory["clusters"]} == counts


def test_fits_in_memory_needs_every_class_in_one_task_and_all_rows_within_the_budget():
    y = np.repeat([0, 1, 2], [50, 30, 20])
    layout = class_layout(y)
    X = da.zeros((100, 4), chunks=(25, 4))  # float64: 3200 bytes, the largest class 1600
    task = IN_TASK_FACTOR * 50 * 8 * 4
    assert fits_in_memory({"X": X}, layout, task_bytes=task, persist_bytes=3200)
    assert not fits_in_memory({"X": X}, layout, task_bytes=task - 1, persist_bytes=3200)  # class 0 too large
    assert not fits_in_memory({"X": X}, layout, task_bytes=task, persist_bytes=3199)
    assert not fits_in_memory({"X": X, "X_noisy": X}, layout, task_bytes=task, persist_bytes=3200)  # both sources
    assert not fits_in_memory({"X": X}, layout, task_bytes=task, persist_bytes=0)
    # stored float32 rows are held as they are stored, and cast for the k-means
    assert fits_in_memory({"X": X.astype(np.float32)}, layout, task_bytes=task, persist_bytes=1600)


def test_cluster_class_splits_every_source_by_cluster_in_row_order():
    rng = np.random.default_rng(0)
    X, noisy = rng.random((40, 3)), rng.random((40, 3))
    pieces = {"X": [X[:15], X[15:]], "X_noisy": [noisy[:15], noisy[15:]]}
    given = np.tile([1, 0, 2, 2], 10)
    out = cluster_class(pieces, "X", 5, 2, np.random.SeedSequence(1), 1, None, 3, given=given)
    np.testing.assert_array_equal(out.labels, given)  # caller labels: not capped at 3 rows
    assert sorted(out.rows) == [0, 1, 2]
    for s in (0, 1, 2):
        np.testing.assert_array_equal(out.rows[s]["X"], X[given == s])
        np.testing.assert_array_equal(out.rows[s]["X_noisy"], noisy[given == s])
    capped = cluster_class(pieces, "X", 1, 2, np.random.SeedSequence(1), 1, None, 12)  # S = 1: one cluster, capped
    assert max(len(r["X"]) for r in capped.rows.values()) <= 12
    np.testing.assert_array_equal(np.concatenate([capped.rows[s]["X"] for s in sorted(capped.rows)]),
                                  np.concatenate([X[capped.labels == s] for s in sorted(capped.rows)]))
