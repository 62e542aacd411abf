"""No original training row in anything a DP run releases (docs/reliability.md §4).

The scanner (:class:`~tests.reliability.conftest.RowScanner`) looks for every training row, as
``p`` consecutive values equal to 1e-9, in raw bytes (float64 at 8 offsets, float32 at 4),
in numbers printed as text, in every *decompressed* Zarr array (C and Fortran order) and in
every array reachable from a Python object. A byte scan alone would miss rows in Zarr chunks,
which are compressed. ``test_scanner_finds_planted_rows`` shows it finds rows in each form.

A run folder is split at the release boundary: ``public/`` (``model.zarr``, ``PRIVACY.md``, the
plot of fabricated rows) may be published; ``owner/`` stays with the data owner (``data/`` and
``work/`` hold private rows by design; the report, predictions and distances are computed on
private rows). The released artefacts are ``public/`` and the run's console log; the owner's
report is scanned too (it must hold statistics, never rows).
tests/pipeline/test_release_boundary.py scans the quickstart run's ``public/`` exhaustively.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from kahm_dask import KAHMClassifier
from kahm_dask import recipe as recipe_mod
from kahm_dask.datasets import load_bundled, make_class_blobs
from kahm_dask.pipeline.cluster import BLAS_ENV
from kahm_dask.pipeline.stores.dataset import write_dataset
from kahm_dask.pipeline.training import TrainSettings, train_pipeline
from kahm_dask.pipeline.training import tasks as tasks_mod
from kahm_dask.pipeline.training import train as train_mod
from kahm_dask.pipeline.training.tasks import GROUPED_X
from kahm_dask.privacy.randomness import PrivacyLeakWarning
from kahm_dask.recipe import TrainParams
from tests._kit import RowScanner, assert_same_fingerprint, pipeline_file, run_fingerprint


@pytest.fixture(scope="module")
def scanner(digits):
    return RowScanner(digits.X_train)


def test_scanner_finds_planted_rows(tmp_path, digits, scanner):
    X = digits.X_train
    (tmp_path / "raw.bin").write_bytes(b"xyz" + X[7].tobytes() + b"tail")  # unaligned float64
    (tmp_path / "f32.bin").write_bytes(b"a" + X[8].astype(np.float32).tobytes())
    (tmp_path / "report.json").write_text(json.dumps({"row": X[9].tolist()}))
    (tmp_path / "report.md").write_text(" ".join(repr(v) for v in X[17]))  # np.float64(0.5) ...
    (tmp_path / "log.txt").write_text("INFO first row: " + np.array2string(X[10], precision=17, separator=" "))
    g = zarr.open_group(tmp_path / "s.zarr", mode="w")
    g.create_array("transposed", data=np.ascontiguousarray(X[[11, 12]].T))  # compressed chunks
    g.create_array("flat", data=np.concatenate([[0.5], X[13], [0.25]]))
    (tmp_path / "near.bin").write_bytes((X[14] + 1e-3).tobytes())  # not a training row
    found = scanner.in_tree(tmp_path)
    assert set().union(*found.values()) == {7, 8, 9, 10, 11, 12, 13, 17}
    assert not any(p.endswith("near.bin") for p in found)
    assert scanner.in_object({"a": [X[15] + 0.0]}) == {15}
    assert scanner.in_bytes(pickle.dumps(X[16].copy())) == {16}


def _released(run: Path) -> list[Path]:
    """The publishable folder, the console log and the owner's reports (no rows in any)."""
    owner = run / "owner"
    return [run / "public", run / "run.log"] + [owner / n for n in os.listdir(owner) if n not in ("data", "work")]


