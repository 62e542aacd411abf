"""Tests of the Zarr dataset store: round trips, laziness, errors, atomicity, markers."""

from __future__ import annotations

import errno
import gzip
import json
import shutil
import warnings
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import zarr
from sklearn.datasets import load_digits

from kahm_dask.pipeline.stores import dataset as st
from kahm_dask.pipeline.stores.dataset import (
    DatasetStore,
    StoreError,
    ingest,
    is_complete,
    mark_complete,
    open_dataset,
    write_dataset,
)
from kahm_dask.privacy.fingerprint import fingerprint
from tests._kit import leftovers

# ------------------------------------------------------------------------ helpers


def make_data(n: int = 50, p: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random X (n, p) and integer labels (n,) with classes 3, 5, 7."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, p)), rng.choice([3, 5, 7], size=n)


def assert_roundtrip(ds: DatasetStore, X: np.ndarray, labels: np.ndarray) -> None:
    np.testing.assert_array_equal(ds.X().compute(), X)
    np.testing.assert_array_equal(ds.labels(), labels)
    assert (ds.n_samples, ds.n_features) == X.shape
    classes, counts = np.unique(labels, return_counts=True)
    assert ds.classes == tuple(classes.tolist())
    assert ds.class_counts == dict(zip(classes.tolist(), counts.tolist(), strict=True))
    for code, value in enumerate(ds.classes):
        np.testing.assert_array_equal(ds.class_rows(code), np.flatnonzero(labels == value))


def write_idx(path: Path, array: np.ndarray, code: int, compress: bool) -> None:
    """Write ``array`` in the IDX format (big-endian), gzip-compressed if asked."""
    header = bytes([0, 0, code, array.ndim]) + np.array(array.shape, ">u4").tobytes()
    data = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    with (gzip.open if compress else open)(path, "wb") as fh:
        fh.write(data)


@pytest.fixture
def stored(tmp_path: Path) -> tuple[DatasetStore, np.ndarray, np.ndarray]:
    X, y = make_data()
    return write_dataset(tmp_path / "d.zarr", X, y, chunk_rows=16), X, y


# --------------------------------------------------------------------- round trips


def test_write_dataset_round_trip_and_attributes(stored) -> None:
    ds, X, y = stored
    assert_roundtrip(ds, X, y)
    assert ds.chunk_rows == 16
    np.testing.assert_array_equal(ds.y(), np.searchsorted([3, 5, 7], y))
    attrs = zarr.open_group(ds.path, mode="r", zarr_format=3).attrs["kahm_dask"]
    assert attrs["format_version"] == 1
    assert attrs["classes"] == [3, 5, 7]
    assert attrs["class_counts"] == [int((y == c).sum()) for c in (3, 5, 7)]
    assert attrs["source"] == "array"
    assert "feature_range" not in attrs  # never computed from the private data
    assert set(attrs) == {"format_version", "n_samples", "n_features", "classes",
                          "class_counts", "source", "created", "fingerprint"}
    assert attrs["fingerprint"]["rows"] == fingerprint(X).rows  # the data set's identity (private)


def test_string_labels_float32_and_public_feature_range(tmp_path: Path) -> None:
    X, y = make_data(p=3)
    labels = np.array(["cat", "dog", "emu"])[y % 3]
    ds = write_dataset(tmp_path / "d.zarr", X, list(labels), dtype="float32",
                       feature_range=(-5.0, [5, 6, 7]))
    assert ds.X().dtype == np.float32
    assert ds.read_slice(0, 2).dtype == np.float64
    np.testing.assert_array_equal(ds.X().compute(), X.astype(np.float32))
    np.testing.assert_array_equal(ds.labels(), labels)
    assert ds.attrs["feature_range"] == {"min": [-5.0] * 3, "max": [5.0, 6.0, 7.0]}


def test_default_chunk_rows_is_about_32_mib_and_capped_by_n(tmp_path: Path) -> None:
    small = write_dataset(tmp_path / "small.zarr", *make_data(n=30))
    assert small.chunk_rows == 30
    wide = write_dataset(tmp_path / "wide.zarr", da.zeros((20, 2**19)), np.zeros(20, int))
    assert wide.chunk_rows == 32 * 2**20 // (2**19 * 8)


def test_x_is_lazy_zarr_backed_with_row_chunks(stored) -> None:
    ds, X, _ = stored
    x = ds.X()
    assert isinstance(x, da.Array)
    assert any(isinstance(v, zarr.Array) for v in dict(x.__dask_graph__()).values())
    assert x.chunks == ((16, 16, 16, 2), (4,))


def test_read_rows_any_order_with_repeats_and_read_slice(stored) -> None:
    ds, X, y = stored
    rows = np.array([49, 0, 17, 17, 33, 1])
    np.testing.assert_array_equal(ds.read_rows(rows), X[rows])
    assert ds.read_rows([]).shape == (0, 4)
    np.testing.assert_array_equal(ds.read_slice(10, 40), X[10:40])
    with pytest.raises(IndexError, match=r"\[0, 50\)"):
        ds.read_rows([0, 50])
    with pytest.raises(IndexError, match="start <= stop"):
        ds.read_slice(5, 51)
    with pytest.raises(ValueError, match="codes 0..2"):
        ds.class_rows(3)


def test_ingest_npz_with_custom_keys(tmp_path: Path) -> None:
    X, y = make_data()
    np.savez_compressed(tmp_path / "d.npz", feats=X, target=y)
    ds = ingest(tmp_path / "d.npz", tmp_path / "d.zarr", x_key="feats", y_key="target",
                chunk_rows=7)
    assert_roundtrip(ds, X, y)
    assert ds.attrs["source"].startswith("npz:")


def test_ingest_npz_fortran_order(tmp_path: Path) -> None:
    X, y = make_data()
    np.savez(tmp_path / "d.npz", X=np.asfortranarray(X), y=y)
    assert_roundtrip(ingest(tmp_path / "d.npz", tmp_path / "d.zarr", chunk_rows=9), X, y)


def test_ingest_npy_pair(tmp_path: Path) -> None:
    X, y = make_data()
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", y.astype(np.uint8))
    ds = ingest((tmp_path / "x.npy", str(tmp_path / "y.npy")), tmp_path / "d.zarr")
    assert_roundtrip(ds, X, y)


def test_ingest_csv_with_header_label_last(tmp_path: Path) -> None:
    X, y = make_data()
    lines = ["a,b,c,d,label"] + [",".join(map(repr, r.tolist())) + f",{c}" for r, c in zip(X, y, strict=True)]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    ds = ingest(tmp_path / "d.csv", tmp_path / "d.zarr", chunk_rows=8)
    assert_roundtrip(ds, X, y)
    assert ds.classes == (3, 5, 7)  # integer labels stay integers


def test_ingest_csv_gz_without_header_string_label_first(tmp_path: Path) -> None:
    X, y = make_data()
    labels = np.array(["a", "b", "c"])[y % 3]
    lines = [f"{c}," + ",".join(map(repr, r.tolist())) for r, c in zip(X, labels, strict=True)]
    with gzip.open(tmp_path / "d.csv.gz", "wt") as fh:
        fh.write("\n".join(lines))
    ds = ingest(tmp_path / "d.csv.gz", tmp_path / "d.zarr", label_column=0, chunk_rows=8)
    assert_roundtrip(ds, X, labels)


@pytest.mark.parametrize("compress", [False, True])
def test_ingest_idx_pair(tmp_path: Path, compress: bool) -> None:
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(30, 5, 4), dtype=np.uint8)
    labels = rng.integers(0, 10, size=30, dtype=np.uint8)
    suffix = ".gz" if compress else ""
    write_idx(tmp_path / f"img.idx3-ubyte{suffix}", images, 0x08, compress)
    write_idx(tmp_path / f"lab.idx1-ubyte{suffix}", labels, 0x08, compress)
    ds = ingest((tmp_path / f"img.idx3-ubyte{suffix}", tmp_path / f"lab.idx1-ubyte{suffix}"),
                tmp_path / "d.zarr", chunk_rows=7)
    assert_roundtrip(ds, images.reshape(30, 20).astype(float), labels)


