"""Post-processed DP settings read nothing private after the noise (docs/privacy.md): with
``r_source`` in {passes, threshold} and ``cluster_on="noisy"`` the pipeline's tasks never read
the original rows and k-means runs on the noisy rows, so the released model store is a function
of the noisy rows alone; the paper's options (private r, clusters of the original rows) do read
them, and warn.
"""

from __future__ import annotations

import json
import os

import dask.array as da
import numpy as np
import pytest
import zarr

from kahm_dask import recipe as recipe_mod
from kahm_dask.datasets import make_class_blobs
from kahm_dask.pipeline.stores.dataset import write_dataset
from kahm_dask.pipeline.training import TrainSettings, train_pipeline
from kahm_dask.pipeline.training import in_memory as in_memory_mod
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


class _Spies:
    """What a training run reads after the noise, on either route (``memory``: the rows held in
    worker memory, kahm_dask/pipeline/training/in_memory.py; ``zarr``: the work store's copies):
    the row sources each cluster task read, and the rows each k-means ran on. With
    ``zero_private``, the private rows are replaced by zeros for everything after the noise."""

    def __init__(self, monkeypatch, route: str, zero_private: bool = False):
        self.task_sources: list[set[str]] = []
        self.kmeans_inputs: list[np.ndarray] = []
        real_train = tasks_mod._train

        def train(read, *args, **kwargs):
            def spied_read():
                rows = read()
                self.task_sources.append(set(rows))
                return rows
            return real_train(spied_read, *args, **kwargs)

        monkeypatch.setattr(tasks_mod, "_train", train)
        if route == "zarr":
            monkeypatch.setattr(train_mod, "fits_in_memory", lambda *a, **k: False)
            real_read, real_partition = tasks_mod._read_slice, train_mod.partition_classes

            def read(work_path, name, start, stop):
                out = real_read(work_path, name, start, stop)
                return np.zeros_like(out) if zero_private and name == GROUPED_X else out

            def partition(source, *args, **kwargs):
                self.kmeans_inputs.append(np.asarray(source.compute()))
                return real_partition(source, *args, **kwargs)

            monkeypatch.setattr(tasks_mod, "_read_slice", read)
            monkeypatch.setattr(train_mod, "partition_classes", partition)
        else:
            real_held, real_kmeans = train_mod.partition_in_memory, in_memory_mod.partition_in_task

            def held(sources, *args, **kwargs):
                if zero_private and "X" in sources:
                    sources = {**sources, "X": da.zeros_like(sources["X"])}
                return real_held(sources, *args, **kwargs)

            def kmeans(rows, *args, **kwargs):
                self.kmeans_inputs.append(np.array(rows))
                return real_kmeans(rows, *args, **kwargs)

            monkeypatch.setattr(train_mod, "partition_in_memory", held)
            monkeypatch.setattr(in_memory_mod, "partition_in_task", kmeans)

    def kmeans_ran_on(self, rows: np.ndarray, y: np.ndarray) -> bool:
        """Whether the k-means inputs are ``rows`` grouped by class (one input of all classes on
        the Zarr route, one per class on the memory route, in any order)."""
        by_class = np.argsort(y, kind="stable")
        if len(self.kmeans_inputs) == 1:
            return np.array_equal(self.kmeans_inputs[0], rows[by_class])
        expected = [rows[y == c] for c in np.unique(y)]
        return len(self.kmeans_inputs) == len(expected) and all(
            any(x.shape == e.shape and np.array_equal(x, e) for x in self.kmeans_inputs) for e in expected)


ROUTES = ("memory", "zarr")


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("r_source,r_value", [("passes", 3), ("threshold", 0.05)])
def test_post_processed_settings_never_use_r_or_clusters_of_the_original_rows(
        tmp_path, blobs, monkeypatch, r_source, r_value, route):
    """With r_source ∈ {passes, threshold} and cluster_on="noisy", the released model store
    is a function of the noisy rows: the tasks never get the original rows (r is never
    computed) and the k-means partition runs on the noisy rows. Replacing the original rows by
    zeros after the noise step changes nothing in the model store. On both routes."""
    store, X = blobs
    r_inputs = []
    real_fab = recipe_mod.fabricate_subset

    def spy_fab(private, *args, **kwargs):
        r_inputs.append(private)
        return real_fab(private, *args, **kwargs)

    spies = _Spies(monkeypatch, route)
    monkeypatch.setattr(recipe_mod, "fabricate_subset", spy_fab)
    # the same noise for both trainings (test-only seed), so that they can be compared
    with pytest.warns(PrivacyLeakWarning, match="fixed seed"):
        model = _train(store, tmp_path, "a", r_source, r_value, "noisy", insecure_noise_seed=5)
    assert spies.task_sources and all(sources == {"X_noisy"} for sources in spies.task_sources)
    assert not (tmp_path / "a.work" / GROUPED_X).exists()  # no private copy is even made
    assert r_inputs and all(r is None for r in r_inputs)
    noisy = zarr.open_array(str(tmp_path / "a.work" / "X_noisy"), mode="r")[...]
    assert spies.kmeans_ran_on(noisy, store.y())
    assert not np.array_equal(noisy, X)

    # zeros instead of the original rows for everything after the noise: same release
    _Spies(monkeypatch, route, zero_private=True)
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


@pytest.mark.parametrize("route", ROUTES)
def test_private_r_and_original_clusters_do_use_the_original_rows(tmp_path, blobs, monkeypatch, route):
    """The contrast (documented leaks that warn, docs/privacy.md): the paper's options read them,
    on both routes; and zeroing them after the noise does change the model store."""
    store, X = blobs
    spies = _Spies(monkeypatch, route)
    with pytest.warns(PrivacyLeakWarning):
        model = _train(store, tmp_path, "c", "private", None, "original", insecure_noise_seed=5)
    assert spies.task_sources and all("X" in sources for sources in spies.task_sources)
    assert spies.kmeans_ran_on(X, store.y())
    _Spies(monkeypatch, route, zero_private=True)
    with pytest.warns(PrivacyLeakWarning):
        other = _train(store, tmp_path, "d", "private", None, "original", insecure_noise_seed=5)
    fps = [run_fingerprint(model), run_fingerprint(other)]
    for fp in fps:
        fp["manifest"]["kahm_dask_model"]["privacy"].pop("release_id")
    with pytest.raises(AssertionError):
        assert_same_fingerprint(*fps)
