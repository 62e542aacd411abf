"""Readers of the rows a dataset store is built from, one per input format.

Each reader checks what it can before the first write (shapes, label count, label types)
and returns a :class:`Source`: a description (stored as the store's ``source`` attribute),
the number of features, a row-count hint (sizes default chunks), and ``write_x``, which
fills the store's (0, p) ``X`` array block by block and returns the raw labels (N,) with the
fingerprint lanes of the stored rows (:class:`~kahm_dask.pipeline.stores.rows.WrittenRows`).
:func:`resolve_source` picks the reader for an ``ingest`` source from its form, file suffix
and magic bytes; :func:`array_source` and :func:`dask_source` serve ``write_dataset``.
Files are streamed in blocks of one chunk (``.npz``, CSV, IDX), memory-mapped (``.npy``) or
written chunk by chunk in parallel (Dask); only the labels are held whole.
"""

from __future__ import annotations

import csv
import gzip
import io
import zipfile
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import dask
import dask.array as da
import numpy as np
import zarr
from joblib import effective_n_jobs

from kahm_dask._threads import in_threads
from kahm_dask.pipeline.stores.rows import (
    Block,
    WrittenRows,
    check_length,
    check_matrix_shape,
    default_chunk_rows,
    label_array,
    store_block,
    write_blocks,
)

__all__ = ["SKLEARN_DATASETS", "Source", "array_source", "dask_source", "resolve_source"]

#: Threads that write the chunks of an in-memory array (bounds the chunks in flight).
ARRAY_WRITE_THREADS = 4

#: Bundled scikit-learn datasets ``ingest`` reads as ``"sklearn:<name>"`` (offline).
SKLEARN_DATASETS = ("digits", "breast_cancer", "iris", "wine")


@dataclass(frozen=True)
class Source:
    """Where rows come from: ``write_x`` fills the (0, p) array X and returns the raw labels
    and the fingerprint lanes of what it wrote."""

    description: str
    n_features: int
    n_rows_hint: int  # exact, or an upper estimate; only used to size default chunks
    write_x: Callable[[zarr.Array], WrittenRows]


# ------------------------------------------------------------------------ arrays


def checked_labels(X: Any, y: Any) -> np.ndarray:
    """The labels (N,) of the rows X (N, p), after the checks every source of rows gets: known
    chunk sizes (a dask X), a 2-D matrix of real numbers, one label per row (a dask y is
    computed; :func:`~kahm_dask.pipeline.stores.rows.label_array`)."""
    if isinstance(X, da.Array) and any(np.isnan(c) for dim in X.chunks for c in dim):
        raise ValueError("X has unknown chunk sizes; call X.compute_chunk_sizes() first.")
    check_matrix_shape(X.shape, X.dtype, "X")
    labels = label_array(y.compute() if isinstance(y, da.Array) else y, "y")
    check_length(labels, X.shape[0], "y", "X")
    return labels


def array_source(X: Any, y: Any, description: str) -> Source:
    """Rows from an in-memory array (or anything with shape, dtype and row slicing), written
    chunk by chunk on up to :data:`ARRAY_WRITE_THREADS` threads of the calling process (the
    cast, the check, the hash and Zarr's compression release the GIL): at most that many chunks
    are in flight, each with about three copies of its rows (the cast, the hash's words and the
    compressed bytes)."""
    if not (hasattr(X, "shape") and hasattr(X, "dtype")):
        X = np.asarray(X)
    labels = checked_labels(X, y)

    def write_x(x: zarr.Array) -> WrittenRows:
        step = x.chunks[0]
        x.resize(X.shape)
        starts = range(0, X.shape[0], step)
        n_jobs = min(ARRAY_WRITE_THREADS, effective_n_jobs(-1), len(starts))
        return _written(labels, in_threads(lambda s: _store_block(X[s : s + step], x, s), starts, n_jobs))

    return Source(description, int(X.shape[1]), int(X.shape[0]), write_x)