def test_ingest_idx_float_images(tmp_path: Path) -> None:
    images = np.linspace(-1, 1, 24).reshape(6, 2, 2).astype(np.float32)
    write_idx(tmp_path / "img", images, 0x0D, False)
    write_idx(tmp_path / "lab", np.arange(6, dtype=np.uint8) % 2, 0x08, False)
    ds = ingest((tmp_path / "img", tmp_path / "lab"), tmp_path / "d.zarr")
    np.testing.assert_array_equal(ds.X().compute(), images.reshape(6, 4))


def test_ingest_sklearn_digits(tmp_path: Path) -> None:
    X, y = load_digits(return_X_y=True)
    ds = ingest("sklearn:digits", tmp_path / "d.zarr")
    assert_roundtrip(ds, X, y)
    assert ds.attrs["source"] == "sklearn:digits"


def _writer_of(kind: str, X: np.ndarray, y: np.ndarray, where: Path):
    """A function ``(path, **options) -> DatasetStore`` that stores X and y from the source
    ``kind``, through ``write_dataset`` (arrays) or ``ingest`` (files)."""
    if kind == "array":
        return lambda path, **kw: write_dataset(path, X, y, **kw)
    if kind == "dask":  # chunks that do not line up with the store's 16-row chunks
        return lambda path, **kw: write_dataset(path, da.from_array(X, chunks=(11, 2)), y, **kw)
    if kind == "npz":
        np.savez(where / "d.npz", X=X, y=y)
        return lambda path, **kw: ingest(where / "d.npz", path, **kw)
    lines = [",".join(map(repr, r.tolist())) + f",{c}" for r, c in zip(X, y, strict=True)]
    (where / "d.csv").write_text("\n".join(lines) + "\n")
    return lambda path, **kw: ingest(where / "d.csv", path, **kw)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", ["array", "dask", "npz", "csv"])
