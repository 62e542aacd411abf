"""Zarr v3 dataset store: ingest, open, append, and atomic write helpers.

A dataset store is a Zarr v3 group on the local filesystem::

    <path>/
      zarr.json              group attributes {"kahm_dask": {...}} (see below)
      X                      float64 (or float32), shape (N, p), chunks (chunk_rows, p)
      y                      int64, shape (N,), codes into attrs["kahm_dask"]["classes"]
      class_index/<code>     int64, shape (N_code,), sorted row numbers of class ``code``

``attrs["kahm_dask"]`` holds ``format_version`` (1), ``n_samples``, ``n_features``,
``classes`` (JSON list of ints or of strings, position = code), ``class_counts`` (list
aligned with ``classes``), ``source``, ``created`` (ISO 8601, UTC) and, only when the
caller passes a public range, ``feature_range`` ({"min": [...], "max": [...]}). The
minimum and maximum of the private data are never computed or stored: they are private.

Stores are created in a temporary sibling directory ``<path>.tmp-<uuid>`` and renamed into
place when complete, so an interrupted ingest never leaves a half-written store at
``<path>``. Arrays are read lazily as Dask arrays backed by Zarr; no cluster is needed.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import numbers
import os
import shutil
import uuid
import zipfile
from collections.abc import Callable, Generator, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import dask
import dask.array as da
import numpy as np
import zarr

__all__ = [
    "FORMAT_VERSION",
    "StoreError",
    "DatasetStore",
    "write_dataset",
    "ingest",
    "append_rows",
    "open_dataset",
    "write_array_atomic",
    "read_group_attrs",
    "mark_complete",
    "is_complete",
]

FORMAT_VERSION = 1
ATTRS_KEY = "kahm_dask"
COMPLETE_FILE = "_COMPLETE.json"
TARGET_CHUNK_BYTES = 32 * 2**20
SKLEARN_DATASETS = ("digits", "breast_cancer", "iris", "wine")

PathLike = str | os.PathLike[str]
# One block of consecutive rows: features (n, p) and their raw labels (n,).
Block = tuple[np.ndarray, np.ndarray]


class StoreError(ValueError):
    """A path is not a valid, consistent kahm-dask store (the message says why)."""


# --------------------------------------------------------------------------- the store


@dataclass(frozen=True)
class DatasetStore:
    """Handle on a dataset store; reads are lazy (``X``) or row-selective.

    ``classes[code]`` is the original label of code ``code``; ``class_counts`` maps each
    original label to its number of rows; ``attrs`` is the ``kahm_dask`` attribute dict.
    """

    path: Path
    n_samples: int
    n_features: int
    classes: tuple[int | str, ...]
    class_counts: dict[int | str, int]
    chunk_rows: int
    attrs: dict[str, Any]

    def X(self) -> da.Array:
        """Lazy Dask array of shape (N, p) reading from Zarr; row chunks = Zarr chunks."""
        return da.from_zarr(str(self.path), component="X")

    def y(self) -> np.ndarray:
        """Class codes, int64 array of shape (N,)."""
        return np.asarray(self._array("y")[:], dtype=np.int64)

    def labels(self) -> np.ndarray:
        """Original class labels, array of shape (N,) (int64 or str)."""
        return np.asarray(self.classes)[self.y()]

    def class_rows(self, code: int) -> np.ndarray:
        """Sorted int64 row numbers, shape (N_code,), of the rows of class ``code``."""
        n_classes = len(self.classes)
        if isinstance(code, bool) or not isinstance(code, numbers.Integral):
            raise TypeError(f"class code must be an integer, got {code!r}.")
        if not 0 <= code < n_classes:
            raise ValueError(
                f"class code {code} is out of range: the store has {n_classes} classes "
                f"(codes 0..{n_classes - 1})."
            )
        return np.asarray(self._array(f"class_index/{int(code)}")[:], dtype=np.int64)

    def read_rows(self, rows: Any) -> np.ndarray:
        """Rows ``rows`` (1-D ints, any order, repeats allowed) of X: float64 (len(rows), p).

        Zarr's orthogonal indexing reads only the chunks that hold requested rows.
        """
        rows = np.asarray(rows)
        if rows.ndim != 1 or (rows.size and rows.dtype.kind not in "iu"):
            raise TypeError(
                f"rows must be a 1-D array of integer row numbers, got dtype {rows.dtype} "
                f"and shape {rows.shape}."
            )
        if rows.size == 0:
            return np.empty((0, self.n_features), dtype=np.float64)
        if rows.min() < 0 or rows.max() >= self.n_samples:
            raise IndexError(
                f"row numbers must lie in [0, {self.n_samples}); got values from "
                f"{rows.min()} to {rows.max()}."
            )
        unique, inverse = np.unique(rows, return_inverse=True)
        data = self._array("X").oindex[unique]
        return np.asarray(data, dtype=np.float64)[inverse]

    def read_slice(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of X as float64 array of shape (stop - start, p)."""
        if not 0 <= start <= stop <= self.n_samples:
            raise IndexError(
                f"need 0 <= start <= stop <= {self.n_samples}, got start={start}, "
                f"stop={stop}."
            )
        return np.asarray(self._array("X")[start:stop], dtype=np.float64)

    def _array(self, name: str) -> zarr.Array:
        return zarr.open_group(self.path, mode="r", zarr_format=3)[name]


