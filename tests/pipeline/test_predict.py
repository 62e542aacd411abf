"""Prediction (kahm_dask/pipeline/predict.py): class distances as a reduction over the clusters'
distances, routed as the estimator routes, written atomically, checked input; and concurrent
prediction requests against one trained model (docs/reliability.md §6).

* no model is loaded in the client while the graph is built; ``n_probe`` routes as the estimator;
* bad input (the feature count, NaN rows) is refused naming it; no client: the threads;
* a prediction that fails mid-way keeps the previous predictions whole and leaves no partial
  copy, also when another chunk is still being written as it fails (the race that once left a
  ``.p.zarr.tmp-…``: the partial copy was deleted while that write ran, and the write recreated it);
* fast: four concurrent requests with different inputs, and two models at once, on one
  client each get their own results (task keys depend on the input and the model store);
* slow: eight concurrent requests on a 2-worker LocalCluster (1 GiB per worker) finish with
  results bit-identical to an in-process reference, no worker is lost, memory stays bounded;
  the throughput of sequential and concurrent serving is printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import dask.array as da
import numpy as np
import psutil
import pytest
import zarr
from distributed import Client, LocalCluster

from kahm_dask.datasets import make_class_blobs
from kahm_dask.pipeline.cluster import connect
from kahm_dask.pipeline.config import ClusterConfig
from kahm_dask.pipeline.predict import DISTANCES, PREDICTIONS, class_distance_array, predict_to_store
from kahm_dask.pipeline.stores.dataset import open_dataset, write_dataset
from kahm_dask.pipeline.stores.synthetic import synthetic_blobs
from kahm_dask.pipeline.training import TrainSettings, train_pipeline
from kahm_dask.recipe import TrainParams
from tests._kit import BAD_INPUT_X as X_SMALL
from tests._kit import leftovers, small_training, train_small, write_small_stores
from tests._kit import with_entry as _with

# --------------------------------------------------------------------------- the prediction graph


def test_building_the_prediction_graph_loads_no_model(tmp_path, digits, monkeypatch):
    """Models are loaded by the tasks, on the workers: building the graph in the client
    must not load any (dask infers a map_blocks meta by calling the function unless given)."""
    import kahm_dask.pipeline.predict as predict_mod

    labels = np.zeros(len(digits.y_train), dtype=np.int64)  # block_size 300: one cluster per class
    store = write_dataset(tmp_path / "train.zarr", digits.X_train, digits.y_train, chunk_rows=300)
    settings = TrainSettings(TrainParams(10, 2), seed=3, block_size=300)
    train_pipeline(store, tmp_path / "m.zarr", tmp_path / "w", settings, partition=labels, progress=False)
    loads = []
    real = predict_mod.cached_cluster
    monkeypatch.setattr(predict_mod, "cached_cluster", lambda path: loads.append(path) or real(path))
    D = predict_mod.class_distance_array(tmp_path / "m.zarr", da.from_array(digits.X_test, chunks=(200, -1)))
    assert loads == []
    assert D.compute(scheduler="synchronous").shape == (digits.X_test.shape[0], 10) and loads


def test_pipeline_routing_matches_the_estimator_rule(tmp_path):
    from kahm_dask.pipeline.stores.manifest import read_manifest

    X, y = make_class_blobs(3000, 8, 3, random_state=0)
    store = write_dataset(tmp_path / "t.zarr", X[:2500], y[:2500], chunk_rows=500)
    train_pipeline(store, tmp_path / "m.zarr", tmp_path / "w", TrainSettings(TrainParams(5, 2), seed=1,
                   block_size=300), progress=False)
    n_clusters = max(sum(e["class"] == c for e in read_manifest(tmp_path / "m.zarr")["clusters"]) for c in range(3))
    Q = da.from_array(X[2500:], chunks=200)
    D = class_distance_array(tmp_path / "m.zarr", Q).compute()
    assert class_distance_array(tmp_path / "m.zarr", Q, n_probe=n_clusters).compute().tobytes() == D.tobytes()
    routed = class_distance_array(tmp_path / "m.zarr", Q, n_probe=1)
    assert isinstance(routed, da.Array)
    R = routed.compute()
    assert np.all(R >= D * (1 - 1e-12)) and np.mean(R.argmin(1) == D.argmin(1)) > 0.9


# --------------------------------------------------------------------------- bad input


@pytest.fixture
def stores(tmp_path):
    """The stores of tests._kit.write_small_stores in tmp_path: s.zarr, s4.zarr, s1.zarr."""
    return write_small_stores(tmp_path)


def test_pipeline_predict_feature_count_mismatch(stores):
    train_pipeline(open_dataset(stores / "s.zarr"), stores / "m.zarr", stores / "w",
                   TrainSettings(TrainParams(3, 2), seed=0), progress=False)
    with pytest.raises(ValueError, match=r"X has shape \(40, 4\); the model expects \(m, 5\)"):
        class_distance_array(stores / "m.zarr", da.from_array(X_SMALL[:, :4]))
    with pytest.raises(ValueError, match=r"X has shape \(5,\)"):
        class_distance_array(stores / "m.zarr", da.from_array(X_SMALL[0]))


def test_predict_rejects_nan_rows(stores):
    from distributed import Client, LocalCluster

    train_pipeline(open_dataset(stores / "s.zarr"), stores / "m.zarr", stores / "w",
                   TrainSettings(TrainParams(3, 2), seed=0), progress=False)
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, Client(cluster) as client:
        with pytest.raises(ValueError, match=r"non-finite value at row 3, column 2"):
            predict_to_store(stores / "m.zarr", da.from_array(_with(np.nan), chunks=(20, 5)),
                             stores / "p.zarr", client)


def test_predict_without_a_client(stores):
    train_pipeline(open_dataset(stores / "s.zarr"), stores / "m.zarr", stores / "w",
                   TrainSettings(TrainParams(3, 2), seed=0), progress=False)
    group = predict_to_store(stores / "m.zarr", da.from_array(X_SMALL, chunks=(20, 5)), stores / "p.zarr")
    assert group[PREDICTIONS].shape == (40,) and group[DISTANCES].shape == (40, 2)


# --------------------------------------------------------------------------- atomic predictions


def test_failed_prediction_keeps_the_previous_predictions(tmp_path, monkeypatch):
    store, labels, X = small_training(tmp_path)
    train_small(store, labels, tmp_path)
    Xd = da.from_array(X, chunks=(60, X.shape[1]))
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, Client(cluster) as client:
        before = predict_to_store(tmp_path / "m.zarr", Xd, tmp_path / "p.zarr", client)[PREDICTIONS][:]
        real = zarr.storage.LocalStore.set
        first_chunk_started = threading.Event()

        async def racing_writes(store, key, value):
            """Chunk 0 of the predictions is still being written when chunk 3's write fails."""
            if key == f"{PREDICTIONS}/c/0":
                first_chunk_started.set()
                await asyncio.sleep(0.5)
            elif key == f"{PREDICTIONS}/c/3":
                for _ in range(500):  # at most 5 s
                    if first_chunk_started.is_set():
                        break
                    await asyncio.sleep(0.01)
                raise MemoryError("worker ran out of memory")
            return await real(store, key, value)

        monkeypatch.setattr(zarr.storage.LocalStore, "set", racing_writes)
        with pytest.raises(MemoryError):
            predict_to_store(tmp_path / "m.zarr", Xd, tmp_path / "p.zarr", client)
        assert first_chunk_started.is_set()
        time.sleep(1.0)  # the client lives on (a served model): a write still running would land now
    group = zarr.open_group(str(tmp_path / "p.zarr"), mode="r")
    assert "classes" in group.attrs  # a complete result, not a partial one
    np.testing.assert_array_equal(group[PREDICTIONS][:], before)
    assert np.isfinite(group[DISTANCES][:]).all()
    assert leftovers(tmp_path) == []  # the partial predictions were removed


