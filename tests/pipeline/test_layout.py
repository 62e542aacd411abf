"""The work store's row layouts: class-grouped and cluster-grouped copies, and the per-class
k-means on the class-grouped copy (held in memory or re-read: same labels)."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import zarr

from kahm_dask.pipeline.layout import class_layout, grouped_layout, write_grouped
from kahm_dask.pipeline.partition import partition_classes


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
    composed = write_grouped(by_class, [layout.position[g].tolist() for g in groups], tmp_path / "g", 64)
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
    for c, a, b in layout.bounds:  # S = round(N_c / 60) ≥ 2 clusters per class
        assert streamed[a:b].max() >= 1