@pytest.mark.parametrize("variant,processes", [
    ("fabricated", False),
    pytest.param("noisy", True, marks=pytest.mark.slow),  # worker processes log too
])
def test_dp_cli_run_releases_no_training_row(tmp_path, digits, scanner, variant, processes):
    run = tmp_path / "run"
    cfg = pipeline_file(tmp_path, name="leak", **{
        "data.source": "sklearn:digits", "data.bounds": [0, 16], "model.n_components": 10, "model.n_layers": 2,
        "privacy.epsilon": 2.0, "privacy.dp_data": variant, "evaluate.max_train_rows": 400,
        "cluster.n_workers": 2, "cluster.processes": processes, "cluster.memory_limit": "1GiB"})
    run.mkdir()
    with open(run / "run.log", "wb") as log:  # the run's whole stdout and stderr, workers included
        proc = subprocess.run([sys.executable, "-m", "kahm_dask.cli", "-v", "run", str(cfg), "--no-progress"],
                              stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **BLAS_ENV},
                              cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, (run / "run.log").read_text()[-3000:]
    released = _released(run)
    names = {p.name for p in released}
    assert {"public", "predictions.zarr", "report.json", "report.md", "run.log"} <= names
    assert (run / "public" / "model.zarr" / "clusters").is_dir() and (run / "run.log").stat().st_size > 1000
    # the rows as stored (the digits scaled by their public bounds 0..16: the fixture's rows)
    # and as raw digits
    stored = zarr.open_array(str(run / "owner" / "data" / "train.zarr" / "X"), mode="r")[...]
    np.testing.assert_array_equal(stored, digits.X_train)
    leaks = {}
    for rows in (stored, load_bundled("digits")[0]):
        row_scanner = RowScanner(rows)
        for path in released:
            leaks.update(row_scanner.in_tree(path) if path.is_dir() else {str(path): row_scanner.in_file(path)})
    assert {k: sorted(v)[:5] for k, v in leaks.items() if v} == {}

    # the private side does hold the rows (so the scan can see them), and nothing else may
    private = RowScanner(stored).in_zarr_arrays(run / "owner" / "data")
    assert len(set().union(*private.values())) == len(stored)


@pytest.mark.parametrize("dp_data", ["fabricated", "noisy"])
def test_pickled_dp_estimator_holds_no_training_row(digits, scanner, dp_data):
    clf = KAHMClassifier(10, 2, random_state=0, epsilon=2.0, dp_data=dp_data, bounds=(0.0, 1.0)).fit(
        digits.X_train, digits.y_train)
    assert scanner.in_object(clf) == set()
    assert scanner.in_bytes(pickle.dumps(clf)) == set()


# --------------------------------------------------------------------------- r and partition


@pytest.fixture
def blobs(tmp_path):
    X, y = make_class_blobs(600, 8, 3, random_state=2)
    return write_dataset(tmp_path / "s.zarr", X, y, chunk_rows=100), X


def _train(store, tmp_path, name, r_source, r_value, cluster_on, **kw):
    params = TrainParams(6, 2, epsilon=2.0, r_source=r_source, r_value=r_value)
    settings = TrainSettings(params, seed=9, block_size=100, cluster_on=cluster_on,  # S = 2 per class
                             bounds=(0.0, 1.0), **kw)
    train_pipeline(store, tmp_path / f"{name}.zarr", tmp_path / f"{name}.work", settings, progress=False)
    return tmp_path / f"{name}.zarr"


