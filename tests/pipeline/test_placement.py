"""Model placement (kahm_dask/pipeline/placement.py): each cluster model has one home worker,
chosen by its rows, and a prediction on a client evaluates each model on its home only.

* the homes: every model gets one of the given workers, deterministically; the loads obey
  the list-scheduling bound (max ≤ total / W + largest); equal models split evenly;
* the graph: every distance task of a model prefers its home (a loose restriction);
* on 2 worker processes (work stealing off, so that the scheduler follows the preference
  alone), with the scheduler in this process (a LocalCluster) and in a process of its own (which
  optimises a graph under its own configuration): each model is loaded by its home worker only,
  exhaustive and routed, with the same distances as without a client (also for a lazy result
  computed under Dask's default fusion); the control: without homes both workers load the models.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client

from kahm_dask.datasets import make_class_blobs
from kahm_dask.pipeline.cluster import connect
from kahm_dask.pipeline.config import ClusterConfig
from kahm_dask.pipeline.placement import model_homes
from kahm_dask.pipeline.predict import DISTANCES, class_distance_array, predict_to_store
from kahm_dask.pipeline.runs.central import evaluate
from kahm_dask.pipeline.stores.dataset import open_dataset, write_dataset
from kahm_dask.pipeline.stores.manifest import read_manifest
from kahm_dask.pipeline.stores.model import cluster_location
from kahm_dask.pipeline.training import TrainSettings, train_pipeline
from kahm_dask.recipe import TrainParams
from tests._kit import subprocess_cluster


@pytest.mark.parametrize("seed", range(5))
def test_homes_obey_the_list_scheduling_bound(seed):
    rows = np.random.default_rng(seed).integers(1, 1000, size=37).tolist()
    workers = [f"w{i}" for i in range(4)]
    homes = model_homes(rows, workers)
    assert set(homes) <= set(workers) and len(homes) == len(rows)
    load = {w: sum(r for r, h in zip(rows, homes, strict=True) if h == w) for w in workers}
    assert max(load.values()) <= sum(rows) / len(workers) + max(rows)
    assert homes == model_homes(rows, workers)  # deterministic


def test_equal_models_split_evenly_and_one_worker_takes_all():
    homes = model_homes([100] * 7, ["a", "b", "c"])
    assert sorted(homes.count(w) for w in "abc") == [2, 2, 3]
    assert model_homes([5, 3], ["only"]) == ["only", "only"]
    with pytest.raises(ValueError, match="at least one worker"):
        model_homes([5], [])


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A model store of 3 classes × several clusters (N_b = 300), and 800 query rows."""
    tmp = tmp_path_factory.mktemp("placement")
    X, y = make_class_blobs(3300, 8, 3, random_state=0)
    store = write_dataset(tmp / "t.zarr", X[:2500], y[:2500], chunk_rows=500)
    write_dataset(tmp / "q.zarr", X[2500:], y[2500:], chunk_rows=200)
    train_pipeline(store, tmp / "m.zarr", tmp / "w", TrainSettings(TrainParams(5, 1), seed=1, block_size=300),
                   progress=False)
    return tmp, X[2500:]


def test_every_distance_task_prefers_its_models_home(model):
    tmp, Q = model
    entries = sorted(read_manifest(tmp / "m.zarr")["clusters"], key=lambda e: (e["class"], e["cluster"]))
    workers = ["tcp://w0:1", "tcp://w1:1"]
    homes = {(e["class"], e["cluster"]): h for e, h in zip(entries, model_homes([e["n_rows"] for e in entries],
                                                                               workers), strict=True)}
    D = class_distance_array(tmp / "m.zarr", da.from_array(Q, chunks=200), workers=workers)
    seen = {}
    for name, layer in D.__dask_graph__().layers.items():
        if name.startswith("kahm-dist-"):
            c, s = (int(part[1:]) for part in name.split("-")[2:4])
            seen[(c, s)] = layer.annotations
    assert seen == {key: {"workers": [home], "allow_other_workers": True} for key, home in homes.items()}


def _models_by_home(model_path: Path, workers: list[str]) -> dict[str, set[str]]:
    """The cluster paths of the model store that each of ``workers`` is home to."""
    entries = sorted(read_manifest(model_path)["clusters"], key=lambda e: (e["class"], e["cluster"]))
    homes = model_homes([e["n_rows"] for e in entries], workers)
    return {w: {str(cluster_location(model_path, e["class"], e["cluster"]))
                for e, h in zip(entries, homes, strict=True) if h == w} for w in workers}