# --------------------------------------------------------------------------- concurrent requests


def _reference(model, X, chunk):
    return class_distance_array(model, da.from_array(X, chunks=(chunk, X.shape[1]))).compute(scheduler="threads")


def _request(client, model, X, out, chunk):
    t0 = time.perf_counter()
    group = predict_to_store(model, da.from_array(X, chunks=(chunk, X.shape[1])), out, client)
    return group[DISTANCES][:], group[PREDICTIONS][:], time.perf_counter() - t0


def test_concurrent_requests_get_their_own_results(tmp_path):
    X, y = make_class_blobs(300, 6, 3, random_state=3)
    store = write_dataset(tmp_path / "s.zarr", X, y, chunk_rows=100)
    models = []
    for seed, n_layers in ((1, 2), (2, 3)):  # two models with the same cluster layout
        m = tmp_path / f"m{seed}.zarr"
        train_pipeline(store, m, tmp_path / f"w{seed}", TrainSettings(TrainParams(4, n_layers), seed=seed),
                       progress=False)
        models.append(m)
    rng = np.random.default_rng(0)
    jobs = [(models[i % 2], rng.random((200, 6))) for i in range(4)]
    refs = [_reference(m, x, 50) for m, x in jobs]
    barrier = threading.Barrier(len(jobs))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        def go(i):
            barrier.wait()
            return _request(client, jobs[i][0], jobs[i][1], tmp_path / f"p{i}.zarr", 50)

        with ThreadPoolExecutor(len(jobs)) as pool:
            results = list(pool.map(go, range(len(jobs))))
    for (D, pred, _), ref in zip(results, refs, strict=True):
        assert D.tobytes() == ref.tobytes()
        np.testing.assert_array_equal(pred, ref.argmin(axis=1))