# --------------------------------------------------------------------- public functions


def write_dataset(
    path: PathLike,
    X: Any,
    y: Any,
    *,
    chunk_rows: int | None = None,
    dtype: str = "float64",
    source: str = "array",
    overwrite: bool = False,
    feature_range: tuple[Any, Any] | None = None,
) -> DatasetStore:
    """Write X (N, p) and labels y (N,) to a new dataset store at ``path``.

    ``X`` is a NumPy array (or any array with ``shape``, ``dtype`` and row slicing, such
    as a memmap) or a Dask array; Dask arrays are written chunk by chunk in parallel and
    never loaded whole. ``y`` (ints or strings) must fit in memory. ``chunk_rows``
    defaults to about 32 MiB per chunk. ``feature_range`` is an optional *public*
    (min, max) pair, each a scalar or shape (p,). The write is atomic (see module doc).
    """
    target = np.dtype(_check_dtype(dtype))
    if isinstance(X, da.Array):
        src = _dask_source(X, y, source)
    else:
        src = _array_source(X, y, source)
    return _build_store(
        path, src, chunk_rows=chunk_rows, dtype=target, overwrite=overwrite,
        feature_range=feature_range,
    )


def ingest(
    source: PathLike | tuple[PathLike, PathLike],
    path: PathLike,
    *,
    chunk_rows: int | None = None,
    dtype: str = "float64",
    label_column: int = -1,
    header: bool | None = None,
    x_key: str = "X",
    y_key: str = "y",
    overwrite: bool = False,
    feature_range: tuple[Any, Any] | None = None,
) -> DatasetStore:
    """Ingest a dataset file into a new store at ``path``, streaming rows in chunks.

    ``source`` is one of:

    * ``"file.npz"`` with arrays ``x_key`` (N, p) and ``y_key`` (N,);
    * ``(x.npy, y.npy)``, a pair of ``.npy`` files;
    * ``"file.csv"`` or ``"file.csv.gz"``: numeric features, the label in column
      ``label_column``; a header line is detected unless ``header`` is given;
    * ``(images.idx3-ubyte[.gz], labels.idx1-ubyte[.gz])``: IDX files (MNIST format),
      images flattened to (N, prod(dims[1:]));
    * ``"sklearn:<name>"`` for a bundled scikit-learn dataset: digits, breast_cancer,
      iris or wine (``fetch_*`` datasets need the network and are not supported).
    """
    target = np.dtype(_check_dtype(dtype))
    src = _resolve_source(source, label_column=label_column, header=header,
                          x_key=x_key, y_key=y_key)
    return _build_store(
        path, src, chunk_rows=chunk_rows, dtype=target, overwrite=overwrite,
        feature_range=feature_range,
    )


def append_rows(path: PathLike, X_new: Any, y_new: Any) -> DatasetStore:
    """Append rows X_new (n, p) with labels y_new (n,) to an existing store.

    New classes get the next free codes (existing codes never change). Everything is
    validated before the first write; ``class_index`` and the attributes are written
    last, so a crash mid-append is detected by :func:`open_dataset`.
    """
    store = open_dataset(path)
    group = zarr.open_group(store.path, mode="r+", zarr_format=3)
    rows = _check_new_rows(X_new, store.n_features, group["X"].dtype)
    labels = _label_array(y_new, "y_new")
    _check_length(labels, rows.shape[0], "y_new", "X_new")
    classes, codes = _extend_classes(store.classes, labels)
    _append_to(group["X"], rows)
    _append_to(group["y"], codes)
    for code in np.unique(codes).tolist():
        old = store.class_rows(code) if code < len(store.classes) else np.empty(0, np.int64)
        added = store.n_samples + np.flatnonzero(codes == code)
        write_array_atomic(store.path, f"class_index/{code}", np.concatenate([old, added]))
    counts = np.bincount(codes, minlength=len(classes))
    counts[: len(store.classes)] += np.array([store.class_counts[c] for c in store.classes])
    group.attrs[ATTRS_KEY] = dict(store.attrs, n_samples=store.n_samples + len(codes),
                                  classes=classes, class_counts=counts.tolist())
    return open_dataset(store.path)


