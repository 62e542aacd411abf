"""Rows and labels on their way into a dataset store: checks, conversions and chunk sizes.

Every reader of :mod:`kahm_dask.pipeline.stores.sources` and the store builder of
:mod:`kahm_dask.pipeline.stores.dataset` check their input here, so a bad input gets the same clear
message (naming the row and column, and the fix) whatever its format. Feature rows are
appended to the store's growing ``X`` array block by block, each block checked before it is
written and hashed as it is written (:class:`WrittenRows`), so the store's fingerprint needs no
second pass over the rows.
"""

from __future__ import annotations

import numbers
from collections.abc import Generator
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from kahm_dask.privacy.fingerprint import partial_sums

__all__ = [
    "Block",
    "TARGET_CHUNK_BYTES",
    "rows_per_chunk",
    "default_chunk_rows",
    "check_matrix_shape",
    "check_length",
    "label_array",
    "encode_labels",
    "checked_block",
    "WrittenRows",
    "store_block",
    "write_blocks",
]

#: Default size of one chunk of ``X`` (rows × features × itemsize), in bytes.
TARGET_CHUNK_BYTES = 32 * 2**20

# One block of consecutive rows: features (n, p) and their raw labels (n,).
Block = tuple[np.ndarray, np.ndarray]


# ------------------------------------------------------------------------ chunk sizes


def rows_per_chunk(requested: int | None, n_rows: int, n_features: int, dtype: np.dtype) -> int:
    """Rows per chunk of ``X``: ``requested`` (checked), else the default capped at ``n_rows``."""
    if requested is None:
        return max(1, min(default_chunk_rows(n_features, dtype), n_rows))
    if isinstance(requested, bool) or not isinstance(requested, numbers.Integral) \
            or requested < 1:
        raise ValueError(f"chunk_rows must be a positive integer, got {requested!r}.")
    return int(requested)


