"""cap_cluster_rows: the cluster-size cap that bounds every pipeline task's memory."""

import numpy as np
import pytest

from kahm_dask.partition import cap_cluster_rows


@pytest.mark.parametrize("max_rows", [2, 3, 7, 50, 1000])
def test_cap_bounds_sizes_and_only_splits(max_rows):
    rng = np.random.default_rng(max_rows)
    labels = rng.integers(0, 5, size=400) * 3  # labels need not be 0..S-1
    out = cap_cluster_rows(labels, max_rows)
    sizes = np.bincount(out)
    assert sizes.max() <= max_rows and sizes.min() >= 1
    assert np.array_equal(np.unique(out), np.arange(out.max() + 1))  # renumbered 0..S'-1
    for s in np.unique(labels):
        rows = labels == s
        parts = np.unique(out[rows])
        assert parts.size == -(-rows.sum() // max_rows)  # ⌈n / max_rows⌉ parts
        assert not np.isin(out[~rows], parts).any()  # a part never mixes clusters
        assert np.all(np.diff(out[rows]) >= 0)  # consecutive rows in row order
        assert np.ptp(np.bincount(out[rows])[parts]) <= 1  # near-equal parts


def test_cap_none_and_small_clusters_unchanged():
    labels = np.array([0, 1, 1, 2, 2, 2])
    assert cap_cluster_rows(labels, None) is labels
    assert cap_cluster_rows(labels, 3).tolist() == labels.tolist()


def test_cap_rejects_below_two():
    with pytest.raises(ValueError, match="max_rows must be >= 2"):
        cap_cluster_rows(np.zeros(4, dtype=int), 1)
