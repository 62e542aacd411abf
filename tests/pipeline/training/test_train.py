"""The Dask pipeline against the in-memory classifier, on real scheduler/worker processes.

Given the same partition labels, seed and noise, the pipeline and
``KAHMClassifier.fit(X, y, partition=labels)`` build the same cluster models and give the same
predictions. The noise is fixed on both sides with ``insecure_noise_seed`` (tests only: it
voids the guarantee and warns); both draw it block-addressed, so chunking does not change it.
Also: resume after a lost cluster, the CLI end to end with its folder layout, and no private
training row in the publishable folder (tests/pipeline/test_release_boundary.py scans it fully).
"""

from __future__ import annotations

import json

import dask.array as da
import numpy as np
import pytest
import zarr
from click.testing import CliRunner
from distributed import Client

from kahm_dask import KAHMClassifier
from kahm_dask.cli import main
from kahm_dask.partition import kmeans_partition
from kahm_dask.pipeline.predict import DISTANCES, PREDICTIONS, predict_to_store
from kahm_dask.pipeline.stores.dataset import write_dataset
from kahm_dask.pipeline.stores.manifest import read_manifest
from kahm_dask.pipeline.stores.model import cluster_dir, load_cluster
from kahm_dask.pipeline.training import TrainSettings, train_pipeline
from kahm_dask.privacy.randomness import PrivacyLeakWarning
from kahm_dask.recipe import TrainParams
from tests._kit import interrupt_after_training, pipeline_file, subprocess_cluster


@pytest.fixture(scope="module")
def scheduler_address(tmp_path_factory):
    """A real `dask scheduler` and two `dask worker` processes (with nannies) on 127.0.0.1."""
    with subprocess_cluster(tmp_path_factory.mktemp("cluster"), 2, nanny=True) as cluster:
        yield cluster.address


def _within_class_partition(X, y, block_size, seed=0):
    """Within-class k-means labels (the core rules), the same input for both paths."""
    labels = np.zeros(len(y), dtype=np.int64)
    for i, c in enumerate(np.unique(y)):
        rows = y == c
        S = max(1, int(np.floor(rows.sum() / block_size + 0.5)))
        labels[rows] = kmeans_partition(X[rows], S, min_cluster_size=30, random_state=seed + i)
    return labels


@pytest.mark.filterwarnings("ignore::kahm_dask.privacy.randomness.PrivacyLeakWarning")
@pytest.mark.parametrize("epsilon", [None, 2.0])
def test_pipeline_on_remote_cluster_equals_in_memory(tmp_path, digits, scheduler_address, epsilon):
    block_size = 60  # ~2 clusters per digit class: the min/argmin reductions are exercised
    labels = _within_class_partition(digits.X_train, digits.y_train, block_size)
    assert labels.max() >= 1
    store = write_dataset(tmp_path / "train.zarr", digits.X_train, digits.y_train, chunk_rows=200)
    params = TrainParams(20, 5, epsilon=epsilon)
    # the same noise on both sides: a fixed (insecure, test-only) seed and the same bounds
    noise = dict(insecure_noise_seed=123) if epsilon is not None else {}
    settings = TrainSettings(params, seed=7, block_size=block_size, bounds=(0.0, 1.0), **noise)
    with Client(scheduler_address) as client:
        summary = train_pipeline(store, tmp_path / "m.zarr", tmp_path / "work", settings, client,
                                 partition=labels, progress=False)
        group = predict_to_store(tmp_path / "m.zarr", da.from_array(digits.X_test, chunks=(128, 64)),
                                 tmp_path / "pred.zarr", client)
    assert summary["n_clusters"] == len(set(zip(digits.y_train, labels, strict=True)))

    clf = KAHMClassifier(20, 5, block_size, random_state=7, epsilon=epsilon, bounds=(0.0, 1.0), **noise)
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
    settings = TrainSettings(TrainParams(10, 2, epsilon=1.0), seed=3, block_size=60, bounds=(0.0, 1.0))
    first = train_pipeline(store, tmp_path / "m.zarr", tmp_path / "w", settings, partition=labels, progress=False)
    assert first["n_resumed"] == 0
    before = load_cluster(cluster_dir(tmp_path / "m.zarr", 3, 1)).distance(digits.X_test)
    interrupt_after_training(tmp_path / "m.zarr", tmp_path / "w", (3, 1))  # a cluster lost mid-run
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


def test_max_cluster_rows_bounds_every_task(tmp_path, digits):
    """partition.max_cluster_rows splits the k-means clusters so no task gets more rows (the
    memory bound of the out-of-core DP run); the model store records the capped clusters."""
    store = write_dataset(tmp_path / "train.zarr", digits.X_train, digits.y_train, chunk_rows=300)
    settings = TrainSettings(TrainParams(10, 1), seed=3, block_size=60, max_cluster_rows=50)
    summary = train_pipeline(store, tmp_path / "m.zarr", tmp_path / "w", settings, progress=False)
    sizes = [c["n_rows"] for c in read_manifest(tmp_path / "m.zarr")["clusters"]]
    assert max(sizes) <= 50 and sum(sizes) == digits.X_train.shape[0]
    assert summary["n_clusters"] == len(sizes) > 10 * 2