def default_chunk_rows(n_features: int, dtype: np.dtype) -> int:
    """Rows of ``n_features`` values of ``dtype`` in about :data:`TARGET_CHUNK_BYTES`."""
    return max(1, TARGET_CHUNK_BYTES // (n_features * dtype.itemsize))


# ------------------------------------------------------------------------ checks


def check_matrix_shape(shape: tuple[int, ...], dtype: np.dtype, name: str) -> None:
    """Raise unless ``shape`` is (n >= 1, p >= 1) and ``dtype`` holds real numbers."""
    if len(shape) != 2:
        raise ValueError(f"{name} must be 2-D of shape (n_samples, n_features), got shape "
                         f"{tuple(shape)}. Reshape it with .reshape(len(X), -1).")
    if shape[0] < 1 or shape[1] < 1:
        raise ValueError(f"{name} has shape {tuple(shape)}; need at least one row and one "
                         "feature.")
    if np.dtype(dtype).kind not in "biuf":
        raise TypeError(f"{name} must hold real numbers, got dtype {dtype}.")


def check_length(labels: np.ndarray, n_rows: int, y_name: str, x_name: str) -> None:
    """Raise unless there is one label (``labels``, shape (n,)) per row of ``x_name``."""
    if len(labels) != n_rows:
        raise ValueError(f"{y_name} has {len(labels)} labels but {x_name} has {n_rows} rows; "
                         "they must match.")


def label_array(y: Any, name: str) -> np.ndarray:
    """Labels as a 1-D int64 or str array; TypeError for mixed or unsupported types."""
    arr = np.asarray(y) if hasattr(y, "__array__") else np.asarray(y, dtype=object)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D of shape (n_samples,), got shape {arr.shape}.")
    if arr.dtype.kind == "O":
        arr = _typed_labels(arr, name)
    kind = arr.dtype.kind
    if kind in "iu":
        return arr.astype(np.int64)
    if kind in "US":
        return arr.astype(str)
    if kind == "f":
        if np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            return arr.astype(np.int64)
        raise TypeError(f"{name} holds non-integer floats; labels must be integers or "
                        "strings.")
    raise TypeError(f"{name} must hold integer or string labels, got dtype {arr.dtype}.")


def encode_labels(labels: np.ndarray) -> tuple[list[int | str], np.ndarray]:
    """Sorted class values (JSON-able list) and int64 codes of shape (N,) of ``labels`` (N,):
    ``classes[codes[i]] == labels[i]``."""
    classes, codes = np.unique(labels, return_inverse=True)
    return classes.tolist(), codes.astype(np.int64).ravel()


_LABEL_TYPES = {"int": np.int64, "float": np.float64, "str": str}


def _typed_labels(arr: np.ndarray, name: str) -> np.ndarray:
    """An object array of labels converted to one type: int64, float64 or str."""
    kinds = {_label_kind(v) for v in arr}
    if len(kinds) > 1 or not kinds <= _LABEL_TYPES.keys():
        raise TypeError(f"{name} has labels of type(s) {', '.join(sorted(kinds))}; labels "
                        "must be all integers or all strings (mixed types are ambiguous: "
                        "convert them, e.g. with y.astype(str)).")
    return arr.astype(_LABEL_TYPES[kinds.pop()] if kinds else np.int64)


def _label_kind(value: Any) -> str:
    if isinstance(value, bool | np.bool_):
        return type(value).__name__
    if isinstance(value, numbers.Integral):
        return "int"
    if isinstance(value, numbers.Real):
        return "float"
    if isinstance(value, str):
        return "str"
    return type(value).__name__


def checked_block(block: np.ndarray, dtype: np.dtype, first_row: int) -> np.ndarray:
    """``block`` (n, p) cast to ``dtype``; ValueError naming the first non-finite entry.

    ``first_row`` is the store row of ``block[0]``, so the message names the global row.
    """
    with np.errstate(over="ignore"):
        out = np.asarray(block, dtype=dtype)
    finite = np.isfinite(out)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        value = np.asarray(block)[row, col]
        if np.isfinite(value):
            why = f"overflows {dtype}; ingest with dtype='float64'"
        else:
            why = "is NaN or infinite; remove or impute such values before ingesting"
        raise ValueError(f"X has a non-finite value at row {first_row + row}, column {col}: "
                         f"{value} {why}.")
    return out


# ------------------------------------------------------------------------ writing rows


@dataclass(frozen=True)
class WrittenRows:
    """What writing the rows of a store gives back: the raw ``labels`` (N,) and ``lanes``, the
    fingerprint's lane sums (uint64, (4,); :func:`~kahm_dask.privacy.fingerprint.partial_sums`)
    of the values *as stored* (after the cast to the store's dtype), summed over all blocks."""

    labels: np.ndarray
    lanes: np.ndarray


def write_blocks(x: zarr.Array, blocks: Generator[Block, None, None]) -> WrittenRows:
    """Append row blocks to the (0, p) array ``x``, checking and hashing each; return all
    labels (N,) and the lane sums of the stored rows.

    ``blocks`` is closed even on error, so a reader's open file is closed at once.
    """
    labels = []
    lanes = np.zeros(4, dtype=np.uint64)
    with closing(blocks):
        for features, block_labels in blocks:
            start = x.shape[0]
            x.resize((start + len(features), *x.shape[1:]))
            lanes += store_block(x, features, start)
            labels.append(np.asarray(block_labels))
    if x.shape[0] == 0:
        raise ValueError("The source has no rows; a dataset needs at least one row.")
    return WrittenRows(np.concatenate(labels), lanes)


def store_block(x: zarr.Array, block: np.ndarray, start: int) -> np.ndarray:
    """Check ``block`` (n, p) (:func:`checked_block`), write it as rows ``start:start+n`` of ``x``
    and return the fingerprint lanes (uint64, (4,)) of the values as stored: after the cast to
    ``x``'s dtype. The one place a block of a store's rows is checked, written and hashed."""
    checked = checked_block(block, x.dtype, start)
    x[start : start + len(checked)] = checked
    return partial_sums(checked, start)
