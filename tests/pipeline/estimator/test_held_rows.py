"""A non-private fit whose rows fit the workers' memory trains from them directly: no dataset
store written and read back, the same model as the store's route; larger rows, and every DP fit,
keep the store."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from kahm_dask import DaskKAHMClassifier
from kahm_dask.pipeline.stores.dataset import write_dataset
from kahm_dask.pipeline.stores.held import hold_rows
from kahm_dask.pipeline.training import train_pipeline

SEED = 0


@pytest.fixture(scope="module")
def three_digits(digits):
    keep, test = digits.y_train < 3, digits.y_test < 3
    return digits.X_train[keep], digits.y_train[keep], digits.X_test[test]


def test_a_non_private_fit_writes_no_data_store_and_matches_the_stores_route(client, three_digits, tmp_path):
    X, y, X_test = three_digits
    held = DaskKAHMClassifier(random_state=SEED, store_dir=tmp_path / "held").fit(da.from_array(X, chunks=(100, -1)), y)
    assert not (tmp_path / "held" / "train.zarr").exists()
    store = write_dataset(tmp_path / "train.zarr", X, y, chunk_rows=100)
    stored = DaskKAHMClassifier(random_state=SEED, store_dir=tmp_path / "stored").fit(str(store.path))
    np.testing.assert_array_equal(held.class_distances(X_test), stored.class_distances(X_test))


def test_rows_above_the_memory_share_go_through_the_store(client, three_digits, tmp_path):
    X, y, X_test = three_digits
    est = DaskKAHMClassifier(random_state=SEED, persist_fraction=0.0, store_dir=tmp_path / "s").fit(X, y)
    assert (tmp_path / "s" / "train.zarr").is_dir()
    again = DaskKAHMClassifier(random_state=SEED, store_dir=tmp_path / "s").fit(X, y)  # held: the old copy goes
    assert not (tmp_path / "s" / "train.zarr").exists()
    np.testing.assert_array_equal(est.class_distances(X_test), again.class_distances(X_test))


def test_a_non_finite_value_in_dask_rows_is_named_by_its_row(client, three_digits, tmp_path):
    X, y, _ = three_digits
    X = X.copy()
    X[107, 5] = np.nan
    with pytest.raises(ValueError, match=r"^X has a non-finite value at row 107, column 5: nan"):
        DaskKAHMClassifier(random_state=SEED, store_dir=tmp_path).fit(da.from_array(X, chunks=(100, -1)), y)


def test_held_rows_check_their_labels():
    with pytest.raises(ValueError, match="y has 3 labels but X has 4 rows"):
        hold_rows(np.zeros((4, 2)), [0, 1, 0])
    with pytest.raises(ValueError, match="unknown chunk sizes"):
        hold_rows(da.from_array(np.zeros((4, 2)), chunks=2)[da.from_array(np.array([True] * 4))], [0, 1, 0, 1])


def test_a_dp_run_refuses_rows_that_are_not_a_store(tmp_path):
    held = hold_rows(np.random.default_rng(0).random((20, 3)), np.arange(20) % 2)
    settings = DaskKAHMClassifier(epsilon=1.0, bounds=(0, 1)).train_settings()
    with pytest.raises(TypeError, match="DP training run reads its rows from a dataset store"):
        train_pipeline(held, tmp_path / "model.zarr", tmp_path / "work", settings)
