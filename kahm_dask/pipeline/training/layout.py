"""Row layouts of the work store: the class-grouped and the cluster-grouped copies.

Reading one class (for k-means) or one cluster (for its task) from the data store in its
original order touches every chunk of the store, because a class's rows are spread over all of
them. The pipeline therefore writes two reordered copies, each with
:func:`~kahm_dask.pipeline.training.permute.permuted_copy` (two passes over storage, one chunk per
task, so memory stays bounded however large the rows):

* the **class-grouped** copy — rows sorted by class code, original order within a class — so a
  class is one contiguous slice (one k-means input); every output chunk draws its rows from a
  few neighbouring input chunks;
* the **cluster-grouped** copy — rows sorted by (class code, cluster label), original order
  within a cluster — built from the class-grouped copy, so the rows of class c's clusters come
  only from class c's chunks and at most one class is in flight at a time.

Row order within every group is the original order, so the layouts never change what a task
computes (the pipeline stays bit-identical to the in-memory classifier).
"""

from __future__ import annotations

from dataclasses import dataclass

import dask.array as da
import numpy as np

from kahm_dask.pipeline.training.permute import permuted_copy
from kahm_dask.storage.location import LocationLike, as_location

__all__ = ["ClassLayout", "class_layout", "grouped_layout", "write_grouped"]


@dataclass(frozen=True)
class ClassLayout:
    """The class-grouped order of N rows.

    order  : (N,) int64 — position i of the copy holds original row ``order[i]``.
    bounds : ((c, start, stop), ...) — class code c occupies positions [start, stop).
    """

    order: np.ndarray
    bounds: tuple[tuple[int, int, int], ...]

    @property
    def groups(self) -> list[np.ndarray]:
        """The original row indices of every class, in copy order (a shuffle indexer)."""
        return [self.order[a:b] for _, a, b in self.bounds]

    @property
    def position(self) -> np.ndarray:
        """(N,) int64: the position in the copy of every original row (inverse of ``order``)."""
        pos = np.empty_like(self.order)
        pos[self.order] = np.arange(self.order.size)
        return pos


def class_layout(y_codes: np.ndarray) -> ClassLayout:
    """Class-grouped order of the rows with class codes ``y_codes`` (N,)."""
    y_codes = np.asarray(y_codes)
    order = np.argsort(y_codes, kind="stable").astype(np.int64)
    sorted_codes = y_codes[order]
    starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
    stops = np.r_[starts[1:], order.size]
    return ClassLayout(order, tuple((int(sorted_codes[a]), int(a), int(b)) for a, b in zip(starts, stops, strict=True)))


def grouped_layout(y_codes: np.ndarray, labels: np.ndarray) -> tuple[list[np.ndarray], list[tuple[int, int, int, int]]]:
    """Row order of the cluster-grouped copy and the (c, s, start, stop) table of its groups.

    Groups are sorted by class code, then cluster label; rows keep their original order.
    Returns the groups as arrays of original row indices and the table.
    """
    order = np.lexsort((np.arange(len(y_codes)), labels, y_codes))
    keys = np.stack([y_codes[order], labels[order]], axis=1)
    starts = np.flatnonzero(np.r_[True, np.any(keys[1:] != keys[:-1], axis=1)])
    stops = np.r_[starts[1:], len(order)]
    indexer = [order[a:b] for a, b in zip(starts, stops, strict=True)]
    table = [(int(keys[a, 0]), int(keys[a, 1]), int(a), int(b)) for a, b in zip(starts, stops, strict=True)]
    return indexer, table


def write_grouped(source: da.Array, groups: list[np.ndarray], path: LocationLike, chunk_rows: int) -> da.Array:
    """Write ``source`` (N, p) with its rows in the order of ``groups`` (arrays of row indices
    of ``source`` that, concatenated, are a permutation of its rows) to a Zarr array at ``path``
    (a local path or a :class:`~kahm_dask.storage.location.Location`) with (chunk_rows, p)
    chunks; returns it as a dask array read back from Zarr. The staging files of the copy are in
    a hidden sibling folder of ``path``, removed when the copy is written."""
    target = as_location(path)
    order = np.concatenate(groups) if groups else np.empty(0, dtype=np.int64)
    return permuted_copy(source, order, target, target.with_name(f".{target.name}.staging"), chunk_rows)