def test_stored_fingerprint_is_that_of_the_stored_rows(tmp_path: Path, kind: str, dtype: str) -> None:
    # The fingerprint is hashed block by block as the rows are written (no pass after the
    # write): it must equal the fingerprint of the stored values, in their order, computed
    # from the whole matrix, whatever the source, its blocks and the store's dtype.
    X, y = make_data(n=61, p=4, seed=3)
    ds = _writer_of(kind, X, y, tmp_path)(tmp_path / "d.zarr", chunk_rows=16, dtype=dtype)
    stored = ds.X().compute()
    assert stored.dtype == np.dtype(dtype)
    expected = fingerprint(stored)
    assert ds.fingerprint() == expected
    assert ds.attrs["fingerprint"] == expected.to_dict()
    assert ds.fingerprint() == st.array_fingerprint(ds.X())  # the pass it replaces
    if dtype == "float32":  # hashed after the cast, not before it
        assert ds.fingerprint() != fingerprint(X)


def test_verified_fingerprint_reads_every_chunk_and_names_a_damaged_one(stored) -> None:
    # What a DP release reads before it spends: the recorded fingerprint, found again from the
    # rows; a chunk cut short, or rows changed since the write, fail with one StoreError.
    ds, X, y = stored
    assert ds.verified_fingerprint() == ds.fingerprint() == fingerprint(X)
    chunk = ds.path / "X" / "c" / "2" / "0"
    good = chunk.read_bytes()
    chunk.write_bytes(good[: len(good) // 2])
    with pytest.raises(StoreError, match=r"^chunk 2 of X \(rows 32 to 47\) of the dataset store .*d\.zarr cannot be "
                                         r"read: [^\n]*; write it again from its source\.$"):
        ds.verified_fingerprint()
    chunk.write_bytes(good)
    zarr.open_group(str(ds.path), mode="r+")["X"][0, 0] = X[0, 0] + 1.0  # decodes, but another value
    with pytest.raises(StoreError, match=r"rows of X .* differ from those written to it"):
        ds.verified_fingerprint()


def test_dask_ingest_larger_than_a_chunk_never_computes_whole(tmp_path: Path,
                                                             monkeypatch) -> None:
    src = da.random.default_rng(0).random((200_000, 20), chunks=(7_000, 20))
    y = np.arange(200_000) % 3

    def forbidden(*args, **kwargs):
        raise AssertionError("the whole array was computed")

    with monkeypatch.context() as m:
        m.setattr(da.Array, "compute", forbidden)
        m.setattr(da.Array, "__array__", forbidden)
        ds = write_dataset(tmp_path / "d.zarr", src, y, chunk_rows=25_000)
    assert ds.X().chunks[0] == (25_000,) * 8
    assert bool((ds.X() == src).all().compute())
    np.testing.assert_array_equal(ds.y(), y)


# ------------------------------------------------------------------------- errors


def test_missing_source_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.npz"):
        ingest(tmp_path / "nope.npz", tmp_path / "d.zarr")
    np.save(tmp_path / "x.npy", np.zeros((2, 2)))
    with pytest.raises(FileNotFoundError, match="y.npy"):
        ingest((tmp_path / "x.npy", tmp_path / "y.npy"), tmp_path / "d.zarr")


def test_unknown_formats(tmp_path: Path) -> None:
    (tmp_path / "d.txt").write_text("1,2\n")
    with pytest.raises(ValueError, match="Unknown source format"):
        ingest(tmp_path / "d.txt", tmp_path / "d.zarr")
    np.save(tmp_path / "x.npy", np.zeros((2, 2)))
    with pytest.raises(ValueError, match="pass the pair"):
        ingest(tmp_path / "x.npy", tmp_path / "d.zarr")
    with pytest.raises(ValueError, match="Unknown file pair format"):
        ingest((tmp_path / "x.npy", tmp_path / "d.txt"), tmp_path / "d.zarr")
    with pytest.raises(ValueError, match="need the network"):
        ingest("sklearn:mnist_784", tmp_path / "d.zarr")


def test_wrong_shapes(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", X=np.zeros((4, 2, 2)), y=np.zeros(4, int))
    with pytest.raises(ValueError, match="must be 2-D"):
        ingest(tmp_path / "d.npz", tmp_path / "d.zarr")
    np.savez(tmp_path / "e.npz", X=np.zeros((4, 2)), y=np.zeros(5, int))
    with pytest.raises(ValueError, match="has 5 labels but .* has 4 rows"):
        ingest(tmp_path / "e.npz", tmp_path / "d.zarr")
    np.savez(tmp_path / "f.npz", X=np.zeros((4, 2)))
    with pytest.raises(ValueError, match="no array 'y'.*y_key"):
        ingest(tmp_path / "f.npz", tmp_path / "d.zarr")
    write_idx(tmp_path / "lab", np.zeros(3, np.uint8), 0x08, False)
    write_idx(tmp_path / "img", np.zeros((3, 2, 2), np.uint8), 0x08, False)
    with pytest.raises(ValueError, match="labels file has 1.*in that order"):
        ingest((tmp_path / "img", tmp_path / "img"), tmp_path / "d.zarr")
    with pytest.raises(ValueError, match="images file has at least 2.*in that order"):
        ingest((tmp_path / "lab", tmp_path / "lab"), tmp_path / "d.zarr")
    assert not (tmp_path / "d.zarr").exists()


def test_bad_labels(tmp_path: Path) -> None:
    X = np.zeros((3, 2))
    with pytest.raises(TypeError, match="all integers or all strings"):
        write_dataset(tmp_path / "d.zarr", X, [1, "a", 2])
    with pytest.raises(TypeError, match="non-integer floats"):
        write_dataset(tmp_path / "d.zarr", X, [0.5, 1.0, 2.0])
    with pytest.raises(TypeError, match="got dtype bool"):
        write_dataset(tmp_path / "d.zarr", X, np.array([True, False, True]))
    float_codes = write_dataset(tmp_path / "d.zarr", X, [2.0, 1.0, 2.0])
    assert float_codes.classes == (1, 2)
    with pytest.raises(ValueError, match="1-D"):
        write_dataset(tmp_path / "d.zarr", X, np.zeros((3, 1), int))


@pytest.mark.parametrize("as_dask", [False, True])
def test_nan_names_row_and_leaves_nothing(tmp_path: Path, as_dask: bool) -> None:
    X, y = make_data(n=2000)
    X[23, 2] = np.nan
    X[1500, 0] = np.inf  # only the first offending entry is reported
    source = da.from_array(X, chunks=(6, 4)) if as_dask else X
    with pytest.raises(ValueError, match="row 23, column 2"):
        write_dataset(tmp_path / "d.zarr", source, y, chunk_rows=10)
    assert list(tmp_path.iterdir()) == []


def test_csv_explicit_header_and_header_only_file(tmp_path: Path) -> None:
    (tmp_path / "num.csv").write_text("0,1,2\n1.5,2.5,1\n3.5,4.5,2\n")
    ds = ingest(tmp_path / "num.csv", tmp_path / "d.zarr", header=True)
    np.testing.assert_array_equal(ds.X().compute(), [[1.5, 2.5], [3.5, 4.5]])
    assert ds.classes == (1, 2)
    (tmp_path / "empty.csv").write_text("a,b,label\n")
    with pytest.raises(ValueError, match="no rows"):
        ingest(tmp_path / "empty.csv", tmp_path / "e.zarr")
    assert not (tmp_path / "e.zarr").exists() and leftovers(tmp_path) == []


def test_nan_in_csv_and_unparsable_csv(tmp_path: Path) -> None:
    (tmp_path / "nan.csv").write_text("1,2,0\n3,nan,1\n")
    with pytest.raises(ValueError, match="row 1, column 1"):
        ingest(tmp_path / "nan.csv", tmp_path / "d.zarr")
    (tmp_path / "nolabel.csv").write_text("1,2,0\n3,4,\n")
    with pytest.raises(ValueError, match="label is missing at row 1"):
        ingest(tmp_path / "nolabel.csv", tmp_path / "d.zarr")
    (tmp_path / "bad.csv").write_text("1,2,0\n3,x,1\n")
    with pytest.raises(ValueError, match="Cannot parse .*bad.csv"):
        ingest(tmp_path / "bad.csv", tmp_path / "d.zarr")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "nan.csv",
                                                          "nolabel.csv"]


def test_float32_overflow_is_reported(tmp_path: Path) -> None:
    X = np.ones((3, 2))
    X[2, 1] = 1e300
    with pytest.raises(ValueError, match="row 2, column 1.*overflows float32"):
        write_dataset(tmp_path / "d.zarr", X, [0, 1, 0], dtype="float32")


def test_existing_path_needs_overwrite(stored, tmp_path: Path) -> None:
    ds, _, _ = stored
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_dataset(ds.path, *make_data())
    (tmp_path / "precious").mkdir()
    with pytest.raises(FileExistsError, match="not a Zarr store"):
        write_dataset(tmp_path / "precious", *make_data(), overwrite=True)


def test_open_dataset_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="No dataset store"):
        open_dataset(tmp_path / "missing.zarr")
    (tmp_path / "plain").mkdir()
    with pytest.raises(StoreError, match="not a Zarr v3 group"):
        open_dataset(tmp_path / "plain")
    zarr.open_group(tmp_path / "g.zarr", mode="w", zarr_format=3)
    with pytest.raises(StoreError, match="no 'kahm_dask' attributes"):
        open_dataset(tmp_path / "g.zarr")


def test_corrupt_stores_raise_store_error(tmp_path: Path) -> None:
    X, y = make_data()
    paths = [write_dataset(tmp_path / f"{i}.zarr", X, y).path for i in range(5)]
    shutil.rmtree(paths[0] / "y")
    edit = {1: {"n_samples": 49}, 2: {"format_version": 2}, 3: {"class_counts": [1, 2, 3]}}
    for i, change in edit.items():
        group = zarr.open_group(paths[i], mode="r+", zarr_format=3)
        group.attrs["kahm_dask"] = {**group.attrs["kahm_dask"], **change}
    index = zarr.open_group(paths[4], mode="r+", zarr_format=3)["class_index"]
    index.create_array("1", data=np.arange(3, dtype=np.int64), overwrite=True)
    patterns = ["array 'y' is missing", "n_samples=49", "format_version 2", "class_counts",
                r"class_index/1 has shape \(3,\) but class_counts says \d+ rows"]
    for path, pattern in zip(paths, patterns, strict=True):
        with pytest.raises(StoreError, match=pattern):
            open_dataset(path)


# ---------------------------------------------------------------------- atomicity


def test_interrupted_ingest_leaves_no_store_and_no_temp(tmp_path: Path,
                                                        monkeypatch) -> None:
    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(st, "_write_labels", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        write_dataset(tmp_path / "d.zarr", *make_data())
    assert list(tmp_path.iterdir()) == []


def test_overwrite_keeps_old_store_if_new_write_fails(stored, monkeypatch) -> None:
    ds, X, y = stored
    bad = np.ones((5, 4))
    bad[4, 0] = np.inf
    with pytest.raises(ValueError, match="row 4, column 0"):
        write_dataset(ds.path, bad, np.zeros(5, int), overwrite=True)
    assert_roundtrip(open_dataset(ds.path), X, y)
    assert leftovers(ds.path.parent) == []


def test_path_created_while_writing_is_not_replaced(tmp_path: Path, monkeypatch) -> None:
    real = st._write_labels

    def someone_else_writes(*args, **kwargs):
        (tmp_path / "d.zarr").mkdir()
        (tmp_path / "d.zarr" / "theirs.txt").write_text("precious")
        return real(*args, **kwargs)

    monkeypatch.setattr(st, "_write_labels", someone_else_writes)
    with pytest.raises(FileExistsError, match="already exists"):
        write_dataset(tmp_path / "d.zarr", *make_data())
    assert [p.name for p in (tmp_path / "d.zarr").iterdir()] == ["theirs.txt"]
    assert leftovers(tmp_path) == []


def test_overwrite_replaces_store(stored) -> None:
    ds, _, _ = stored
    X, y = make_data(n=10, p=2, seed=5)
    new = write_dataset(ds.path, X, y, overwrite=True)
    assert_roundtrip(new, X, y)
    assert leftovers(ds.path.parent) == []


# ---------------------------------------------------------------- completion markers


def test_completion_marker(tmp_path: Path) -> None:
    assert is_complete(tmp_path) is None
    mark_complete(tmp_path, {"rows": 3, "seed": [1, 2]})
    assert is_complete(tmp_path) == {"rows": 3, "seed": [1, 2]}
    assert json.loads((tmp_path / "_COMPLETE.json").read_text())["rows"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["_COMPLETE.json"]
    with pytest.raises(TypeError, match="JSON-serializable"):
        mark_complete(tmp_path, {"x": object()})
    with pytest.raises(FileNotFoundError):
        mark_complete(tmp_path / "missing", {})


def test_completion_marker_in_a_zarr_group_only_warns_on_listing(stored) -> None:
    ds, _, _ = stored
    mark_complete(ds.path, {"done": True})
    open_dataset(ds.path)  # direct access by name: no warning, still valid
    with pytest.warns(UserWarning, match="_COMPLETE.json"):
        list(zarr.open_group(ds.path, mode="r").array_keys())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert is_complete(ds.path) == {"done": True}


# --------------------------------------------------------------------- writes that fail half-way


def test_completion_marker_failure_mid_write_keeps_the_old_marker(tmp_path, disk_full):
    mark_complete(tmp_path, {"noise_id": "a"})
    disk_full()
    with pytest.raises(OSError, match="No space left"):
        mark_complete(tmp_path, {"noise_id": "b"})
    assert is_complete(tmp_path) == {"noise_id": "a"}
    assert leftovers(tmp_path) == []


def test_dataset_store_failure_mid_write_keeps_the_old_store(tmp_path, monkeypatch):
    X = np.random.default_rng(5).random((30, 3))
    y = np.arange(30) % 2
    write_dataset(tmp_path / "s.zarr", X, y, chunk_rows=10)
    real = zarr.Group.create_array

    def fails_on_class_index(self, name, *args, **kwargs):
        if name == "1":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(zarr.Group, "create_array", fails_on_class_index)
    with pytest.raises(OSError, match="No space left"):
        write_dataset(tmp_path / "s.zarr", X[:20] + 1, y[:20], overwrite=True)
    with pytest.raises(OSError, match="No space left"):
        write_dataset(tmp_path / "t.zarr", X, y)
    store = open_dataset(tmp_path / "s.zarr")
    np.testing.assert_array_equal(store.X().compute(), X)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]
