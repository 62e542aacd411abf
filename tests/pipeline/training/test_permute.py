"""The permuted copy (kahm_dask/pipeline/training/permute.py): output row k is source row
order[k], for any chunking of the source and of the output; the staging array is gone after
the copy, also after a failure; an order that is not a permutation is refused before anything
is written; the staging inner chunks divide the shard and stay within their byte target."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from kahm_dask.pipeline.training.permute import STAGING_INNER_BYTES, permuted_copy, staging_inner_rows
from kahm_dask.storage.location import as_location


@pytest.mark.parametrize(("n", "in_chunk", "out_chunk"), [(500, 64, 64), (500, 64, 100), (333, 50, 7), (40, 64, 64)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_output_row_k_is_source_row_order_k(tmp_path, n, in_chunk, out_chunk, dtype):
    rng = np.random.default_rng(n + in_chunk + out_chunk)
    X = rng.standard_normal((n, 5)).astype(dtype)
    order = rng.permutation(n)
    target, staging = as_location(tmp_path / "out"), as_location(tmp_path / ".out.staging")
    out = permuted_copy(da.from_array(X, chunks=(in_chunk, 5)), order, target, staging, out_chunk)
    assert out.dtype == dtype and out.chunks[0][0] == min(out_chunk, n)
    np.testing.assert_array_equal(out.compute(), X[order])  # a copy: bit for bit
    assert not staging.exists()


@pytest.mark.parametrize("order", [np.array([0, 1, 1]), np.array([0, 1, -1]), np.array([0, 1, 3]),
                                   np.array([0, 1]), np.array([[0, 1, 2]])])
def test_an_order_that_is_not_a_permutation_is_refused_before_writing(tmp_path, order):
    X = da.from_array(np.arange(6.0).reshape(3, 2), chunks=(2, 2))
    with pytest.raises(ValueError, match="permutation of the 3 rows"):
        permuted_copy(X, order, as_location(tmp_path / "out"), as_location(tmp_path / ".s"), 2)
    assert list(tmp_path.iterdir()) == []


def _failing_block(x):
    raise RuntimeError("a chunk could not be read")


def test_the_staging_array_is_removed_after_a_failure(tmp_path):
    X = da.from_array(np.ones((10, 2)), chunks=(5, 2)).map_blocks(_failing_block, meta=np.empty((0, 0)))
    staging = as_location(tmp_path / ".s")
    with pytest.raises(RuntimeError, match="could not be read"):
        permuted_copy(X, np.arange(10), as_location(tmp_path / "out"), staging, 5)
    assert not staging.exists()


@pytest.mark.parametrize(("shard_rows", "row_bytes"), [(2048, 4096 * 4), (1000, 784 * 8), (7, 10**7), (997, 8)])
def test_inner_chunks_divide_the_shard_within_their_byte_target(shard_rows, row_bytes):
    inner = staging_inner_rows(shard_rows, row_bytes)
    assert shard_rows % inner == 0
    assert inner == 1 or inner * row_bytes <= STAGING_INNER_BYTES
    # the largest such divisor: the next larger divisor breaks the byte target
    larger = [d for d in range(inner + 1, shard_rows + 1) if shard_rows % d == 0]
    assert not larger or larger[0] * row_bytes > STAGING_INNER_BYTES


@pytest.mark.parametrize("wanted", [[7], [3, 4, 5, 0, 1, 9], [9, 2, 8, 3, 7, 4, 6, 5], []])
def test_gather_returns_the_wanted_rows_in_the_wanted_order(tmp_path, wanted):
    # runs of consecutive rows (read as one slice each), single rows and descending orders
    import zarr

    from kahm_dask.pipeline.training.permute import _gather

    rows = np.arange(30, dtype=np.float64).reshape(10, 3)
    zarr.create_array(str(tmp_path / "s.zarr"), data=rows, chunks=(2, 3), zarr_format=3)
    wanted = np.asarray(wanted, dtype=np.int64)
    got = _gather(wanted, as_location(tmp_path / "s.zarr"))
    assert got.shape == (wanted.size, 3)
    assert np.array_equal(got, rows[wanted])
