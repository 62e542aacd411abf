"""Zarr v3 dataset store: the format, and writing, ingesting and opening stores.

A dataset store is a Zarr v3 group on the local filesystem or at a URL fsspec reaches
(``s3://``, ``gs://``, …, with ``storage_options``; :mod:`kahm_dask.storage.location`)::

    <path>/
      zarr.json              group attributes {"kahm_dask": {...}} (see below)
      X                      float64 (or float32), shape (N, p), chunks (chunk_rows, p)
      y                      int64, shape (N,), codes into attrs["kahm_dask"]["classes"]
      class_index/<code>     int64, shape (N_code,), sorted row numbers of class ``code``

``attrs["kahm_dask"]`` holds ``format_version`` (1), ``n_samples``, ``n_features``,
``classes`` (JSON list of ints or of strings, position = code), ``class_counts`` (list
aligned with ``classes``), ``source``, ``created`` (ISO 8601, UTC), ``fingerprint`` (the data
set's identity for its privacy ledger and stored noise, :mod:`kahm_dask.privacy.fingerprint`; a
hash of the private rows, so private like the store) and, only when the caller passes a public
range, ``feature_range`` ({"min": [...], "max": [...]}). The minimum and maximum of the private
data are never computed or stored: they are private. Once DP releases are drawn from it,
``releases`` lists them (``release_id``, ``epsilon``, ``delta``, ``time``, ``what``, ``ledger``:
the ledger file that recorded it; :func:`remember_release`), so a release from a store whose
privacy ledger lacks them is refused (:func:`~kahm_dask.privacy.release.begin_release`).

Stores are created in a temporary hidden sibling directory ``.<name>.tmp-<uuid>`` and
renamed into place when complete (:func:`kahm_dask.storage.atomic.atomic_directory`), so an
interrupted ingest never leaves a half-written store at ``<path>``. Object stores have no
rename: a store there is written in place with its completion marker ``_COMPLETE.json`` last,
and :func:`open_dataset` refuses a remote store without it
(:func:`~kahm_dask.storage.location.committed_directory`). Arrays are read lazily
as Dask arrays backed by Zarr; no cluster is needed. The readers of the input formats are in
:mod:`kahm_dask.pipeline.stores.sources`, the checks of rows and labels in
:mod:`kahm_dask.pipeline.stores.rows`.

:func:`mark_complete` and :func:`is_complete` keep a completion marker in any directory
(the pipeline marks its stored noisy rows with it).
"""

from __future__ import annotations

import json
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import zarr

from kahm_dask.pipeline.stores.rows import encode_labels, label_array, rows_per_chunk
from kahm_dask.pipeline.stores.sources import Source, array_source, dask_source, resolve_source
from kahm_dask.privacy.bounds import bounds_from_private_data
from kahm_dask.privacy.fingerprint import DataFingerprint, combine, partial_sums
from kahm_dask.privacy.ledger_rows import row_digests
from kahm_dask.storage.codecs import ARRAY_CODECS
from kahm_dask.storage.location import (
    COMPLETE_FILE,
    Location,
    LocationLike,
    as_location,
    committed_directory,
    is_committed,
)
from kahm_dask.storage.private import make_private, private_directory

__all__ = [
    "FORMAT_VERSION",
    "StoreError",
    "StoreExistsError",
    "DatasetStore",
    "write_dataset",
    "ingest",
    "open_dataset",
    "array_fingerprint",
    "array_row_digests",
    "remember_release",
    "store_bounds",
    "mark_complete",
    "is_complete",
]

FORMAT_VERSION = 1
ATTRS_KEY = "kahm_dask"

PathLike = str | os.PathLike[str]


class StoreError(ValueError):
    """A path is not a valid, consistent kahm-dask store (the message says why)."""


class StoreExistsError(FileExistsError):
    """The target of a new store exists and replacing it was not asked for (``overwrite``)."""


# --------------------------------------------------------------------------- the store


