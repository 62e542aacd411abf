"""The Dask pipeline against the in-memory classifier, on real scheduler/worker processes.

ARCHITECTURE.md: given the same partition labels and seed, the pipeline and
``KAHMClassifier.fit(X, y, partition=labels)`` build the same cluster models and give the same
predictions. Also: resume after a lost cluster, the CLI end to end, and no private training
row in any file the DP pipeline writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import zarr
from click.testing import CliRunner
from distributed import Client

from kahm_dask import KAHMClassifier
from kahm_dask.cli import main
from kahm_dask.datasets import load_bundled, split_and_scale
from kahm_dask.partition import kmeans_partition
from kahm_dask.pipeline.modelstore import cluster_dir, load_cluster
from kahm_dask.pipeline.predict import DISTANCES, PREDICTIONS, predict_to_store
from kahm_dask.pipeline.store import write_dataset
from kahm_dask.pipeline.tasks import TrainParams
from kahm_dask.pipeline.train import TrainSettings, train_pipeline

from .._cluster import subprocess_cluster


@pytest.fixture(scope="module")
def scheduler_address(tmp_path_factory):
    """A real `dask scheduler` and two `dask worker` processes (with nannies) on 127.0.0.1."""
    with subprocess_cluster(tmp_path_factory.mktemp("cluster"), 2, nanny=True) as cluster:
        yield cluster.address


@pytest.fixture(scope="module")
def digits():
    return split_and_scale(*load_bundled("digits"), split_seed=0)


def _within_class_partition(X, y, block_size, seed=0):
    """Within-class k-means labels (the core rules), the same input for both paths."""
    labels = np.zeros(len(y), dtype=np.int64)
    for i, c in enumerate(np.unique(y)):
        rows = y == c
        S = max(1, int(np.floor(rows.sum() / block_size + 0.5)))
        labels[rows] = kmeans_partition(X[rows], S, min_cluster_size=30, random_state=seed + i)
    return labels


@pytest.mark.parametrize("epsilon", [None, 2.0])
def test_pipeline_on_remote_cluster_equals_in_memory(tmp_path, digits, scheduler_address, epsilon):
    block_size = 60  # ~2 clusters per digit class: the min/argmin reductions are exercised
    labels = _within_class_partition(digits.X_train, digits.y_train, block_size)
    assert labels.max() >= 1
    store = write_dataset(tmp_path / "train.zarr", digits.X_train, digits.y_train, chunk_rows=200)
    params = TrainParams(20, 5, epsilon=epsilon)
    settings = TrainSettings(params, seed=7, block_size=block_size)
    with Client(scheduler_address) as client:
        summary = train_pipeline(store, tmp_path / "m.zarr", tmp_path / "work", settings, client,
                                 partition=labels, progress=False)
        group = predict_to_store(tmp_path / "m.zarr", da.from_array(digits.X_test, chunks=(128, 64)),
                                 tmp_path / "pred.zarr", client)
    assert summary["n_clusters"] == len(set(zip(digits.y_train, labels)))

    clf = KAHMClassifier(20, 5, block_size, random_state=7, epsilon=epsilon)
    clf.fit(digits.X_train, digits.y_train, partition=labels)
    classes = np.asarray(group.attrs["classes"])
    np.testing.assert_array_equal(classes[group[PREDICTIONS][:]], clf.predict(digits.X_test))
    np.testing.assert_allclose(group[DISTANCES][:], clf.class_distances(digits.X_test), rtol=1e-10, atol=1e-12)
    if epsilon is not None:  # the same DP rows, cluster by cluster
        first = cluster_dir(tmp_path / "m.zarr", 0, 0)
        fab = zarr.open_group(str(first), mode="r")["fabricated"][:]
        rows0 = digits.y_train == clf.classes_[0]
        np.testing.assert_allclose(fab, clf.dp_data_[clf.classes_[0]][labels[rows0] == 0], rtol=1e-10, atol=1e-12)


def test_resume_recomputes_only_missing_clusters(tmp_path, digits):
    labels = _within_class_partition(digits.X_train, digits.y_train, 60)
    store = write_dataset(tmp_path / "train.zarr", digits.X_train, digits.y_train, chunk_rows=300)
    settings = TrainSettings(TrainParams(10, 2, epsilon=1.0), seed=3, block_size=60)
    first = train_pipeline(store, tmp_path / "m.zarr", tmp_path / "w", settings, partition=labels, progress=False)
    assert first["n_resumed"] == 0
    before = load_cluster(cluster_dir(tmp_path / "m.zarr", 3, 1)).distance(digits.X_test)
    import shutil

    shutil.rmtree(cluster_dir(tmp_path / "m.zarr", 3, 1))  # a cluster lost mid-run
    second = train_pipeline(store, tmp_path / "m.zarr", tmp_path / "w", settings, partition=labels, progress=False)
    assert second["n_resumed"] == first["n_clusters"] - 1
    after = load_cluster(cluster_dir(tmp_path / "m.zarr", 3, 1)).distance(digits.X_test)
    np.testing.assert_array_equal(before, after)


def test_building_the_prediction_graph_loads_no_model(tmp_path, digits, monkeypatch):
    """Models are loaded by the tasks, on the workers: building the graph in the client
    must not load any (dask infers a map_blocks meta by calling the function unless given)."""
    import kahm_dask.pipeline.predict as predict_mod

    labels = _within_class_partition(digits.X_train, digits.y_train, 300)
    store = write_dataset(tmp_path / "train.zarr", digits.X_train, digits.y_train, chunk_rows=300)
    settings = TrainSettings(TrainParams(10, 2), seed=3, block_size=300)
    train_pipeline(store, tmp_path / "m.zarr", tmp_path / "w", settings, partition=labels, progress=False)
    loads = []
    real = predict_mod.cached_cluster
    monkeypatch.setattr(predict_mod, "cached_cluster", lambda path: loads.append(path) or real(path))
    D = predict_mod.class_distance_array(tmp_path / "m.zarr", da.from_array(digits.X_test, chunks=(200, -1)))
    assert loads == []
    assert D.compute(scheduler="synchronous").shape == (digits.X_test.shape[0], 10) and loads


def _write_pipeline(tmp_path: Path, extra: str = "") -> Path:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        f"""
name: test-run
output: {tmp_path / 'run'}
data:
  source: sklearn:digits
