"""The work store's row layouts: class-grouped and cluster-grouped copies, and the per-class
k-means on the class-grouped copy (held in memory or re-read: same labels)."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import zarr

from kahm_dask.pipeline.training.layout import class_layout, grouped_layout, write_grouped
from kahm_dask.pipeline.training.partition import POWER_ITERATIONS, partition_classes, scalable_kmeans_init


@pytest.fixture
def rows():
    rng = np.random.default_rng(4)
    y = rng.integers(0, 3, size=500)
    X = rng.standard_normal((500, 6)) + 4.0 * y[:, None]
    return X, y


def test_class_layout_sorts_by_class_and_keeps_original_order(rows):
    _, y = rows
    layout = class_layout(y)
    assert [c for c, _, _ in layout.bounds] == [0, 1, 2]
    for c, a, b in layout.bounds:
        block = layout.order[a:b]
        assert np.all(y[block] == c) and np.all(np.diff(block) > 0)
        assert b - a == np.sum(y == c)
    np.testing.assert_array_equal(layout.order[layout.position], np.arange(y.size))
    assert [len(g) for g in layout.groups] == [b - a for _, a, b in layout.bounds]


def test_write_grouped_reorders_rows_and_cuts_long_groups(tmp_path, rows):
    X, y = rows
    layout = class_layout(y)  # groups of ~170 rows, longer than a 64-row chunk
    out = write_grouped(da.from_array(X, chunks=(64, 6)), layout.groups, tmp_path / "g", 64)
    np.testing.assert_array_equal(out.compute(), X[layout.order])
    assert zarr.open_array(str(tmp_path / "g"), mode="r").chunks == (64, 6)
    assert out.chunks[1] == (6,)


def test_cluster_groups_through_the_class_grouped_copy_equal_the_direct_copy(tmp_path, rows):
    X, y = rows
    labels = np.random.default_rng(1).integers(0, 4, size=y.size)
    layout = class_layout(y)
    by_class = write_grouped(da.from_array(X, chunks=(64, 6)), layout.groups, tmp_path / "c", 64)
    groups, table = grouped_layout(y, labels)
    composed = write_grouped(by_class, [layout.position[g] for g in groups], tmp_path / "g", 64)
    grouped = composed.compute()
    np.testing.assert_array_equal(grouped, X[np.concatenate(groups)])
    for c, s, a, b in table:
        np.testing.assert_array_equal(grouped[a:b], X[(y == c) & (labels == s)])


def test_partition_labels_do_not_depend_on_holding_classes_in_memory(rows):
    X, y = rows
    layout = class_layout(y)
    Xg = da.from_array(X[layout.order], chunks=(100, 6))
    kw = dict(n_components=3, block_size=60, s_rule="round", min_cluster_size=None,
              seed=np.random.SeedSequence(5), init_max_iter=2, max_iter=10)
    streamed = partition_classes(Xg, layout.bounds, persist_bytes=0, **kw)
    held = partition_classes(Xg, layout.bounds, persist_bytes=X.nbytes, **kw)
    np.testing.assert_array_equal(held, streamed)
    for _, a, b in layout.bounds:  # S = round(N_c / 60) ≥ 2 clusters per class
        assert streamed[a:b].max() >= 1


def test_scalable_init_gives_data_rows_reproducibly_and_one_centre_per_blob():
    rng = np.random.default_rng(8)
    centres = 20.0 * np.eye(3, 6)
    X = np.vstack([c + rng.standard_normal((200, 6)) for c in centres])
    Xd = da.from_array(X, chunks=(128, 6))
    init = [scalable_kmeans_init(Xd, 3, np.random.SeedSequence(2), oversampling_factor=6, rounds=3) for _ in range(2)]
    np.testing.assert_array_equal(init[0], init[1])
    assert all(np.any(np.all(X == c, axis=1)) for c in init[0])  # every centre is a data row
    nearest_blob = np.argmin(((init[0][:, None, :] - centres[None]) ** 2).sum(-1), axis=1)
    assert sorted(nearest_blob) == [0, 1, 2]


def test_high_dimensional_modes_split_without_tiny_clusters():
    """Regression: dask-ml's unweighted k-means|| re-clustering gave clusters of 1–5 rows on
    high-dimensional Gaussian modes (the rule of
    docs/algorithm.md#kmeans-partition then re-ran k-means for every S − 1)."""
    from kahm_dask.pipeline.stores.synthetic import synthetic_blobs
    from kahm_dask.pipeline.training.partition import partition_class

    X, y = synthetic_blobs(3000, 1024, 1, seed=0, chunk_rows=512, modes_per_class=4)
    labels = partition_class(X, 6, min_cluster_size=30, seed=np.random.SeedSequence(1),
                             init_max_iter=3, max_iter=20)
    sizes = np.bincount(labels)
    assert sizes.size == 6 and sizes.min() >= 100, sizes  # S = 6 kept at the first attempt


def _low_rank_classes(n_per_class=400, p=80, rank=8, seed=6):
    """Three classes of rows with rank-``rank`` centred structure in ``p`` features (two blobs
    each), and the class-grouped layout."""
    rng = np.random.default_rng(seed)
    X, y = [], []
    for c in range(3):
        basis = np.linalg.qr(rng.standard_normal((p, rank)))[0].T  # (rank, p), orthonormal rows
        coords = rng.standard_normal((n_per_class, rank)) + 6.0 * (rng.random(n_per_class) < 0.5)[:, None]
        X.append(coords @ basis + rng.standard_normal(p))
        y.append(np.full(n_per_class, c))
    return np.vstack(X), np.concatenate(y)


def test_out_of_core_principal_coordinates_keep_every_distance_of_low_rank_rows():
    """On rows whose centred rank is at most n_dims the randomized range is exact, so the
    coordinates are an isometry of the centred rows: their Gram matrices agree up to the
    rounding of the 2q + 3 passes (bound: 10·u·N·p for each, and one more, relative to the
    largest entry)."""
    from kahm_dask.pipeline.training.partition import principal_coordinates

    X, _ = _low_rank_classes()
    Y = X[:400]
    Z = principal_coordinates(da.from_array(Y, chunks=(96, -1)), 20, np.random.SeedSequence(1)).compute()
    Yc = Y - Y.mean(axis=0)
    gram = Yc @ Yc.T
    N, p = Y.shape
    bound = 10 * np.finfo(float).eps * N * p * (2 * POWER_ITERATIONS + 4) * np.abs(gram).max()
    assert Z.shape == (N, 20)
    assert np.abs(Z @ Z.T - gram).max() <= bound


def test_a_class_too_large_for_a_task_is_clustered_in_its_principal_coordinates(monkeypatch):
    """A class whose rows exceed a task but whose kmeans_dims coordinates fit one gets the
    estimator's k-means on out-of-core principal coordinates (no dask-ml): on rows of rank ≤
    kmeans_dims those are an isometry of the rows the estimator clusters, so the labels are the
    ones the in-task route gives."""
    import kahm_dask.pipeline.training.partition as partition_mod

    X, y = _low_rank_classes()
    layout = class_layout(y)
    Xg = da.from_array(X[layout.order], chunks=(96, -1))
    kw = dict(n_components=5, block_size=200, s_rule="round", min_cluster_size=None,
              seed=np.random.SeedSequence(9), kmeans_dims=20)
    in_task = partition_classes(Xg, layout.bounds, task_bytes=3 * 400 * 8 * 80, **kw)
    monkeypatch.setattr(partition_mod, "partition_class", None)  # the dask-ml route would fail
    projected = partition_classes(Xg, layout.bounds, task_bytes=3 * 400 * 8 * 20, **kw)
    for _, a, b in layout.bounds:
        assert projected[a:b].max() == 1  # S = round(400 / 200) = 2 clusters: k-means ran
    np.testing.assert_array_equal(projected, in_task)
    with pytest.raises(TypeError):  # and below that, the class takes the dask-ml route
        partition_classes(Xg, layout.bounds, task_bytes=3 * 400 * 8 * 20 - 1, **kw)


class _CountingRows:
    """Rows that count the blocks read from them (a stand-in for a Zarr array)."""

    def __init__(self, X: np.ndarray) -> None:
        self.X, self.shape, self.dtype, self.ndim, self.reads = X, X.shape, X.dtype, X.ndim, 0

    def __getitem__(self, key):
        self.reads += 1
        return self.X[key]


def test_a_projected_class_held_in_memory_is_read_once_with_the_same_labels():
    """Holding a class in worker memory (its rows within ``persist_bytes``) makes the 2q + 3
    passes of its principal coordinates read memory instead of the store: each block of the
    class is read once, and the labels are the streamed ones (the same arithmetic)."""
    X, y = _low_rank_classes()
    layout = class_layout(y)
    kw = dict(n_components=5, block_size=200, s_rule="round", min_cluster_size=None,
              seed=np.random.SeedSequence(9), kmeans_dims=20, task_bytes=3 * 400 * 8 * 20)
    results = {}
    for persist_bytes in (0, 400 * X.shape[1] * X.itemsize):
        rows = _CountingRows(X[layout.order])
        Xg = da.from_array(rows, chunks=(96, -1))
        rows.reads = 0  # from_array's own look at the rows (their meta)
        results[persist_bytes] = partition_classes(Xg, layout.bounds, persist_bytes=persist_bytes, **kw), rows.reads
    blocks = sum(len(range(a // 96, (b - 1) // 96 + 1)) for _, a, b in layout.bounds)  # blocks each class overlaps
    (streamed, streamed_reads), (held, held_reads) = results.values()
    np.testing.assert_array_equal(held, streamed)
    assert held_reads == blocks
    assert streamed_reads >= (2 * POWER_ITERATIONS + 3) * blocks