def open_dataset(path: PathLike) -> DatasetStore:
    """Open the dataset store at ``path`` after checking that it is complete and consistent.

    Raises ``FileNotFoundError`` if ``path`` does not exist and :class:`StoreError` if it
    is not a Zarr v3 group, lacks the ``kahm_dask`` attributes, has another format
    version, or its arrays disagree with each other or with the attributes.
    """
    path = _abs(path)
    if not path.exists():
        raise FileNotFoundError(
            f"No dataset store at {path}; create one with ingest() or write_dataset()."
        )
    group = _open_group(path)
    attrs = group.attrs.asdict().get(ATTRS_KEY)
    if not isinstance(attrs, dict):
        raise StoreError(f"{path} is a Zarr group but has no '{ATTRS_KEY}' attributes; "
                         "it is not a kahm-dask dataset store.")
    version = attrs.get("format_version")
    if version != FORMAT_VERSION:
        raise StoreError(f"{path} has store format_version {version!r}; this version of "
                         f"kahm-dask reads format_version {FORMAT_VERSION}. Re-ingest it.")
    return _check_consistent(path, group, attrs)


def write_array_atomic(
    group_path: PathLike,
    name: str,
    array: Any,
    *,
    chunks: tuple[int, ...] | None = None,
    attrs: dict[str, Any] | None = None,
) -> zarr.Array:
    """Write ``array`` (NumPy or Dask, any shape) as ``name`` in an existing Zarr group.

    The array is written under a temporary name in the same directory and then renamed,
    so readers see either the old array (if any, it is replaced) or the complete new one.
    ``name`` may be nested (``"a/b"``); missing intermediate groups are created.
    ``chunks`` defaults to Zarr's automatic choice (to the Dask chunks for Dask arrays).
    Returns the written array, opened read-only.
    """
    group_path = _abs(group_path)
    if not group_path.exists():
        raise FileNotFoundError(f"No Zarr group at {group_path}; create it first.")
    parent_name, _, leaf = name.strip("/").rpartition("/")
    if not leaf or ".." in name.split("/"):
        raise ValueError(f"Invalid array name {name!r}; use names like 'a' or 'a/b'.")
    root = _open_group(group_path, mode="r+")
    parent = root.require_group(parent_name) if parent_name else root
    parent_dir = group_path / parent_name
    tmp_name = f"{leaf}.tmp-{uuid.uuid4().hex}"
    try:
        _write_array(parent, tmp_name, array, chunks=chunks, attrs=attrs)
        _replace_path(parent_dir / tmp_name, parent_dir / leaf)
    except BaseException:
        shutil.rmtree(parent_dir / tmp_name, ignore_errors=True)
        raise
    return zarr.open_array(parent_dir / leaf, mode="r", zarr_format=3)


def read_group_attrs(path: PathLike) -> dict[str, Any]:
    """All attributes of the Zarr v3 group at ``path`` as a dict."""
    path = _abs(path)
    if not path.exists():
        raise FileNotFoundError(f"No Zarr group at {path}.")
    return _open_group(path).attrs.asdict()


def mark_complete(path: PathLike, info: dict[str, Any]) -> None:
    """Atomically write the JSON dict ``info`` to ``<path>/_COMPLETE.json``.

    Note: Zarr warns (``ZarrUserWarning``) about this non-Zarr file when the members of a
    group at ``path`` are listed; direct access by name is unaffected.
    """
    directory = _abs(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"Cannot mark {directory} complete: no such directory.")
    try:
        text = json.dumps(info, indent=2, sort_keys=True)
    except TypeError as exc:
        raise TypeError(f"mark_complete info must be JSON-serializable: {exc}") from None
    tmp = directory / f"{COMPLETE_FILE}.tmp-{uuid.uuid4().hex}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, directory / COMPLETE_FILE)
    finally:
        tmp.unlink(missing_ok=True)


