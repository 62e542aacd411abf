"""Resume (docs/reliability.md §3): a rerun of an interrupted training repairs every kind of
damage an interrupted writer leaves and gives the same model; a model retrained at the same path
is not served from a worker's cache; a rerun with other settings never mixes two models."""

from __future__ import annotations

import shutil

import dask.array as da
import numpy as np
import pytest

from kahm_dask.pipeline.predict import class_distance_array
from kahm_dask.pipeline.stores.model import cluster_dir, load_cluster
from tests._kit import interrupt_after_training, small_training, train_small


@pytest.fixture
def small(tmp_path):
    return small_training(tmp_path)


def _distances(model_path, X):
    return class_distance_array(model_path, da.from_array(X, chunks=(60, X.shape[1]))).compute(scheduler="threads")


def test_rerun_repairs_every_kind_of_damage_and_gives_the_same_model(tmp_path, small, route):
    store, labels, X = small
    first = train_small(store, labels, tmp_path)
    reference = _distances(tmp_path / "m.zarr", X)
    staged = interrupt_after_training(tmp_path / "m.zarr", tmp_path / "w")  # before the commit
    clusters = staged / "clusters"
    shutil.rmtree(clusters / "c0_s1")  # lost
    (clusters / "c1_s0" / "_COMPLETE.json").unlink()  # renamed, not marked (older writer)
    (clusters / "c2_s1" / "_COMPLETE.json").write_text("{")  # damaged marker
    partial = clusters / ".c2_s0.tmp-0123456789abcdef"  # a writer killed mid-write
    shutil.copytree(clusters / "c2_s0", partial)
    shutil.rmtree(partial / "layer1")

    second = train_small(store, labels, tmp_path)
    assert second["n_resumed"] == first["n_clusters"] - 3
    np.testing.assert_array_equal(_distances(tmp_path / "m.zarr", X), reference)


def test_cached_cluster_reloads_a_cluster_retrained_at_the_same_path(tmp_path, small):
    """A long-lived worker keeps loaded clusters in a per-process cache; retraining a model
    into the same path must not serve the old clusters."""
    store, labels, X = small
    train_small(store, labels, tmp_path)
    old = _distances(tmp_path / "m.zarr", X)  # fills this process's cache
    shutil.rmtree(tmp_path / "m.zarr")
    shutil.rmtree(tmp_path / "w")
    train_small(store, labels, tmp_path, n_layers=3)  # another model, same paths
    new = _distances(tmp_path / "m.zarr", X)
    fresh = np.stack([
        np.min([load_cluster(cluster_dir(tmp_path / "m.zarr", c, s)).distance(X) for s in (0, 1)], axis=0)
        for c in range(3)
    ], axis=1)
    assert not np.array_equal(new, old)
    np.testing.assert_array_equal(new, fresh)


def test_rerun_with_other_settings_does_not_mix_models(tmp_path, small):
    store, labels, X = small
    train_small(store, labels, tmp_path, n_layers=2)
    try:
        summary = train_small(store, labels, tmp_path, n_layers=3)
    except ValueError as exc:
        assert "other settings" in str(exc)
        return
    assert summary["n_resumed"] == 0
    for d in (tmp_path / "m.zarr" / "clusters").iterdir():
        assert len(load_cluster(d).layers_) == 3
