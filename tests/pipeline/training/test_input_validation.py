"""Bad input to the training pipeline (docs/reliability.md §1): a class of one row is refused up
front, n_components above the features warns, and duplicate rows and constant features train."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from kahm_dask.pipeline.predict import class_distance_array
from kahm_dask.pipeline.stores.dataset import open_dataset, write_dataset
from kahm_dask.pipeline.training import TrainSettings, train_pipeline
from kahm_dask.recipe import TrainParams
from tests._kit import write_small_stores


@pytest.fixture
def stores(tmp_path):
    """The stores of tests._kit.write_small_stores in tmp_path: s.zarr, s4.zarr, s1.zarr."""
    return write_small_stores(tmp_path)


def _blobs(n_per_class=30, p=6, seed=1):
    rng = np.random.default_rng(seed)
    centres = np.array([[0.2] * p, [0.8] * p])
    Xb = np.vstack([c + 0.05 * rng.standard_normal((n_per_class, p)) for c in centres])
    return Xb, np.repeat([0, 1], n_per_class)


def test_duplicate_rows_and_constant_features_through_the_pipeline(tmp_path):
    Xb, yb = _blobs(40)
    Xd = np.repeat(Xb[::2], 2, axis=0)
    Xd[:, 1] = 0.25
    yd = np.repeat(yb[::2], 2)
    store = write_dataset(tmp_path / "s.zarr", Xd, yd, chunk_rows=25)
    settings = TrainSettings(TrainParams(4, 3, epsilon=2.0, dp_data="fabricated", r_source="passes", r_value=3), seed=0)
    train_pipeline(store, tmp_path / "m.zarr", tmp_path / "w", settings, progress=False)
    D = class_distance_array(tmp_path / "m.zarr", da.from_array(Xb, chunks=(20, 6))).compute(scheduler="threads")
    assert np.isfinite(D).all() and D.shape == (80, 2)


@pytest.mark.parametrize("epsilon", [None, 1.0])
def test_pipeline_rejects_a_single_row_class_up_front(stores, epsilon):
    with pytest.raises(ValueError, match=r"class\(es\) \[1\] have fewer than 2 samples"):
        train_pipeline(open_dataset(stores / "s1.zarr"), stores / "m.zarr", stores / "w",
                       TrainSettings(TrainParams(3, 2, epsilon=epsilon), seed=0), progress=False)


def test_pipeline_warns_when_n_components_exceeds_features(stores):
    with pytest.warns(UserWarning, match="exceeds the number of features"):
        train_pipeline(open_dataset(stores / "s.zarr"), stores / "m.zarr", stores / "w",
                       TrainSettings(TrainParams(20, 2), seed=0), progress=False)