def _cached_models() -> set[str]:
    """Runs on a worker: the cluster paths in its model cache."""
    from kahm_dask.pipeline.stores import model as store

    return {key[0] for key in store._CACHE}


@contextmanager
def _cluster(kind: str, tmp: Path, monkeypatch) -> Iterator[Client]:
    """A client of 2 single-threaded workers, work stealing off: a LocalCluster (its scheduler in
    this process) or a scheduler and workers in processes of their own (the scheduler then
    optimises and places under its own configuration, not this process's)."""
    if kind == "local":
        with dask.config.set({"distributed.scheduler.work-stealing": False}):
            with connect(ClusterConfig(n_workers=2, processes=True)) as client:
                client.wait_for_workers(2)
                yield client
        return
    monkeypatch.setenv("DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING", "False")
    with subprocess_cluster(tmp / "cluster") as cluster, Client(cluster.address, timeout=30) as client:
        yield client


@pytest.mark.parametrize("kind", ["local", pytest.param("subprocess", marks=pytest.mark.slow)])  # subprocess: ~13 s
def test_each_model_is_loaded_by_its_home_worker_only(model, kind, monkeypatch):
    tmp, Q = model
    reference = class_distance_array(tmp / "m.zarr", da.from_array(Q, chunks=200)).compute(scheduler="sync")
    routed_reference = class_distance_array(tmp / "m.zarr", da.from_array(Q, chunks=200), n_probe=1).compute(
        scheduler="sync")
    with _cluster(kind, tmp, monkeypatch) as client:
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        expected = _models_by_home(tmp / "m.zarr", workers)
        for n_probe, ref in ((None, reference), (1, routed_reference)):
            group = predict_to_store(tmp / "m.zarr", da.from_array(Q, chunks=200), tmp / f"p-{kind}.zarr", client,
                                     n_probe=n_probe)
            assert group[DISTANCES][...].tobytes() == ref.tobytes()
            assert client.run(_cached_models) == expected, f"n_probe={n_probe}"
        for n_probe, ref in ((None, reference), (1, routed_reference)):
            # a lazy result computed under Dask's defaults (fusion on: the homes may go) is the same
            lazy = class_distance_array(tmp / "m.zarr", da.from_array(Q, chunks=200), n_probe=n_probe,
                                        workers=workers)
            assert client.compute(lazy).result().tobytes() == ref.tobytes()


def test_the_membership_distances_are_computed_on_the_models_homes(model):
    # the evaluation meets every model again (the training rows' distances): on a client it
    # runs where the prediction left each model, and its values are those of the default scheduler
    tmp, Q = model
    train, test = open_dataset(tmp / "t.zarr"), open_dataset(tmp / "q.zarr")
    predict_to_store(tmp / "m.zarr", test.X(), tmp / "p-eval-ref.zarr")
    reference = evaluate(tmp / "m.zarr", tmp / "p-eval-ref.zarr", train, test, max_train_rows=600)
    with dask.config.set({"distributed.scheduler.work-stealing": False}):
        with connect(ClusterConfig(n_workers=2, processes=True)) as client:
            client.wait_for_workers(2)
            expected = _models_by_home(tmp / "m.zarr", sorted(client.scheduler_info(n_workers=-1)["workers"]))
            metrics, d_train, _ = evaluate(tmp / "m.zarr", tmp / "p-eval-ref.zarr", train, test, client=client,
                                           max_train_rows=600)  # new workers: their caches start empty
            assert client.run(_cached_models) == expected
    assert d_train.tobytes() == reference[1].tobytes()
    assert metrics == reference[0]


def test_without_homes_the_workers_load_the_same_models(model):
    # the control of the test above: the scheduler alone sends every row block's tasks where
    # the block is, and each worker holds row blocks
    tmp, Q = model
    with dask.config.set({"distributed.scheduler.work-stealing": False}):
        with connect(ClusterConfig(n_workers=2, processes=True)) as client:
            client.wait_for_workers(2)
            client.compute(class_distance_array(tmp / "m.zarr", da.from_array(Q, chunks=200))).result()
            first, second = client.run(_cached_models).values()
    assert first & second
