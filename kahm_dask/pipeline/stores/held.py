"""Training rows held in worker memory instead of a dataset store, for a non-private fit whose
rows fit there.

A non-private :meth:`~kahm_dask.pipeline.estimator.DaskKAHMClassifier.fit` on a NumPy or dask
array used to write the rows to a Zarr dataset store and read them back in the first training
stage: on MNIST (60 000 × 784) 2.4 s of a 16.6 s fit that the in-memory classifier never pays.
When the rows take the in-memory route of the training run anyway
(:func:`~kahm_dask.pipeline.training.in_memory.fits_in_memory`), :class:`HeldRows` gives
:func:`~kahm_dask.pipeline.training.train_pipeline` what it reads of a store (the shape, the
classes, the class codes and the rows as a dask array) without the round trip: the rows go from
the client's array (or the user's dask graph) straight to the tasks that split them by class.

A DP fit keeps the store: its release needs the rows' fingerprint and their keyed digests for
the privacy ledger, and it records the release in the store (see
:mod:`kahm_dask.pipeline.stores.dataset`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np

from kahm_dask.pipeline.stores.rows import checked_block, encode_labels, rows_per_chunk
from kahm_dask.pipeline.stores.sources import checked_labels

__all__ = ["HeldRows", "hold_rows"]


@dataclass(frozen=True, eq=False)
class HeldRows:
    """Rows (N, p) float64 and their class codes (N,) int64, read by the training run like a
    :class:`~kahm_dask.pipeline.stores.dataset.DatasetStore` (``classes[code]`` is the label of
    code ``code``). The rows are a lazy dask array whose tasks check every value (the store's
    check, :func:`~kahm_dask.pipeline.stores.rows.checked_block`) and whose names are random:
    dask's default name hashes the content, which would name private rows in every task key.

    >>> import numpy as np
    >>> held = hold_rows(np.arange(12.0).reshape(6, 2), np.array(["b", "a", "b", "a", "b", "b"]), chunk_rows=4)
    >>> held.classes, held.class_counts, held.n_samples, held.n_features, held.chunk_rows
    (('a', 'b'), {'a': 2, 'b': 4}, 6, 2, 4)
    >>> held.y().tolist()
    [1, 0, 1, 0, 1, 1]
    """

    rows: da.Array
    codes: np.ndarray
    classes: tuple[int | str, ...]

    @property
    def n_samples(self) -> int:
        """N, the number of rows."""
        return int(self.rows.shape[0])

    @property
    def n_features(self) -> int:
        """p, the number of features."""
        return int(self.rows.shape[1])

    @property
    def chunk_rows(self) -> int:
        """Rows per chunk of :meth:`X` (the first chunk's)."""
        return int(self.rows.chunks[0][0])

    @property
    def class_counts(self) -> dict[int | str, int]:
        """Each label's number of rows."""
        counts = np.bincount(self.codes, minlength=len(self.classes))
        return {label: int(n) for label, n in zip(self.classes, counts, strict=True)}

    def X(self) -> da.Array:
        """The rows, a lazy (N, p) float64 dask array."""
        return self.rows

    def y(self) -> np.ndarray:
        """The class codes, int64 array of shape (N,)."""
        return self.codes


def _checked(block: np.ndarray, block_info: Any = None) -> np.ndarray:
    """``block`` (m, p) as float64, ValueError naming the first non-finite entry's global row."""
    first_row = block_info[0]["array-location"][0][0] if block_info else 0
    return checked_block(block, np.dtype(np.float64), first_row)


def hold_rows(X: Any, y: Any, *, chunk_rows: int | None = None) -> HeldRows:
    """:class:`HeldRows` of X (N, p) (a NumPy array, checked by the caller, or a dask array,
    checked by its tasks) and labels y (N,) (NumPy, list or dask array; computed here).

    ``chunk_rows``: rows per chunk of a NumPy X (the stores' default, about 32 MiB, if None); a
    dask X keeps its row chunks and gets one chunk across the features.
    """
    if not isinstance(X, da.Array):
        X = np.asarray(X, dtype=np.float64)
    labels = checked_labels(X, y)
    name = f"kahm-held-rows-{uuid.uuid4().hex}"
    if isinstance(X, da.Array):
        rows = X.rechunk({1: -1}).map_blocks(_checked, dtype=np.float64, meta=np.empty((0, 0)), name=name)
    else:
        rows = da.from_array(X, chunks=(rows_per_chunk(chunk_rows, X.shape[0], X.shape[1], X.dtype), -1), name=name)
    classes, codes = encode_labels(labels)
    return HeldRows(rows, codes, tuple(classes))