@pytest.mark.parametrize("r_source,r_value", [("passes", 3), ("threshold", 0.05)])
def test_post_processed_settings_never_use_r_or_clusters_of_the_original_rows(
        tmp_path, blobs, monkeypatch, r_source, r_value):
    """With r_source ∈ {passes, threshold} and cluster_on="noisy", the released model store
    is a function of the noisy rows: the tasks never read the original rows (r is never
    computed) and the k-means partition runs on the noisy rows. Replacing the original rows by
    zeros after the noise step changes nothing in the model store."""
    store, X = blobs
    reads, partition_inputs, r_inputs = [], [], []
    real_read, real_partition = tasks_mod._read_slice, train_mod.partition_classes
    real_fab = recipe_mod.fabricate_subset

    def spy_read(work_path, name, start, stop):
        reads.append(name)
        return real_read(work_path, name, start, stop)

    def spy_partition(source, *args, **kwargs):
        partition_inputs.append(np.asarray(source.compute()))
        return real_partition(source, *args, **kwargs)

    def spy_fab(private, *args, **kwargs):
        r_inputs.append(private)
        return real_fab(private, *args, **kwargs)

    monkeypatch.setattr(tasks_mod, "_read_slice", spy_read)
    monkeypatch.setattr(train_mod, "partition_classes", spy_partition)
    monkeypatch.setattr(recipe_mod, "fabricate_subset", spy_fab)
    # the same noise for both trainings (test-only seed), so that they can be compared
    with pytest.warns(PrivacyLeakWarning, match="fixed seed"):
        model = _train(store, tmp_path, "a", r_source, r_value, "noisy", insecure_noise_seed=5)
    assert GROUPED_X not in reads and reads
    assert not (tmp_path / "a.work" / GROUPED_X).exists()  # no private copy is even made
    assert r_inputs and all(r is None for r in r_inputs)
    noisy = zarr.open_array(str(tmp_path / "a.work" / "X_noisy"), mode="r")[...]
    by_class = np.argsort(store.y(), kind="stable")  # k-means runs on the class-grouped copy
    assert len(partition_inputs) == 1 and np.array_equal(partition_inputs[0], noisy[by_class])
    assert not np.array_equal(noisy, X)

    # zeros instead of the original rows for everything after the noise: same release
    def zeros_read(work_path, name, start, stop):
        out = real_read(work_path, name, start, stop)
        return np.zeros_like(out) if name == GROUPED_X else out

    monkeypatch.setattr(tasks_mod, "_read_slice", zeros_read)
    with pytest.warns(PrivacyLeakWarning, match="fixed seed"):
        other = _train(store, tmp_path, "b", r_source, r_value, "noisy", insecure_noise_seed=5)
    fps = [run_fingerprint(model), run_fingerprint(other)]
    for fp in fps:  # a random id per release, whatever the noise
        fp["manifest"]["kahm_dask_model"]["privacy"].pop("release_id")
    assert_same_fingerprint(*fps)
    # nothing but the DP rows, the models, the cluster table and public settings is released:
    # no r, no labels, no timing
    manifest = run_fingerprint(model)["manifest"]["kahm_dask_model"]
    assert all(set(entry) == {"class", "cluster", "n_rows"} for entry in manifest["clusters"])
    assert manifest["parameters"]["cluster_on"] == "noisy" and manifest["seed"] == 9  # k-means only: public
    for d in (model / "clusters").iterdir():
        assert set(os.listdir(d)) <= {"zarr.json", "_COMPLETE.json", "fabricated"} | {f"layer{k}" for k in range(2)}
        info = json.loads((d / "_COMPLETE.json").read_text())
        assert set(info) == {"class", "cluster", "n_rows", "passes", "layer_dims"}


def test_private_r_and_original_clusters_do_use_the_original_rows(tmp_path, blobs, monkeypatch):
    """The contrast (documented leaks that warn, docs/privacy.md): the paper's options read them."""
    store, X = blobs
    reads, partition_inputs = [], []
    real_read, real_partition = tasks_mod._read_slice, train_mod.partition_classes
    monkeypatch.setattr(tasks_mod, "_read_slice", lambda *a: reads.append(a[1]) or real_read(*a))
    monkeypatch.setattr(
        train_mod, "partition_classes",
        lambda src, *a, **k: partition_inputs.append(np.asarray(src.compute())) or real_partition(src, *a, **k),
    )
    with pytest.warns(PrivacyLeakWarning):
        _train(store, tmp_path, "c", "private", None, "original")
    assert GROUPED_X in reads
    np.testing.assert_array_equal(partition_inputs[0], X[np.argsort(store.y(), kind="stable")])
