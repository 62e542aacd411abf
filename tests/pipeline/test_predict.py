"""Concurrent prediction requests against one trained model (docs/reliability.md §6).

* fast: four concurrent requests with different inputs, and two models at once, on one
  client each get their own results (task keys depend on the input and the model store);
* slow: eight concurrent requests on a 2-worker LocalCluster (1 GiB per worker) finish with
  results bit-identical to an in-process reference, no worker is lost, memory stays bounded;
  the throughput of sequential and concurrent serving is printed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import dask.array as da
import numpy as np
import psutil
import pytest
from distributed import Client, LocalCluster

from kahm_dask.datasets import make_class_blobs
from kahm_dask.pipeline.cluster import connect
from kahm_dask.pipeline.config import ClusterConfig
from kahm_dask.pipeline.predict import DISTANCES, PREDICTIONS, class_distance_array, predict_to_store
from kahm_dask.pipeline.stores.dataset import write_dataset
from kahm_dask.pipeline.stores.synthetic import synthetic_blobs
from kahm_dask.pipeline.training import TrainSettings, train_pipeline
from kahm_dask.recipe import TrainParams


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