#: The DP run of the CLI tests (pipeline_file overrides): digits with public bounds, ε = 2, one
#: threaded worker.
CLI_RUN = {"name": "test-run", "data.source": "sklearn:digits", "data.bounds": [0, 16], "model.n_components": 10,
           "model.n_layers": 2, "privacy.epsilon": 2.0, "cluster.n_workers": 1, "cluster.processes": False}


def test_cli_run_writes_the_public_and_owner_folders(tmp_path, digits):
    cfg = pipeline_file(tmp_path, **CLI_RUN)
    result = CliRunner().invoke(main, ["run", str(cfg), "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    public, owner = run / "public", run / "owner"
    report = json.loads((owner / "report.json").read_text())
    for key in ("accuracy", "mis", "attack_auc", "fit_seconds", "predict_seconds", "n_train", "n_test",
                "epsilon", "delta", "d", "n_components", "n_layers", "seed", "privacy", "bounds_source"):
        assert key in report
    assert report["accuracy"] > 0.85 and report["n_train"] == len(digits.y_train)
    assert report["delta"] == 0 and report["d"] == 1.0 and report["r_source"] == "passes"
    assert report["cluster_on"] == "noisy" and isinstance(report["seed"], int)  # public now
    assert report["privacy"]["ledger"]["epsilon_total"] == 2.0
    assert sorted(p.name for p in public.iterdir()) == ["PRIVACY.md", "fabricated.png", "model.zarr"]
    assert (owner / "report.md").exists() and (owner / "distances.png").exists()
    assert (owner / "predictions.zarr").is_dir() and (owner / "data" / "train.zarr").is_dir()
    assert not list(run.rglob("samples.png")) and not list(run.rglob("secret_seed.json"))
    # the console says where each folder is
    assert f"Public folder (may be published: DP model store, PRIVACY.md): {public}" in result.output
    assert f"Owner folder (keep with the data owner: data, work, report, predictions): {owner}" in result.output
    from kahm_dask.pipeline.stores.manifest import read_manifest

    manifest = read_manifest(public / "model.zarr")
    assert manifest["seed"] == report["seed"]
    assert manifest["privacy"]["release_id"] == report["privacy"]["release_id"]

    # No original training row in anything publishable (the full scan is in test_release_boundary)
    blob = b"".join(p.read_bytes() for p in public.rglob("*") if p.is_file())
    X_tr = zarr.open_array(str(owner / "data" / "train.zarr" / "X"), mode="r")[...]
    assert sum(X_tr[i].tobytes() in blob for i in range(len(X_tr))) == 0
    for path in (public / "model.zarr" / "clusters").iterdir():
        fab = zarr.open_group(str(path), mode="r")["fabricated"][:]
        dist = np.sqrt(((fab[:, None, :] - X_tr[None, :, :]) ** 2).sum(-1)).min(axis=1)
        assert dist.min() > 1e-9


def test_cli_run_budget_refuses_a_second_release(tmp_path):
    cfg = pipeline_file(tmp_path, **CLI_RUN)
    runner = CliRunner()
    first = runner.invoke(main, ["run", str(cfg), "--no-progress", "--budget", "3", "0"], catch_exceptions=False)
    assert first.exit_code == 0, first.output
    # another release from the same training store (the noisy rows lost): beyond the budget
    import shutil

    shutil.rmtree(tmp_path / "run" / "owner" / "work")
    shutil.rmtree(tmp_path / "run" / "public" / "model.zarr")
    second = runner.invoke(main, ["run", str(cfg), "--no-progress", "--budget", "3", "0"])
    assert second.exit_code == 1
    assert "BudgetExceededError" in second.output and "beyond the budget" in second.output
    assert "No noise was drawn" in second.output
    assert not (tmp_path / "run" / "owner" / "work" / "X_noisy").exists()


def test_cli_run_without_public_bounds_warns_and_says_so(tmp_path):
    cfg = pipeline_file(tmp_path, **{k: v for k, v in CLI_RUN.items() if k != "data.bounds"})
    with pytest.warns(PrivacyLeakWarning, match="data.bounds"):
        result = CliRunner().invoke(main, ["run", str(cfg), "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    statement = (tmp_path / "run" / "public" / "PRIVACY.md").read_text()
    assert "scaled by the training rows' min and max" in statement  # where the bounds came from
    assert "scaled by the private rows' min and max of each feature" in statement  # the weakening


def test_cli_rejects_unknown_yaml_key(tmp_path):
    cfg = pipeline_file(tmp_path, **CLI_RUN, **{"evaluate.membrship": True})
    result = CliRunner().invoke(main, ["run", str(cfg)])
    assert result.exit_code != 0
    assert "membrship" in result.output
