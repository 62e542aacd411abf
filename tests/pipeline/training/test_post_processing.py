"""Post-processed DP settings read nothing private after the noise (docs/privacy.md): with
``r_source`` in {passes, threshold} and ``cluster_on="noisy"`` the pipeline's tasks never read
the original rows and k-means runs on the noisy rows, so the released model store is a function
of the noisy rows alone; the paper's options (private r, clusters of the original rows) do read
them, and warn.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import zarr

from kahm_dask import recipe as recipe_mod
from kahm_dask.datasets import make_class_blobs
from kahm_dask.pipeline.stores.dataset import write_dataset
from kahm_dask.pipeline.training import TrainSettings, train_pipeline
from kahm_dask.pipeline.training import tasks as tasks_mod
from kahm_dask.pipeline.training import train as train_mod
from kahm_dask.pipeline.training.tasks import GROUPED_X
from kahm_dask.privacy.randomness import PrivacyLeakWarning
from kahm_dask.recipe import TrainParams
from tests._kit import assert_same_fingerprint, run_fingerprint


@pytest.fixture
def blobs(tmp_path):
    X, y = make_class_blobs(600, 8, 3, random_state=2)
    return write_dataset(tmp_path / "s.zarr", X, y, chunk_rows=100), X


def _train(store, tmp_path, name, r_source, r_value, cluster_on, **kw):
    params = TrainParams(6, 2, epsilon=2.0, dp_data="fabricated", r_source=r_source, r_value=r_value)
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
        assert set(os.listdir(d)) <= {"zarr.json", "_COMPLETE.json", "dp_rows"} | {f"layer{k}" for k in range(2)}
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
