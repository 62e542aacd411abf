"""The permuted copy (kahm_dask/pipeline/training/permute.py): output row k is source row
order[k], for any chunking of the source and of the output; the copy carries the rows' codec
(zstd level 1); the staging files are gone after the copy, also after a failure, and stale ones
of an interrupted copy do not leak into the next; an order that is not a permutation is refused
before anything is written; the gather reads the wanted rows in the wanted order, also across
file boundaries."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import zarr
from zarr.codecs import ZstdCodec

from kahm_dask.pipeline.training.permute import _gather, _stage_chunk, permuted_copy
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
    assert ZstdCodec(level=1) in zarr.open_array(str(tmp_path / "out"), mode="r").metadata.codecs


@pytest.mark.parametrize("order", [np.array([0, 1, 1]), np.array([0, 1, -1]), np.array([0, 1, 3]),
                                   np.array([0, 1]), np.array([[0, 1, 2]])])
def test_an_order_that_is_not_a_permutation_is_refused_before_writing(tmp_path, order):
    X = da.from_array(np.arange(6.0).reshape(3, 2), chunks=(2, 2))
    with pytest.raises(ValueError, match="permutation of the 3 rows"):
        permuted_copy(X, order, as_location(tmp_path / "out"), as_location(tmp_path / ".s"), 2)
    assert list(tmp_path.iterdir()) == []


def _failing_block(x):
    raise RuntimeError("a chunk could not be read")


def test_the_staging_files_are_removed_after_a_failure(tmp_path):
    X = da.from_array(np.ones((10, 2)), chunks=(5, 2)).map_blocks(_failing_block, meta=np.empty((0, 0)))
    staging = as_location(tmp_path / ".s")
    with pytest.raises(RuntimeError, match="could not be read"):
        permuted_copy(X, np.arange(10), as_location(tmp_path / "out"), staging, 5)
    assert not staging.exists()


def test_stale_staging_files_of_an_interrupted_copy_are_not_read(tmp_path):
    X = np.arange(40.0).reshape(20, 2)
    staging = as_location(tmp_path / ".s")
    stale = np.full((10, 2), -1.0)
    for i in range(2):  # an earlier copy of other rows, killed before its clean-up
        _stage_chunk(stale, np.arange(10)[:, None], staging, block_id=(i, 0))
    order = np.random.default_rng(0).permutation(20)
    out = permuted_copy(da.from_array(X, chunks=(10, 2)), order, as_location(tmp_path / "out"), staging, 10)
    np.testing.assert_array_equal(out.compute(), X[order])
    assert not staging.exists()


@pytest.mark.parametrize("wanted", [[7], [3, 4, 5, 0, 1, 9], [9, 2, 8, 3, 7, 4, 6, 5], [3, 4, 5, 6], []])
def test_gather_returns_the_wanted_rows_in_the_wanted_order(tmp_path, wanted):
    # runs of consecutive rows (one read each), a run across two files ([3, 4, 5, 6] with files of
    # four rows), single rows and descending orders
    rows = np.arange(30, dtype=np.float32).reshape(10, 3)
    staging = as_location(tmp_path / ".s")
    for i, start in enumerate(range(0, 10, 4)):  # files of 4, 4 and 2 rows, in staging order
        _stage_chunk(rows[start:start + 4], np.arange(min(4, 10 - start))[:, None], staging, block_id=(i, 0))
    wanted = np.asarray(wanted, dtype=np.int64)
    got = _gather(wanted, staging, 4, 3, rows.dtype)
    assert got.shape == (wanted.size, 3) and got.dtype == rows.dtype
    assert np.array_equal(got, rows[wanted])


def test_a_staging_file_shorter_than_its_rows_is_an_error_not_garbage(tmp_path):
    staging = as_location(tmp_path / ".s")
    (staging / "0.rows").write_bytes(np.zeros((2, 3)).tobytes())
    with pytest.raises(EOFError, match="ends before byte"):
        _gather(np.array([0, 1, 2]), staging, 4, 3, np.dtype(np.float64))
