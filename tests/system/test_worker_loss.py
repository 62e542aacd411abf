"""Worker loss: SIGKILL one of two worker processes mid-training and mid-prediction
(docs/reliability.md §2).

The workers run without nannies, so a killed worker stays dead and the survivor must finish.
The scheduler reschedules what the dead worker was running or holding (a task is given up
only after ``distributed.scheduler.allowed-failures`` = 3 such deaths → ``KilledWorker``); task
*exceptions* are retried by the ``retries=2`` of ``client.compute`` in train.py and predict.py.
Because every task is a pure, seeded function, the result is bit-identical to the
uninterrupted baseline run, given the baseline's stored noisy rows (the DP noise is secure and
never drawn twice, so the run starts from a copy of them: ``start_from_noise_of``).
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import zarr
from distributed import Client

from kahm_dask.pipeline.predict import DISTANCES, PREDICTIONS, class_distance_array, predict_to_store
from kahm_dask.pipeline.stores.synthetic import synthetic_blobs
from tests._kit import (
    SYNTHETIC_RUN,
    assert_same_fingerprint,
    complete_clusters,
    n_planned_clusters,
    pipeline_file,
    run_fingerprint,
    run_pipeline_file,
    run_stores,
    sigkill,
    staged_model,
    start_from_noise_of,
    subprocess_cluster,
    wait_for,
)

pytestmark = pytest.mark.slow


def _busy_worker(client: Client, cluster, prefix: str):
    """The Popen of a worker that is executing a task whose key starts with ``prefix``."""
    pids = client.run(os.getpid)
    for address, keys in client.processing().items():
        if any(str(k).strip("('").startswith(prefix) for k in keys):
            return next(w for w in cluster.workers if w.pid == pids[address])
    return None


class Background:
    """Run ``fn`` in a thread; keep its result or exception."""

    def __init__(self, fn):
        self.result, self.error = None, None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn):
        try:
            self.result = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised by join
            self.error = exc

    def join(self, timeout: float):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"still running after {timeout} s"
        if self.error is not None:
            raise self.error
        return self.result


def test_worker_killed_mid_training(tmp_path, baseline_run, baseline_fingerprint):
    start_from_noise_of(baseline_run, tmp_path / "run")
    model, pred = run_stores(tmp_path / "run")
    staged = staged_model(tmp_path / "run")  # the clusters are written there until the run completes
    with subprocess_cluster(tmp_path / "cluster", 2) as cluster, Client(cluster.address) as client:
        cfg = pipeline_file(tmp_path / "p.yaml", **{**SYNTHETIC_RUN, "cluster": {"scheduler": cluster.address}},
                            output=tmp_path / "run")
        job = Background(lambda: run_pipeline_file(cfg, client))
        wait_for(lambda: complete_clusters(staged) >= 1 or not job.thread.is_alive(), 300,
                 "no cluster finished")
        victim = None
        deadline = time.monotonic() + 60
        while victim is None and time.monotonic() < deadline and job.thread.is_alive():
            victim = _busy_worker(client, cluster, "train_cluster")
            time.sleep(0.01)
        done, planned = complete_clusters(staged), n_planned_clusters(staged)
        assert victim is not None, "no worker was training a cluster"
        sigkill(victim)
        metrics = job.join(600)
        survivors = len(client.scheduler_info()["workers"])
    print(f"\nkilled a worker with {done}/{planned} clusters complete; "
          f"{metrics['n_clusters_resumed']} clusters reported as resumed")
    assert 1 <= done < planned, "the kill did not land mid-training"
    assert survivors == 1
    assert_same_fingerprint(baseline_fingerprint, run_fingerprint(model, pred))


def test_worker_killed_mid_prediction(tmp_path, baseline_run):
    model = run_stores(baseline_run)[0]
    X, _ = synthetic_blobs(8_000, 16, 10, seed=123, chunk_rows=400)  # lazy: generated on the workers
    reference = class_distance_array(model, X).compute(scheduler="threads")
    out = tmp_path / "pred.zarr"
    n_chunks = len(X.chunks[0])
    with subprocess_cluster(tmp_path / "cluster", 2) as cluster, Client(cluster.address) as client:
        job = Background(lambda: predict_to_store(model, X, out, client))

        def written() -> int:
            # predictions are written under a temporary name and renamed when complete
            dirs = list(out.parent.glob(f".{out.name}.tmp-*/{PREDICTIONS}/c")) + [out / PREDICTIONS / "c"]
            return max((len(os.listdir(d)) for d in dirs if d.is_dir()), default=0)

        wait_for(lambda: written() >= 1 or not job.thread.is_alive(), 300, "no prediction chunk written")
        victim = None
        while victim is None and job.thread.is_alive():
            victim = _busy_worker(client, cluster, "kahm-home")
            time.sleep(0.01)
        done = written()
        assert victim is not None, "no worker was computing distances"
        sigkill(victim)
        job.join(600)
        survivors = len(client.scheduler_info()["workers"])
    print(f"\nkilled a worker with {done}/{n_chunks} prediction chunks written")
    assert 1 <= done < n_chunks, "the kill did not land mid-prediction"
    assert survivors == 1
    group = zarr.open_group(str(out), mode="r")
    D = group[DISTANCES][:]
    assert D.tobytes() == reference.tobytes()
    np.testing.assert_array_equal(group[PREDICTIONS][:], np.argmin(reference, axis=1))