def is_complete(path: PathLike) -> dict[str, Any] | None:
    """The info dict written by :func:`mark_complete` for ``path``, or None if absent."""
    marker = _abs(path) / COMPLETE_FILE
    if not marker.is_file():
        return None
    try:
        return json.loads(marker.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise StoreError(f"Completion marker {marker} is not valid JSON ({exc}); "
                         "delete it and rerun the step.") from None


# ------------------------------------------------------------------------ building


@dataclass(frozen=True)
class _Source:
    """Where rows come from: ``write_x`` fills the (0, p) array X and returns raw labels."""

    description: str
    n_features: int
    n_rows_hint: int  # exact, or an upper estimate; only used to size default chunks
    write_x: Callable[[zarr.Array], np.ndarray]


def _build_store(
    path: PathLike,
    src: _Source,
    *,
    chunk_rows: int | None,
    dtype: np.dtype,
    overwrite: bool,
    feature_range: tuple[Any, Any] | None,
) -> DatasetStore:
    """Write ``src`` into a temporary store and move it to ``path`` when complete."""
    rows = _chunk_rows(chunk_rows, src.n_rows_hint, src.n_features, dtype)
    feature_range_attr = _feature_range(feature_range, src.n_features)
    with _atomic_directory(_abs(path), overwrite) as tmp:
        group = zarr.open_group(tmp, mode="w-", zarr_format=3)
        x = group.create_array("X", shape=(0, src.n_features), chunks=(rows, src.n_features),
                               dtype=dtype)
        labels = _label_array(src.write_x(x), "y")
        classes, codes = _encode_labels(labels)
        counts = _write_labels(group, codes, len(classes))
        attrs = {
            "format_version": FORMAT_VERSION,
            "n_samples": int(x.shape[0]),
            "n_features": src.n_features,
            "classes": classes,
            "class_counts": counts,
            "source": src.description,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        if feature_range_attr is not None:
            attrs["feature_range"] = feature_range_attr
        group.attrs[ATTRS_KEY] = attrs
    return open_dataset(path)


def _write_labels(group: zarr.Group, codes: np.ndarray, n_classes: int) -> list[int]:
    """Write ``y`` (codes, shape (N,)) and ``class_index/<code>``; return class counts."""
    group.create_array("y", data=codes)
    index = group.require_group("class_index")
    order = np.argsort(codes, kind="stable")
    counts = np.bincount(codes, minlength=n_classes)
    for code, rows in enumerate(np.split(order, np.cumsum(counts)[:-1])):
        index.create_array(str(code), data=rows.astype(np.int64))
    return counts.tolist()


def _write_blocks(x: zarr.Array, blocks: Generator[Block, None, None]) -> np.ndarray:
    """Append row blocks to the (0, p) array ``x``, checking each; return all labels.

    ``blocks`` is closed even on error, so a reader's open file is closed at once.
    """
    labels = []
    with closing(blocks):
        for features, block_labels in blocks:
            _append_to(x, _checked_block(features, x.dtype, x.shape[0]))
            labels.append(np.asarray(block_labels))
    if x.shape[0] == 0:
        raise ValueError("The source has no rows; a dataset needs at least one row.")
    return np.concatenate(labels)


def _append_to(array: zarr.Array, values: np.ndarray) -> None:
    """Grow ``array`` along axis 0 and write ``values`` into the new rows."""
    start = array.shape[0]
    array.resize((start + values.shape[0], *array.shape[1:]))
    array[start:] = values


def _checked_block(block: np.ndarray, dtype: np.dtype, first_row: int) -> np.ndarray:
    """``block`` (n, p) cast to ``dtype``; ValueError naming the first non-finite entry."""
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


def _write_array(group: zarr.Group, name: str, array: Any, *,
                 chunks: tuple[int, ...] | None, attrs: dict[str, Any] | None) -> None:
    """Create ``name`` in ``group`` and fill it from a NumPy or Dask array."""
    if isinstance(array, da.Array):
        chunks = chunks or tuple(max(1, c[0]) for c in array.chunks)
        array = array.rechunk(chunks)  # regular chunks: parallel writes never share one
        target = group.create_array(name, shape=array.shape, dtype=array.dtype,
                                    chunks=chunks, attributes=attrs)
        da.store(array, target, lock=False)
    else:
        group.create_array(name, data=np.asarray(array), chunks=chunks or "auto",
                           attributes=attrs)


# ------------------------------------------------------------------------ sources


def _array_source(X: Any, y: Any, description: str) -> _Source:
    """Rows from an in-memory array (or anything with shape, dtype and row slicing)."""
    if not (hasattr(X, "shape") and hasattr(X, "dtype")):
        X = np.asarray(X)
    _check_matrix_shape(X.shape, X.dtype, "X")
    labels = _label_array(y, "y")
    _check_length(labels, X.shape[0], "y", "X")

    def write_x(x: zarr.Array) -> np.ndarray:
        step = x.chunks[0]
        blocks = ((X[s : s + step], labels[s : s + step]) for s in range(0, X.shape[0], step))
        return _write_blocks(x, blocks)

    return _Source(description, int(X.shape[1]), int(X.shape[0]), write_x)


def _dask_source(X: da.Array, y: Any, description: str) -> _Source:
    """Rows from a Dask array, written in parallel chunk by chunk (never loaded whole)."""
    if any(np.isnan(c) for dim in X.chunks for c in dim):
        raise ValueError("X has unknown chunk sizes; call X.compute_chunk_sizes() first.")
    _check_matrix_shape(X.shape, X.dtype, "X")
    labels = _label_array(y.compute() if isinstance(y, da.Array) else y, "y")
    _check_length(labels, X.shape[0], "y", "X")

    def write_x(x: zarr.Array) -> np.ndarray:
        x.resize(X.shape)
        aligned = X.rechunk(x.chunks)  # one task per Zarr chunk: writes never overlap
        starts = np.cumsum((0, *aligned.chunks[0][:-1])).tolist()
        tasks = [dask.delayed(_store_block)(block, x, start)
                 for block, start in zip(aligned.to_delayed().ravel(), starts)]
        errors = [e for e in dask.compute(*tasks) if e is not None]
        if errors:
            raise ValueError(min(errors)[1])
        return labels

    return _Source(description, int(X.shape[1]), int(X.shape[0]), write_x)


def _store_block(block: np.ndarray, x: zarr.Array, start: int) -> tuple[int, str] | None:
    """Write rows ``start:start+len(block)`` of ``x``; return (start, message) if invalid.

    Invalid data is reported instead of raised so that every task has finished (no write
    is still in flight) before the caller deletes the temporary store.
    """
    try:
        checked = _checked_block(block, x.dtype, start)
    except ValueError as exc:
        return start, str(exc)
    x[start : start + len(checked)] = checked
    return None


def _resolve_source(source: Any, *, label_column: int, header: bool | None,
                    x_key: str, y_key: str) -> _Source:
    """Pick the reader for ``source`` from its form, suffix and magic bytes."""
    if isinstance(source, str) and source.startswith("sklearn:"):
        return _sklearn_source(source.removeprefix("sklearn:"))
    if isinstance(source, tuple | list):
        if len(source) != 2:
            raise ValueError(f"A file pair must be (x_path, y_path), got {len(source)} items.")
        x_path, y_path = (_existing_file(p) for p in source)
        kinds = {_magic_kind(x_path), _magic_kind(y_path)}
        if kinds == {"npy"}:
            return _npy_pair_source(x_path, y_path)
        if kinds == {"idx"}:
            return _idx_source(x_path, y_path)
        raise ValueError(f"Unknown file pair format ({x_path.name}, {y_path.name}): expected "
                         "two .npy files or two IDX files (MNIST format, optionally .gz).")
    path = _existing_file(source)
    name = path.name.lower()
    if name.endswith(".npz"):
        return _npz_source(path, x_key, y_key)
    if name.endswith((".csv", ".csv.gz")):
        return _csv_source(path, label_column, header)
    if name.endswith(".npy"):
        raise ValueError(f"{path} holds only one array; pass the pair (x_path, y_path).")
    raise ValueError(f"Unknown source format: {path}. Supported: .npz, .csv[.gz], a pair "
                     "of .npy files, a pair of IDX files, or 'sklearn:<name>'.")


def _sklearn_source(name: str) -> _Source:
    from sklearn import datasets

    if name not in SKLEARN_DATASETS:
        raise ValueError(
            f"Unknown bundled dataset 'sklearn:{name}'. Offline datasets: "
            f"{', '.join('sklearn:' + n for n in SKLEARN_DATASETS)}. Datasets fetched "
            "with sklearn.datasets.fetch_* need the network: download them yourself and "
            "ingest the files."
        )
    X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    return _array_source(X, y, f"sklearn:{name}")


def _npy_pair_source(x_path: Path, y_path: Path) -> _Source:
    X = np.load(x_path, mmap_mode="r", allow_pickle=False)
    y = _load_labels_npy(lambda: np.load(y_path, allow_pickle=False), y_path)
    return _array_source(X, y, f"npy:({x_path}, {y_path})")


def _npz_source(path: Path, x_key: str, y_key: str) -> _Source:
    """Rows of member ``x_key`` streamed from the zip; labels ``y_key`` loaded whole."""
    with zipfile.ZipFile(path) as zf:
        members = [n.removesuffix(".npy") for n in zf.namelist()]
        for key, option in ((x_key, "x_key"), (y_key, "y_key")):
            if key not in members:
                raise ValueError(f"{path} has no array '{key}' (it has: "
                                 f"{', '.join(members)}); pass {option}=<name>.")
        with zf.open(f"{x_key}.npy") as fh:
            shape, fortran, dtype = _npy_header(fh)
    _check_matrix_shape(shape, dtype, f"{path}[{x_key!r}]")
    labels = _label_array(_load_labels_npy(lambda: _npz_member(path, y_key), path), "y")
    _check_length(labels, shape[0], f"{path}[{y_key!r}]", f"{path}[{x_key!r}]")

    def blocks(step: int) -> Generator[Block, None, None]:
        if fortran:  # rows are not contiguous on disk: load the member whole
            X = _npz_member(path, x_key)
            yield from ((X[s : s + step], labels[s : s + step])
                        for s in range(0, shape[0], step))
            return
        with zipfile.ZipFile(path) as zf, zf.open(f"{x_key}.npy") as fh:
            _npy_header(fh)
            for s in range(0, shape[0], step):
                n = min(step, shape[0] - s)
                yield _read_rows(fh, dtype, n, shape[1], path), labels[s : s + n]

    return _Source(f"npz:{path}", int(shape[1]), int(shape[0]),
                   lambda x: _write_blocks(x, blocks(x.chunks[0])))


def _npz_member(path: Path, key: str) -> np.ndarray:
    with np.load(path, allow_pickle=False) as npz:
        return npz[key]


def _npy_header(fh: BinaryIO) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(fh)
    return np.lib.format.read_array_header_2_0(fh)


def _load_labels_npy(load: Callable[[], np.ndarray], path: Path) -> np.ndarray:
    try:
        return load()
    except ValueError as exc:
        if "allow_pickle" not in str(exc):
            raise
        raise ValueError(f"The labels in {path} are a Python object array; save them as "
                         "integers or fixed-width strings (e.g. y.astype(str)).") from None


def _csv_source(path: Path, label_column: int, header: bool | None) -> _Source:
    """Numeric CSV rows with one label column, parsed by pandas in row blocks."""
    first = _first_csv_row(path)
    n_cols = len(first)
    if n_cols < 2:
        raise ValueError(f"{path} has {n_cols} column; need features plus a label column.")
    if not -n_cols <= label_column < n_cols:
        raise ValueError(f"label_column={label_column} is out of range for {path}, "
                         f"which has {n_cols} columns.")
    label = label_column % n_cols
    features = [c for c in range(n_cols) if c != label]
    has_header = _looks_like_header(first, features) if header is None else header

    def blocks(step: int) -> Generator[Block, None, None]:
        import pandas as pd

        with pd.read_csv(
            path, header=None, names=list(range(n_cols)), skiprows=int(has_header),
            dtype={**{c: np.float64 for c in features}, label: str}, chunksize=step,
        ) as reader:
            start = 0
            for frame in _parsed_frames(reader, path):
                missing = frame[label].isna().to_numpy()
                if missing.any():
                    raise ValueError(f"{path}: the label is missing at row "
                                     f"{start + int(np.argmax(missing))}.")
                yield frame[features].to_numpy(), frame[label].to_numpy(dtype=str)
                start += len(frame)

    def write_x(x: zarr.Array) -> np.ndarray:
        return _text_labels(_write_blocks(x, blocks(x.chunks[0])))

    hint = _count_lines(path, _default_chunk_rows(n_cols - 1, np.dtype(np.float32)))
    return _Source(f"csv:{path}", len(features), max(hint, 1), write_x)


def _parsed_frames(reader: Iterator[Any], path: Path) -> Iterator[Any]:
    """The frames of a pandas chunked reader, parse errors re-raised naming ``path``."""
    while True:
        try:
            frame = next(reader)
        except StopIteration:
            return
        except ValueError as exc:  # includes pandas' ParserError
            raise ValueError(f"Cannot parse {path} as a numeric CSV: {exc}") from None
        yield frame


def _first_csv_row(path: Path) -> list[str]:
    with _open_text(path) as fh:
        for row in csv.reader(fh):
            if row:
                return row
    raise ValueError(f"{path} is empty; a dataset needs at least one row.")


def _looks_like_header(row: list[str], features: list[int]) -> bool:
    """True if any feature field of the first row is not a number."""
    try:
        for c in features:
            float(row[c])
    except ValueError:
        return True
    return False


def _text_labels(labels: np.ndarray) -> np.ndarray:
    """CSV labels (str array) as int64 when every label is an integer, else as str."""
    try:
        return labels.astype(np.int64)
    except ValueError:
        pass
    try:
        values = labels.astype(np.float64)
    except ValueError:
        return labels
    integral = np.all(np.isfinite(values)) and np.all(values == np.round(values))
    return values.astype(np.int64) if integral else labels


def _count_lines(path: Path, limit: int) -> int:
    """Number of lines in ``path``, counting stops once it exceeds ``limit``."""
    count = 0
    with _open_binary(path) as fh:
        while count <= limit and (buf := fh.read(2**20)):
            count += buf.count(b"\n")
    return count


_IDX_DTYPES = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _idx_source(images: Path, labels_path: Path) -> _Source:
    """IDX images (N, d1, d2, ...) flattened to rows (N, d1*d2*...), read in blocks."""
    with _open_binary(images) as fh:
        img_dtype, img_dims = _idx_header(fh, images)
    with _open_binary(labels_path) as fh:
        lab_dtype, lab_dims = _idx_header(fh, labels_path)
        if len(lab_dims) != 1:
            raise ValueError(f"{labels_path} has {len(lab_dims)} dimensions; an IDX labels "
                             "file has 1. Is the pair (images, labels) in that order?")
        labels = _read_rows(fh, lab_dtype, lab_dims[0], 1, labels_path).ravel()
    if len(img_dims) < 2:
        raise ValueError(f"{images} has 1 dimension; an IDX images file has at least 2. "
                         "Is the pair (images, labels) in that order?")
    n, p = img_dims[0], int(np.prod(img_dims[1:]))
    _check_length(labels, n, str(labels_path), str(images))

    def blocks(step: int) -> Generator[Block, None, None]:
        with _open_binary(images) as fh:
            _idx_header(fh, images)
            for s in range(0, n, step):
                k = min(step, n - s)
                yield _read_rows(fh, img_dtype, k, p, images), labels[s : s + k]

    return _Source(f"idx:({images}, {labels_path})", p, n,
                   lambda x: _write_blocks(x, blocks(x.chunks[0])))


def _idx_header(fh: BinaryIO, path: Path) -> tuple[np.dtype, tuple[int, ...]]:
    """Parse the IDX header: 2 zero bytes, a dtype code, ndim, then ndim big-endian uint32."""
    magic = fh.read(4)
    if len(magic) < 4 or magic[:2] != b"\0\0" or magic[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic bytes {magic!r}).")
    dims = np.frombuffer(fh.read(4 * magic[3]), dtype=">u4")
    if dims.size != magic[3]:
        raise ValueError(f"{path} is truncated inside its IDX header.")
    return np.dtype(_IDX_DTYPES[magic[2]]), tuple(int(d) for d in dims)


def _read_rows(fh: BinaryIO, dtype: np.dtype, n: int, p: int, path: Path) -> np.ndarray:
    """Read ``n`` rows of ``p`` values of ``dtype`` from ``fh``: array (n, p)."""
    size = n * p * dtype.itemsize
    buf = fh.read(size)
    if len(buf) != size:
        raise ValueError(f"{path} is truncated: expected {size} more bytes, got {len(buf)}.")
    return np.frombuffer(buf, dtype=dtype).reshape(n, p)


def _magic_kind(path: Path) -> str | None:
    with _open_binary(path) as fh:
        head = fh.read(4)
    if head == b"\x93NUM":
        return "npy"
    if len(head) == 4 and head[:2] == b"\0\0" and head[2] in _IDX_DTYPES:
        return "idx"
    return None


def _open_binary(path: Path) -> BinaryIO:
    """Open ``path`` for reading bytes, transparently decompressing gzip."""
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")


def _open_text(path: Path) -> TextIO:
    return io.TextIOWrapper(_open_binary(path), encoding="utf-8", newline="")


# ---------------------------------------------------------------------- validation


def _check_dtype(dtype: Any) -> str:
    name = np.dtype(dtype).name
    if name not in ("float64", "float32"):
        raise ValueError(f"dtype must be 'float64' or 'float32', got {dtype!r}.")
    return name


def _check_matrix_shape(shape: tuple[int, ...], dtype: np.dtype, name: str) -> None:
    if len(shape) != 2:
        raise ValueError(f"{name} must be 2-D of shape (n_samples, n_features), got shape "
                         f"{tuple(shape)}. Reshape it with .reshape(len(X), -1).")
    if shape[0] < 1 or shape[1] < 1:
        raise ValueError(f"{name} has shape {tuple(shape)}; need at least one row and one "
                         "feature.")
    if np.dtype(dtype).kind not in "biuf":
        raise TypeError(f"{name} must hold real numbers, got dtype {dtype}.")


def _check_length(labels: np.ndarray, n_rows: int, y_name: str, x_name: str) -> None:
    if len(labels) != n_rows:
        raise ValueError(f"{y_name} has {len(labels)} labels but {x_name} has {n_rows} rows; "
                         "they must match.")


def _check_new_rows(X_new: Any, n_features: int, dtype: np.dtype) -> np.ndarray:
    """X_new as a checked array of shape (n, n_features) in the store's dtype."""
    rows = np.asarray(X_new)
    _check_matrix_shape(rows.shape, rows.dtype, "X_new")
    if rows.shape[1] != n_features:
        raise ValueError(f"X_new has {rows.shape[1]} features but the store has "
                         f"{n_features}.")
    return _checked_block(rows, dtype, 0)


def _label_array(y: Any, name: str) -> np.ndarray:
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


def _encode_labels(labels: np.ndarray) -> tuple[list[int | str], np.ndarray]:
    """Sorted class values (JSON-able list) and int64 codes of shape (N,)."""
    classes, codes = np.unique(labels, return_inverse=True)
    return classes.tolist(), codes.astype(np.int64).ravel()


def _extend_classes(classes: tuple[int | str, ...],
                    labels: np.ndarray) -> tuple[list[int | str], np.ndarray]:
    """Classes with the new ones appended (sorted) and the codes of ``labels``."""
    is_str = isinstance(classes[0], str)
    if (labels.dtype.kind == "U") != is_str:
        have, got = ("string", "integer") if is_str else ("integer", "string")
        raise TypeError(f"y_new has {got} labels but the store's classes are {have}s.")
    values, inverse = np.unique(labels, return_inverse=True)
    known = {c: i for i, c in enumerate(classes)}
    extended = list(classes) + [v for v in values.tolist() if v not in known]
    lookup = {c: i for i, c in enumerate(extended)}
    value_codes = np.array([lookup[v] for v in values.tolist()], dtype=np.int64)
    return extended, value_codes[inverse.ravel()]


def _chunk_rows(chunk_rows: int | None, n_rows: int, n_features: int,
                dtype: np.dtype) -> int:
    if chunk_rows is None:
        return max(1, min(_default_chunk_rows(n_features, dtype), n_rows))
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, numbers.Integral) \
            or chunk_rows < 1:
        raise ValueError(f"chunk_rows must be a positive integer, got {chunk_rows!r}.")
    return int(chunk_rows)


def _default_chunk_rows(n_features: int, dtype: np.dtype) -> int:
    return max(1, TARGET_CHUNK_BYTES // (n_features * dtype.itemsize))


def _feature_range(feature_range: tuple[Any, Any] | None,
                   n_features: int) -> dict[str, list[float]] | None:
    """The public per-feature range as {"min": [p floats], "max": [p floats]}."""
    if feature_range is None:
        return None
    try:
        lo, hi = (np.broadcast_to(np.asarray(v, dtype=np.float64), (n_features,))
                  for v in feature_range)
    except ValueError:
        raise ValueError(f"feature_range must be a pair (min, max) of scalars or arrays of "
                         f"shape ({n_features},).") from None
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) and np.all(lo <= hi)):
        raise ValueError("feature_range must be finite with min <= max for every feature.")
    return {"min": lo.tolist(), "max": hi.tolist()}