class MemorySampler:
    """Peak RSS of a set of processes, sampled every ``interval`` seconds in a thread."""

    def __init__(self, pids: dict[str, int], interval: float = 0.05):
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.peak = {name: p.memory_info().rss for name, p in self.procs.items()}
        self.start_rss = dict(self.peak)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.interval = interval

    def _run(self):
        while not self._stop.is_set():
            for name, p in self.procs.items():
                try:
                    self.peak[name] = max(self.peak[name], p.memory_info().rss)
                except psutil.NoSuchProcess:
                    pass
            time.sleep(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@pytest.mark.slow
def test_eight_concurrent_prediction_requests(tmp_path, baseline_run):
    model = baseline_run / "public" / "model.zarr"
    n_requests, n_rows, chunk = 8, 2000, 500
    inputs = [synthetic_blobs(n_rows, 16, 10, seed=200 + i, chunk_rows=n_rows)[0].compute() for i in range(n_requests)]
    refs = [_reference(model, x, chunk) for x in inputs]
    limit = 2**30
    with connect(ClusterConfig(n_workers=2, threads_per_worker=1, memory_limit="1GiB")) as client:
        worker_pids = client.run(os.getpid)
        _request(client, model, inputs[0][:chunk], tmp_path / "warm.zarr", chunk)  # load the models once

        t0 = time.perf_counter()  # one request at a time, for comparison (first half of them)
        sequential = [_request(client, model, x, tmp_path / f"s{i}.zarr", chunk)[2]
                      for i, x in enumerate(inputs[: n_requests // 2])]
        t_seq = time.perf_counter() - t0

        pids = {"client": os.getpid(), **{f"worker {i}": pid for i, pid in enumerate(worker_pids.values())}}
        barrier = threading.Barrier(n_requests)

        def go(i):
            barrier.wait()
            return _request(client, model, inputs[i], tmp_path / f"c{i}.zarr", chunk)

        with MemorySampler(pids) as mem:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(n_requests) as pool:
                results = list(pool.map(go, range(n_requests)))
            t_conc = time.perf_counter() - t0
        workers_after = client.run(os.getpid)

    for (D, pred, _), ref in zip(results, refs, strict=True):
        assert D.tobytes() == ref.tobytes()
        np.testing.assert_array_equal(pred, ref.argmin(axis=1))
    assert workers_after == worker_pids, "a worker was lost or restarted (memory limit?)"
    latencies = sorted(r[2] for r in results)
    report = {
        "requests": n_requests,
        "rows_per_request": n_rows,
        "model_clusters": len(os.listdir(model / "clusters")),
        "workers": "2 processes × 1 thread, 1 GiB each",
        "sequential_requests": len(sequential),
        "sequential_seconds": round(t_seq, 2),
        "sequential_rows_per_s": round(len(sequential) * n_rows / t_seq),
        "concurrent_seconds": round(t_conc, 2),
        "concurrent_rows_per_s": round(n_requests * n_rows / t_conc),
        "concurrent_latency_s": {"min": round(latencies[0], 2), "median": round(float(np.median(latencies)), 2),
                                 "max": round(latencies[-1], 2)},
        "sequential_latency_s_median": round(float(np.median(sequential)), 2),
        "peak_rss_mib": {k: round(v / 2**20) for k, v in mem.peak.items()},
        "rss_growth_mib": {k: round((mem.peak[k] - mem.start_rss[k]) / 2**20) for k in mem.peak},
    }
    print("\nload test:", json.dumps(report, indent=2))
    (tmp_path / "load.json").write_text(json.dumps(report, indent=2))
    for name, peak in mem.peak.items():
        if name.startswith("worker"):
            assert peak < limit, f"{name} peaked at {peak / 2**20:.0f} MiB"
    assert mem.peak["client"] - mem.start_rss["client"] < 512 * 2**20