def dask_source(X: da.Array, y: Any, description: str) -> Source:
    """Rows from a Dask array, written in parallel chunk by chunk (never loaded whole)."""
    labels = checked_labels(X, y)

    def write_x(x: zarr.Array) -> WrittenRows:
        x.resize(X.shape)
        aligned = X.rechunk(x.chunks)  # one task per Zarr chunk: writes never overlap
        starts = np.cumsum((0, *aligned.chunks[0][:-1])).tolist()
        tasks = [dask.delayed(_store_block)(block, x, start)
                 for block, start in zip(aligned.to_delayed().ravel(), starts, strict=True)]
        return _written(labels, dask.compute(*tasks))

    return Source(description, int(X.shape[1]), int(X.shape[0]), write_x)


def _written(labels: np.ndarray, results: Sequence[np.ndarray | tuple[int, str]]) -> WrittenRows:
    """The labels and the summed lanes of every block's :func:`_store_block` result, once all
    have finished; ValueError with the first invalid block's message if any was invalid."""
    errors = [r for r in results if isinstance(r, tuple)]
    if errors:
        raise ValueError(min(errors)[1])
    return WrittenRows(labels, np.sum(results, axis=0, dtype=np.uint64))


def _store_block(block: np.ndarray, x: zarr.Array, start: int) -> np.ndarray | tuple[int, str]:
    """Write rows ``start:start+len(block)`` of ``x``; return the block's fingerprint lanes
    (uint64, (4,)) of the stored values, or (start, message) if it is invalid.

    Invalid data is reported instead of raised so that every task has finished (no write
    is still in flight) before the caller deletes the temporary store.
    """
    try:
        return store_block(x, block, start)
    except ValueError as exc:
        return start, str(exc)


# ------------------------------------------------------------------------ files


def resolve_source(source: Any, *, label_column: int, header: bool | None,
                   x_key: str, y_key: str) -> Source:
    """Pick the reader for ``source`` from its form, suffix and magic bytes.

    ``source`` is ``"sklearn:<name>"``, a pair of paths (two ``.npy`` or two IDX files) or
    one path (``.npz``, ``.csv`` or ``.csv.gz``); see :func:`kahm_dask.pipeline.stores.dataset.ingest`.
    """
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


def _existing_file(path: str | Path) -> Path:
    """``path`` as an absolute path; FileNotFoundError naming it if it is not a file."""
    path = Path(path).expanduser().absolute()
    if not path.is_file():
        raise FileNotFoundError(f"Source file not found: {path}")
    return path


def _sklearn_source(name: str) -> Source:
    """A bundled scikit-learn dataset (``load_<name>``), loaded whole (they are small)."""
    from sklearn import datasets

    if name not in SKLEARN_DATASETS:
        raise ValueError(
            f"Unknown bundled dataset 'sklearn:{name}'. Offline datasets: "
            f"{', '.join('sklearn:' + n for n in SKLEARN_DATASETS)}. Datasets fetched "
            "with sklearn.datasets.fetch_* need the network: download them yourself and "
            "ingest the files."
        )
    X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    return array_source(X, y, f"sklearn:{name}")


# ----------------------------------------------------------------- .npy and .npz


def _npy_pair_source(x_path: Path, y_path: Path) -> Source:
    """X (N, p) memory-mapped from ``x_path``; labels (N,) loaded from ``y_path``."""
    X = np.load(x_path, mmap_mode="r", allow_pickle=False)
    y = _load_labels_npy(lambda: np.load(y_path, allow_pickle=False), y_path)
    return array_source(X, y, f"npy:({x_path}, {y_path})")


def _npz_source(path: Path, x_key: str, y_key: str) -> Source:
    """Rows of member ``x_key`` streamed from the zip; labels ``y_key`` loaded whole."""
    with zipfile.ZipFile(path) as zf:
        members = [n.removesuffix(".npy") for n in zf.namelist()]
        for key, option in ((x_key, "x_key"), (y_key, "y_key")):
            if key not in members:
                raise ValueError(f"{path} has no array '{key}' (it has: "
                                 f"{', '.join(members)}); pass {option}=<name>.")
        with zf.open(f"{x_key}.npy") as fh:
            shape, fortran, dtype = _npy_header(fh)
    check_matrix_shape(shape, dtype, f"{path}[{x_key!r}]")
    labels = label_array(_load_labels_npy(lambda: _npz_member(path, y_key), path), "y")
    check_length(labels, shape[0], f"{path}[{y_key!r}]", f"{path}[{x_key!r}]")

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

    return Source(f"npz:{path}", int(shape[1]), int(shape[0]),
                  lambda x: write_blocks(x, blocks(x.chunks[0])))