@dataclass(frozen=True)
class DatasetStore:
    """Handle on a dataset store; reads are lazy (``X``) or row-selective.

    ``classes[code]`` is the original label of code ``code``; ``class_counts`` maps each
    original label to its number of rows; ``attrs`` is the ``kahm_dask`` attribute dict.
    ``path`` is a :class:`~pathlib.Path`, or the URL of a remote store read with
    ``storage_options`` (not compared, not shown: they may hold credentials).
    """

    path: Path | str
    n_samples: int
    n_features: int
    classes: tuple[int | str, ...]
    class_counts: dict[int | str, int]
    chunk_rows: int
    attrs: dict[str, Any]
    storage_options: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def location(self) -> Location:
        """Where the store is (:class:`~kahm_dask.storage.location.Location`)."""
        return as_location(self.path, self.storage_options)

    def X(self) -> da.Array:
        """Lazy Dask array of shape (N, p) reading from Zarr; row chunks = Zarr chunks."""
        url, storage_options = self.location.dask_target()
        return da.from_zarr(url, component="X", storage_options=storage_options)

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

    def fingerprint(self) -> DataFingerprint:
        """The data set's :class:`~kahm_dask.privacy.fingerprint.DataFingerprint` (private: it
        stays on the owner's side): recorded when the store was written, else computed now
        (one pass over X, on the current Dask scheduler)."""
        stored = self.attrs.get("fingerprint")
        if stored is not None:
            try:
                return DataFingerprint.from_dict(stored)
            except (ValueError, KeyError, TypeError):
                pass  # another version of the construction: compute this one
        return array_fingerprint(self.X())

    def verified_fingerprint(self) -> DataFingerprint:
        """The data set's fingerprint from every row of X, read now (one pass, one task per
        chunk on the current Dask scheduler), checked against the one recorded when the store
        was written. A DP release calls it before it spends, so that rows it could not read
        fail the run while nothing is charged.

        Raises :class:`StoreError` naming the store, the array and the chunk whose bytes cannot
        be read or decoded (a truncated or damaged file), or saying that the rows differ from
        those written (a chunk replaced or changed in place).
        """
        n, step = self.n_samples, self.chunk_rows
        tasks = [dask.delayed(_chunk_sums)(self, i, a, min(a + step, n)) for i, a in enumerate(range(0, n, step))]
        found = combine(np.asarray(dask.compute(*tasks)), n, self.n_features)
        recorded = self.attrs.get("fingerprint")
        try:
            recorded = None if recorded is None else DataFingerprint.from_dict(recorded)
        except (ValueError, KeyError, TypeError):
            recorded = None  # another version of the construction: nothing to compare with
        if recorded is not None and recorded != found:
            raise StoreError(
                f"the rows of X in the dataset store {self.location} differ from those written to it (their "
                "fingerprint changed): a chunk was replaced or changed. Write the store again from its source."
            )
        return found

    @property
    def releases(self) -> list[dict]:
        """The DP releases drawn from this store, as it remembers them (module docstring)."""
        return [dict(r) for r in self.attrs.get("releases", [])]

    def row_digests(self, key: np.ndarray) -> np.ndarray:
        """The keyed digests (N, 2) of the rows of X under the ledger key ``key``
        (:func:`array_row_digests`; owner side)."""
        return array_row_digests(self.X(), key)

    def read_slice(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of X as float64 array of shape (stop - start, p)."""
        if not 0 <= start <= stop <= self.n_samples:
            raise IndexError(
                f"need 0 <= start <= stop <= {self.n_samples}, got start={start}, "
                f"stop={stop}."
            )
        return np.asarray(self._array("X")[start:stop], dtype=np.float64)

    def _array(self, name: str) -> zarr.Array:
        return zarr.open_group(self.location.zarr_store(read_only=True), mode="r", zarr_format=3)[name]


# --------------------------------------------------------------------- public functions


def _block_sums(x: np.ndarray, block_info=None) -> np.ndarray:
    return partial_sums(x, block_info[0]["array-location"][0][0])[None, :]


def _chunk_sums(store: DatasetStore, index: int, start: int, stop: int) -> np.ndarray:
    """The fingerprint sums of chunk ``index`` (rows ``start:stop``) of ``store``'s X, read
    directly; a chunk that cannot be read or decoded raises one :class:`StoreError` naming it."""
    try:
        x = store._array("X")[start:stop]
    except Exception as exc:  # any codec or I/O error of this chunk: named, not a codec's traceback
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StoreError(
            f"chunk {index} of X (rows {start} to {stop - 1}) of the dataset store {store.location} cannot be "
            f"read: {reason}. The store is damaged; write it again from its source."
        ) from None
    return partial_sums(x, start)


def array_fingerprint(X: da.Array) -> DataFingerprint:
    """The fingerprint of a dask array X (N, p), block by block (memory: one block) on the
    current scheduler; equal to :func:`~kahm_dask.privacy.fingerprint.fingerprint` of the same
    values in memory, whatever the chunks."""
    X = X.rechunk({1: -1})
    parts = X.map_blocks(_block_sums, chunks=((1,) * X.numblocks[0], (4,)), dtype=np.uint64,
                         meta=np.empty((0, 0), np.uint64))
    return combine(np.asarray(dask.compute(parts)[0]), *X.shape)


def _block_digests(x: np.ndarray, key: np.ndarray) -> np.ndarray:
    return row_digests(x, key)


def array_row_digests(X: da.Array, key: np.ndarray) -> np.ndarray:
    """The keyed row digests (N, 2) uint64 of a dask array X (N, p) under the ledger key ``key``
    (:func:`~kahm_dask.privacy.ledger_rows.row_digests`), computed where the blocks are: only the
    digests travel to the caller (16 bytes a row; keyed, but kept owner side like the ledger)."""
    X = X.rechunk({1: -1})
    parts = X.map_blocks(_block_digests, np.asarray(key, dtype=np.uint64), chunks=(X.chunks[0], (2,)),
                         dtype=np.uint64, meta=np.empty((0, 0), np.uint64))
    return np.asarray(dask.compute(parts)[0])


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
    scaling: Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> DatasetStore:
    """Write X (N, p) and labels y (N,) to a new dataset store at ``path`` (a local path or a
    URL, with fsspec ``storage_options``).

    ``X`` is a NumPy array (or any array with ``shape``, ``dtype`` and row slicing, such
    as a memmap) or a Dask array; Dask arrays are written chunk by chunk in parallel and
    never loaded whole. ``y`` (ints or strings) must fit in memory. ``chunk_rows``
    defaults to about 32 MiB per chunk. ``feature_range`` is an optional *public*
    (min, max) pair, each a scalar or shape (p,); ``scaling`` how the features were made from
    public raw bounds (:meth:`kahm_dask.privacy.bounds.Scaling.describe`), for the privacy
    statement's raw units. The write is atomic (see module doc); a local store is private by
    file mode (folders 0700, files 0600).
    """
    target = np.dtype(_check_dtype(dtype))
    if isinstance(X, da.Array):
        src = dask_source(X, y, source)
    else:
        src = array_source(X, y, source)
    return _build_store(
        as_location(path, storage_options), src, chunk_rows=chunk_rows, dtype=target, overwrite=overwrite,
        feature_range=feature_range, scaling=scaling,
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
    storage_options: Mapping[str, Any] | None = None,
) -> DatasetStore:
    """Ingest a dataset file into a new store at ``path`` (a local path or a URL, with fsspec
    ``storage_options``), streaming rows in chunks.

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
    src = resolve_source(source, label_column=label_column, header=header,
                         x_key=x_key, y_key=y_key)
    return _build_store(
        as_location(path, storage_options), src, chunk_rows=chunk_rows, dtype=target, overwrite=overwrite,
        feature_range=feature_range,
    )


def open_dataset(path: LocationLike, *, storage_options: Mapping[str, Any] | None = None) -> DatasetStore:
    """Open the dataset store at ``path`` (a local path or a URL, with fsspec
    ``storage_options``) after checking that it is complete and consistent.

    Raises ``FileNotFoundError`` if ``path`` does not exist (or, on an object store, has no
    completion marker: its write did not finish) and :class:`StoreError` if it is not a Zarr
    v3 group, lacks the ``kahm_dask`` attributes, has another format version, or its arrays
    disagree with each other or with the attributes.
    """
    path = as_location(path, storage_options)
    if not is_committed(path):
        incomplete = "" if not path.exists() else f" (no {COMPLETE_FILE}: its write did not finish)"
        raise FileNotFoundError(
            f"No dataset store at {path}{incomplete}; create one with ingest() or write_dataset()."
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


def remember_release(store: DatasetStore, entry: Mapping[str, Any] | None, *, forget: bool = False) -> DatasetStore:
    """Add the ledger ``entry`` of a release drawn from ``store`` (with ``release_id`` and
    ``ledger``) to the releases it remembers, or with ``forget`` (and ``entry`` None) clear them
    (the owner starting over: ``kahm-dask ledger adopt --forget``); returns the store reopened.
    Callers serialise it under the ledger's lock."""
    group = zarr.open_group(store.location.zarr_store(), mode="r+", zarr_format=3)
    attrs = dict(group.attrs.asdict()[ATTRS_KEY])
    known = [] if forget else list(attrs.get("releases", []))
    if entry is not None and all(r["release_id"] != entry["release_id"] for r in known):
        known.append({k: entry.get(k) for k in ("release_id", "epsilon", "delta", "time", "what", "ledger")})
    attrs["releases"] = known
    group.attrs[ATTRS_KEY] = attrs
    if store.location.is_local:
        make_private(store.location.path / "zarr.json")
    return open_dataset(store.location)


def mark_complete(path: LocationLike, info: dict[str, Any]) -> None:
    """Atomically write the JSON dict ``info`` to ``<path>/_COMPLETE.json`` (``path``: a local
    directory or a :class:`~kahm_dask.storage.location.Location`).

    Note: Zarr warns (``ZarrUserWarning``) about this non-Zarr file when the members of a
    group at ``path`` are listed; direct access by name is unaffected.
    """
    directory = as_location(path)
    if not (directory.path.is_dir() if directory.is_local else directory.exists()):
        raise FileNotFoundError(f"Cannot mark {directory} complete: no such directory.")
    try:
        text = json.dumps(info, indent=2, sort_keys=True)
    except TypeError as exc:
        raise TypeError(f"mark_complete info must be JSON-serializable: {exc}") from None
    (directory / COMPLETE_FILE).write_text(text)


def is_complete(path: LocationLike) -> dict[str, Any] | None:
    """The info dict written by :func:`mark_complete` for ``path``, or None if absent."""
    marker = as_location(path) / COMPLETE_FILE
    try:
        return json.loads(marker.read_text())
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except json.JSONDecodeError as exc:
        raise StoreError(f"Completion marker {marker} is not valid JSON ({exc}); "
                         "delete it and rerun the step.") from None


def store_bounds(store: DatasetStore) -> tuple[np.ndarray, np.ndarray]:
    """Each feature's min and max over a dataset store (private: warns PrivacyLeakWarning)."""
    X = store.X()
    low, high = dask.compute(X.min(axis=0), X.max(axis=0))
    return bounds_from_private_data(np.stack([np.asarray(low, np.float64), np.asarray(high, np.float64)]),
                                    stacklevel=2)


# ------------------------------------------------------------------------ building


def _build_store(
    target: Location,
    src: Source,
    *,
    chunk_rows: int | None,
    dtype: np.dtype,
    overwrite: bool,
    feature_range: tuple[Any, Any] | None,
    scaling: Mapping[str, Any] | None = None,
) -> DatasetStore:
    """Write ``src`` into a temporary store and move it to ``path`` when complete.

    An existing ``target`` is replaced only if ``overwrite`` and it is a Zarr store, checked
    before the first write and, for a local path, again before the new store is moved into
    place (on an object store the store is written in place:
    :func:`~kahm_dask.storage.location.committed_directory`).
    """
    rows = rows_per_chunk(chunk_rows, src.n_rows_hint, src.n_features, dtype)
    feature_range_attr = _feature_range(feature_range, src.n_features)
    _check_target(target, overwrite)
    with committed_directory(target) as tmp:
        if tmp.is_local:
            private_directory(tmp.path)  # 0700 before the first row is written
        group = zarr.open_group(tmp.zarr_store(), mode="w-", zarr_format=3)
        x = group.create_array("X", shape=(0, src.n_features), chunks=(rows, src.n_features),
                               dtype=dtype, **ARRAY_CODECS)
        written = src.write_x(x)  # hashes the rows as it writes them: no second pass
        labels = label_array(written.labels, "y")
        classes, codes = encode_labels(labels)
        counts = _write_labels(group, codes, len(classes))
        attrs = {
            "format_version": FORMAT_VERSION,
            "n_samples": int(x.shape[0]),
            "n_features": src.n_features,
            "classes": classes,
            "class_counts": counts,
            "source": src.description,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        if feature_range_attr is not None:
            attrs["feature_range"] = feature_range_attr
        if scaling is not None:
            attrs["scaling"] = dict(scaling)
        attrs["fingerprint"] = combine([written.lanes], int(x.shape[0]), src.n_features).to_dict()
        group.attrs[ATTRS_KEY] = attrs
        if target.is_local:
            _check_target(target, overwrite)  # the path may have appeared while writing
            make_private(tmp.path)
    return open_dataset(target)


def _write_labels(group: zarr.Group, codes: np.ndarray, n_classes: int) -> list[int]:
    """Write ``y`` (codes, shape (N,)) and ``class_index/<code>``; return class counts."""
    group.create_array("y", data=codes)
    index = group.require_group("class_index")
    order = np.argsort(codes, kind="stable")
    counts = np.bincount(codes, minlength=n_classes)
    for code, rows in enumerate(np.split(order, np.cumsum(counts)[:-1])):
        index.create_array(str(code), data=rows.astype(np.int64))
    return counts.tolist()


def _check_dtype(dtype: Any) -> str:
    """The name of the store's float dtype; ValueError unless float64 or float32."""
    name = np.dtype(dtype).name
    if name not in ("float64", "float32"):
        raise ValueError(f"dtype must be 'float64' or 'float32', got {dtype!r}.")
    return name


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


def _check_target(path: Location, overwrite: bool) -> None:
    """Raise unless ``path`` is free, or ``overwrite`` and ``path`` is a Zarr store."""
    if not path.exists():
        return
    if not overwrite:
        raise StoreExistsError(f"{path} already exists; pass overwrite=True to replace it "
                               "or choose another path.")
    if not (path / "zarr.json").exists():
        raise FileExistsError(f"Refusing to overwrite {path}: it is not a Zarr store. "
                              "Delete it yourself or choose another path.")


# ------------------------------------------------------------------------ reading


def _check_consistent(path: Location, group: zarr.Group, attrs: dict[str, Any]) -> DatasetStore:
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
    return DatasetStore(path.public(), n, p, tuple(classes), dict(zip(classes, counts, strict=True)),
                        int(x.chunks[0]), attrs, dict(path.storage_options))


def _open_group(path: Location) -> zarr.Group:
    """The Zarr v3 group at ``path``, opened read-only; StoreError if it is not one."""
    try:
        return zarr.open_group(path.zarr_store(read_only=True), mode="r", zarr_format=3)
    except ValueError as exc:  # zarr's not-found/not-a-group errors and bad JSON
        raise StoreError(f"{path} is not a Zarr v3 group ({exc}).") from None
