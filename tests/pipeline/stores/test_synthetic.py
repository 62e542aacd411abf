"""The lazy synthetic generator: small tasks, data independent of the chunking, labels without rows."""

import cloudpickle
import dask
import numpy as np
import pytest

from kahm_dask.pipeline.stores.synthetic import (
    GENERATOR_ROWS,
    blob_labels,
    direction_labels,
    synthetic_blobs,
    synthetic_directions,
)


def _largest_task_bytes(X) -> int:
    graph = dict(X.__dask_graph__())
    return max(len(cloudpickle.dumps(task)) for task in graph.values())


def test_a_task_does_not_carry_the_data_set():
    """Regression: each task's closure carried the centres and per-row labels (~9 MB at
    264k × 4096); workers keep run tasks' descriptions, so 512-row ingests stalled on 1 GiB workers."""
    small, _ = synthetic_blobs(2_000, 64, 10, seed=0, chunk_rows=512)
    large, _ = synthetic_blobs(200_000, 4096, 10, seed=0, chunk_rows=512)
    assert _largest_task_bytes(large) < 8_192
    assert _largest_task_bytes(large) < 2 * _largest_task_bytes(small)  # does not grow with N or p


@pytest.mark.parametrize("chunk_rows", [100, GENERATOR_ROWS, 300, 1_000, 5_000])
def test_rows_do_not_depend_on_the_chunking(chunk_rows):
    reference, y = synthetic_blobs(1_234, 12, 3, seed=7, chunk_rows=1_234)
    X, y2 = synthetic_blobs(1_234, 12, 3, seed=7, chunk_rows=chunk_rows)
    assert X.chunks[0][0] == min(chunk_rows, 1_234)
    np.testing.assert_array_equal(X.compute(scheduler="sync"), reference.compute(scheduler="sync"))
    np.testing.assert_array_equal(y2, y)


def test_labels_match_rows_and_classes_are_separated():
    """Rows of a class lie nearer their class mean than other classes' means (the labels are the rows')."""
    X, y = synthetic_blobs(3_000, 32, 4, seed=1, chunk_rows=700)
    np.testing.assert_array_equal(blob_labels(3_000, 4, seed=1), y)
    X = X.compute(scheduler="sync")
    means = np.stack([X[y == c].mean(axis=0) for c in range(4)])
    nearest = ((X[:, None, :] - means[None]) ** 2).sum(axis=2).argmin(axis=1)
    assert (nearest == y).mean() > 0.95
    assert 0.0 < X.min() and X.max() < 1.0 and set(np.unique(y)) == {0, 1, 2, 3}


def test_seeds_and_dtype():
    a, ya = synthetic_blobs(500, 8, 2, seed=0, chunk_rows=128, dtype="float32")
    b, yb = synthetic_blobs(500, 8, 2, seed=1, chunk_rows=128, dtype="float32")
    assert a.dtype == np.float32 and a.compute(scheduler="sync").dtype == np.float32
    assert not np.array_equal(*dask.compute(a, b, scheduler="sync"))
    assert not np.array_equal(ya, yb)


# --------------------------------------------------------------------------- synthetic_directions


def test_directions_tasks_are_small_and_rows_do_not_depend_on_the_chunking():
    large, _ = synthetic_directions(200_000, 4096, 10, seed=0, chunk_rows=512)
    assert _largest_task_bytes(large) < 8_192
    reference, y = synthetic_directions(1_234, 40, 3, seed=7, chunk_rows=1_234, n_directions=5)
    for chunk_rows in (100, GENERATOR_ROWS, 300):
        X, y2 = synthetic_directions(1_234, 40, 3, seed=7, chunk_rows=chunk_rows, n_directions=5)
        np.testing.assert_array_equal(X.compute(scheduler="sync"), reference.compute(scheduler="sync"))
        np.testing.assert_array_equal(y2, y)
    np.testing.assert_array_equal(direction_labels(1_234, 3, seed=7), y)


def test_directions_class_means_differ_only_inside_the_signal_subspace():
    """The class-mean differences lie in the k-dimensional span of the signal (up to sampling
    noise), and their size grows with the amplitude; amplitude 0 leaves no class signal."""
    k, p = 4, 64
    means = {}
    for amplitude in (0.0, 0.5, 2.0):
        X, y = synthetic_directions(20_000, p, 5, seed=3, chunk_rows=4_096, n_directions=k, amplitude=amplitude)
        X = X.compute(scheduler="sync")
        assert 0.0 < X.min() and X.max() < 1.0
        means[amplitude] = np.stack([X[y == c].mean(axis=0) for c in range(5)])
    spread = {a: np.linalg.norm(m - m.mean(axis=0)) for a, m in means.items()}
    assert spread[0.0] < 0.1 * spread[0.5] < 0.1 * spread[2.0]
    diffs = means[2.0] - means[2.0].mean(axis=0)
    singular = np.linalg.svd(diffs, compute_uv=False)
    assert singular[k:].sum() < 0.05 * singular[:k].sum()  # 5 class means span at most k = 4 directions


def test_directions_classes_are_learnable_but_overlap():
    """Nearest class mean on clean rows: well above chance (1/4) and below 100 % (the
    within-class spread overlaps the classes)."""
    X, y = synthetic_directions(8_000, 256, 4, seed=1, chunk_rows=2_000, n_directions=8, amplitude=1.0)
    X = X.compute(scheduler="sync")
    train, test = slice(0, 6_000), slice(6_000, None)
    means = np.stack([X[train][y[train] == c].mean(axis=0) for c in range(4)])
    nearest = ((X[test][:, None, :] - means[None]) ** 2).sum(axis=2).argmin(axis=1)
    accuracy = (nearest == y[test]).mean()
    assert 0.6 < accuracy < 0.995


@pytest.mark.parametrize(
    "kwargs, match",
    [({"n_directions": 0}, "n_directions"), ({"n_directions": 9}, "n_features"),
     ({"amplitude": -1.0}, "amplitude"), ({"amplitude": float("nan")}, "amplitude")],
)
def test_directions_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        synthetic_directions(100, 8, 2, seed=0, **kwargs)