def _check_consistent(path: Path, group: zarr.Group, attrs: dict[str, Any]) -> DatasetStore:
    """Check arrays against attributes; return the handle or raise StoreError."""
    def fail(what: str) -> StoreError:
        return StoreError(f"Dataset store {path} is inconsistent or corrupt: {what}. "
                          "Re-ingest the data (ingest(..., overwrite=True)).")

    try:
        n, p = int(attrs["n_samples"]), int(attrs["n_features"])
        classes, counts = list(attrs["classes"]), list(attrs["class_counts"])
    except (KeyError, TypeError, ValueError) as exc:
        raise fail(f"attribute {exc} is missing or malformed") from None
    arrays = {}
    for name in ("X", "y", *(f"class_index/{c}" for c in range(len(classes)))):
        try:
            arrays[name] = group[name]
        except KeyError:
            raise fail(f"array '{name}' is missing") from None
        except ValueError as exc:  # unreadable zarr.json
            raise fail(f"array '{name}' is unreadable ({exc})") from None
    x, y = arrays["X"], arrays["y"]
    if x.shape != (n, p) or y.shape != (n,):
        raise fail(f"X has shape {x.shape} and y has shape {y.shape}, but the attributes "
                   f"say n_samples={n}, n_features={p}")
    if len(counts) != len(classes) or sum(counts) != n:
        raise fail(f"class_counts {counts} do not match {len(classes)} classes and {n} rows")
    for code, count in enumerate(counts):
        if arrays[f"class_index/{code}"].shape != (count,):
            raise fail(f"class_index/{code} has shape {arrays[f'class_index/{code}'].shape} "
                       f"but class_counts says {count} rows")
    return DatasetStore(path, n, p, tuple(classes), dict(zip(classes, counts)),
                        int(x.chunks[0]), attrs)


