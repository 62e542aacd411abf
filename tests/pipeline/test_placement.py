"""Model placement (kahm_dask/pipeline/placement.py): each cluster model has one home worker,
chosen by its rows, and a prediction on a client evaluates each model on its home only.

* the homes: every model gets one of the given workers, deterministically; the loads obey
  the list-scheduling bound (max ≤ total / W + largest); equal models split evenly;
* the graph: every distance task of a model prefers its home (a loose restriction);
* on 2 worker processes (work stealing off, so that the scheduler follows the preference
  alone), with the scheduler in this process (a LocalCluster) and in a process of its own (which
  optimises a graph under its own configuration): each model is loaded by its home worker only,
  exhaustive and routed, with the same distances as without a client; a lazy result the caller
  computes with Dask's defaults keeps the homes too (a PlacedArray); the control: without homes
  both workers load the models;
* a DaskKAHMClassifier fitted on worker processes leaves each model in the cache of the worker
  that trained it, and its first prediction loads none, with the distances of models read back
  from the store.
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
    """One layer per home worker, annotated with it, whose tasks evaluate exactly the models that
    worker is home to (by rows, or where they were trained when that is known)."""
    tmp, Q = model
    entries = sorted(read_manifest(tmp / "m.zarr")["clusters"], key=lambda e: (e["class"], e["cluster"]))
    workers = ["tcp://w0:1", "tcp://w1:1"]
    by_rows = model_homes([e["n_rows"] for e in entries], workers)
    trained = [workers[i % 2] for i in range(len(entries))]  # another assignment than by rows
    assert trained != by_rows
    for trained_on, homes in ((None, by_rows), ({(e["class"], e["cluster"]): h for e, h in
                                                 zip(entries, trained, strict=True)}, trained)):
        D = class_distance_array(tmp / "m.zarr", da.from_array(Q, chunks=200), workers=workers, trained_on=trained_on)
        seen = {}
        for name, layer in D.__dask_graph__().layers.items():
            if name.startswith("kahm-home-"):
                (home,) = layer.annotations["workers"]
                seen[home] = layer.annotations
                assert layer.annotations["allow_other_workers"] is True
        assert sorted(seen) == workers
        expected = {w: {str(cluster_location(tmp / "m.zarr", e["class"], e["cluster"]))
                        for e, h in zip(entries, homes, strict=True) if h == w} for w in workers}
        assert _evaluated_by_home(D) == expected


def _evaluated_by_home(D) -> dict[str, set[str]]:
    """Home worker → the cluster paths its ``kahm-home`` tasks of ``D`` evaluate."""
    from kahm_dask.pipeline.predict import _home_block

    found: dict[str, set[str]] = {}
    graph = D.__dask_graph__()
    for name, layer in graph.layers.items():
        if name.startswith("kahm-home-"):
            (home,) = layer.annotations["workers"]
            for task in layer.values():
                args = [a.value if hasattr(a, "value") else a for a in task.args]
                assert task.func is _home_block
                found.setdefault(home, set()).update(str(path) for _, path in args[1])
    return found


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


@pytest.mark.parametrize("n_probe", [None, 1])
def test_a_lazy_result_computed_with_dasks_defaults_keeps_the_homes(model, n_probe, monkeypatch):
    tmp, Q = model
    reference = class_distance_array(tmp / "m.zarr", da.from_array(Q, chunks=200), n_probe=n_probe).compute(
        scheduler="sync")
    with _cluster("local", tmp, monkeypatch) as client:
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        lazy = class_distance_array(tmp / "m.zarr", da.from_array(Q, chunks=200), n_probe=n_probe, workers=workers)
        assert lazy.compute().tobytes() == reference.tobytes()  # Dask's default graph optimisation
        assert client.run(_cached_models) == _models_by_home(tmp / "m.zarr", workers)


def test_a_fitted_estimator_predicts_with_the_models_where_it_trained_them(model, monkeypatch):
    from kahm_dask import DaskKAHMClassifier

    tmp, Q = model
    train = open_dataset(tmp / "t.zarr")
    X, y = train.read_slice(0, train.n_samples), train.labels()
    with _cluster("local", tmp, monkeypatch) as client:
        est = DaskKAHMClassifier(n_components=5, block_size=300, random_state=1, store_dir=tmp / "est").fit(X, y)
        trained = client.run(_cached_models)
        clusters = {str(cluster_location(est.model_path_, e["class"], e["cluster"]))
                    for e in read_manifest(est.model_path_)["clusters"]}
        assert set().union(*trained.values()) == clusters and all(trained.values())
        D = est.class_distances(da.from_array(Q, chunks=200)).compute()
        assert client.run(_cached_models) == trained  # nothing loaded, nothing moved
    reference = class_distance_array(est.model_path_, da.from_array(Q, chunks=200)).compute(scheduler="sync")
    assert D.tobytes() == reference.tobytes()  # the cached models are those the store holds


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


def test_a_small_worker_keeps_no_trained_model_in_its_cache(model):
    # below the plugins' 4 GiB minimum, a worker's memory goes to its training tasks (the 1 GiB
    # workers of the larger-than-memory run): the models are loaded when a prediction needs them
    from kahm_dask import DaskKAHMClassifier

    tmp, Q = model
    train = open_dataset(tmp / "t.zarr")
    with connect(ClusterConfig(n_workers=1, processes=True, memory_limit="1GiB")) as client:
        est = DaskKAHMClassifier(n_components=5, block_size=300, random_state=1, store_dir=tmp / "small")
        est.fit(train.read_slice(0, train.n_samples), train.labels())
        assert client.run(_cached_models) == {next(iter(client.run(_cached_models))): set()}
        est.class_distances(Q)
        assert len(next(iter(client.run(_cached_models).values()))) == est.n_clusters_