model:
  n_components: 10
  n_layers: 2
privacy:
  epsilon: 2.0
cluster:
  n_workers: 1
  processes: false
{extra}"""
    )
    return cfg


def test_cli_run_writes_report_and_no_training_row(tmp_path, digits):
    cfg = _write_pipeline(tmp_path)
    result = CliRunner().invoke(main, ["run", str(cfg), "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    for key in ("accuracy", "mis", "attack_auc", "fit_seconds", "predict_seconds", "n_train", "n_test",
                "epsilon", "delta", "d", "n_components", "n_layers"):
        assert key in report
    assert report["accuracy"] > 0.85 and report["n_train"] == len(digits.y_train)
    assert (tmp_path / "run" / "report.md").exists() and (tmp_path / "run" / "samples.png").exists()
    # the DP noise seed is a secret: fresh entropy, kept on the private side only
    assert report["seed"] == "secret"
    from kahm_dask.pipeline.modelstore import read_manifest

    assert read_manifest(tmp_path / "run" / "model.zarr")["seed"] is None
    assert (tmp_path / "run" / "work" / "secret_seed.json").exists()

    # No original training row in anything released: the model store and the reports.
    released = [p for p in (tmp_path / "run").rglob("*") if p.is_file()
                and "data" not in p.relative_to(tmp_path / "run").parts[:1]
                and "work" not in p.relative_to(tmp_path / "run").parts[:1]]
    assert any("model.zarr" in str(p) for p in released)
    blob = b"".join(p.read_bytes() for p in released)
    X_tr = split_and_scale(*load_bundled("digits"), split_seed=0).X_train
    hits = sum(X_tr[i].tobytes() in blob for i in range(len(X_tr)))
    assert hits == 0
    for path in (tmp_path / "run" / "model.zarr" / "clusters").iterdir():
        fab = zarr.open_group(str(path), mode="r")["fabricated"][:]
        dist = np.sqrt(((fab[:, None, :] - X_tr[None, :, :]) ** 2).sum(-1)).min(axis=1)
        assert dist.min() > 1e-9


def test_cli_rejects_unknown_yaml_key(tmp_path):
    cfg = _write_pipeline(tmp_path, "evaluate:\n  membrship: true\n")
    result = CliRunner().invoke(main, ["run", str(cfg)])
    assert result.exit_code != 0
    assert "membrship" in result.output