# --------------------------------------------------------------------- filesystem


def _abs(path: PathLike) -> Path:
    return Path(path).expanduser().absolute()


def _existing_file(path: PathLike) -> Path:
    path = _abs(path)
    if not path.is_file():
        raise FileNotFoundError(f"Source file not found: {path}")
    return path


def _open_group(path: Path, mode: str = "r") -> zarr.Group:
    try:
        return zarr.open_group(path, mode=mode, zarr_format=3)
    except ValueError as exc:  # zarr's not-found/not-a-group errors and bad JSON
        raise StoreError(f"{path} is not a Zarr v3 group ({exc}).") from None


@contextmanager
def _atomic_directory(path: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary sibling of ``path``; rename it to ``path`` on success.

    On error the temporary directory is removed. An existing ``path`` is replaced only
    if ``overwrite`` and only after the new directory is complete.
    """
    _check_target(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{uuid.uuid4().hex}")
    try:
        yield tmp
        _check_target(path, overwrite)
        _replace_path(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_target(path: Path, overwrite: bool) -> None:
    if not path.exists():
        return
    if not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True to replace it "
                              "or choose another path.")
    if not (path / "zarr.json").is_file():
        raise FileExistsError(f"Refusing to overwrite {path}: it is not a Zarr store. "
                              "Delete it yourself or choose another path.")


def _replace_path(new: Path, target: Path) -> None:
    """Move directory ``new`` to ``target``; an old ``target`` is moved away, then deleted."""
    if not target.exists():
        os.replace(new, target)
        return
    old = target.with_name(f"{target.name}.old-{uuid.uuid4().hex}")
    os.replace(target, old)
    os.replace(new, target)
    shutil.rmtree(old)