def _npz_member(path: Path, key: str) -> np.ndarray:
    """The whole array ``key`` of the ``.npz`` file ``path``."""
    with np.load(path, allow_pickle=False) as npz:
        return npz[key]


def _npy_header(fh: BinaryIO) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Read a ``.npy`` header from ``fh``: (shape, fortran_order, dtype)."""
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(fh)
    return np.lib.format.read_array_header_2_0(fh)


def _load_labels_npy(load: Callable[[], np.ndarray], path: Path) -> np.ndarray:
    """``load()``, with a clear message if the labels in ``path`` need pickle."""
    try:
        return load()
    except ValueError as exc:
        if "allow_pickle" not in str(exc):
            raise
        raise ValueError(f"The labels in {path} are a Python object array; save them as "
                         "integers or fixed-width strings (e.g. y.astype(str)).") from None


# ------------------------------------------------------------------------ CSV


def _csv_source(path: Path, label_column: int, header: bool | None) -> Source:
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
                if frame.isna().to_numpy().any():  # a short row reads as empty trailing fields
                    _refuse_short_rows(path, n_cols, has_header, start + len(frame))
                missing = frame[label].isna().to_numpy()
                if missing.any():
                    raise ValueError(f"{path}: the label is missing at row "
                                     f"{start + int(np.argmax(missing))}.")
                yield frame[features].to_numpy(), frame[label].to_numpy(dtype=str)
                start += len(frame)

    def write_x(x: zarr.Array) -> WrittenRows:
        written = write_blocks(x, blocks(x.chunks[0]))
        return WrittenRows(_text_labels(written.labels), written.lanes)

    hint = _count_lines(path, default_chunk_rows(n_cols - 1, np.dtype(np.float32)))
    return Source(f"csv:{path}", len(features), max(hint, 1), write_x)


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


def _refuse_short_rows(path: Path, n_cols: int, has_header: bool, n_rows: int) -> None:
    """ValueError naming the file line and field count of the first of the first ``n_rows``
    data rows of ``path`` that has fewer than ``n_cols`` fields (blank lines are skipped, as
    pandas skips them); nothing if there is none."""
    with _open_text(path) as fh:
        reader = csv.reader(fh)
        seen = 0
        for row in reader:
            if not row or (has_header and reader.line_num == 1):
                continue
            if len(row) < n_cols:
                raise ValueError(f"{path}, line {reader.line_num}: the row has {len(row)} field"
                                 f"{'s' if len(row) != 1 else ''} where {n_cols} are expected "
                                 f"({n_cols - 1} features and the label).")
            seen += 1
            if seen >= n_rows:
                return


def _first_csv_row(path: Path) -> list[str]:
    """The fields of the first non-empty line of ``path``; ValueError if there is none."""
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


# ------------------------------------------------------------------------ IDX


_IDX_DTYPES = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _idx_source(images: Path, labels_path: Path) -> Source:
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
    check_length(labels, n, str(labels_path), str(images))

    def blocks(step: int) -> Generator[Block, None, None]:
        with _open_binary(images) as fh:
            _idx_header(fh, images)
            for s in range(0, n, step):
                k = min(step, n - s)
                yield _read_rows(fh, img_dtype, k, p, images), labels[s : s + k]

    return Source(f"idx:({images}, {labels_path})", p, n,
                  lambda x: write_blocks(x, blocks(x.chunks[0])))


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


# ------------------------------------------------------------------------ file helpers


def _magic_kind(path: Path) -> str | None:
    """``"npy"`` or ``"idx"`` from the first bytes of ``path`` (gzip undone), else None."""
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
    """Open ``path`` (optionally gzip) as UTF-8 text for the ``csv`` module."""
    return io.TextIOWrapper(_open_binary(path), encoding="utf-8", newline="")
