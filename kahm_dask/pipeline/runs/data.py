"""Prepare a run's train and test stores from a source (the ingest stage), and the public
feature bounds of its DP release.

Sources: ``sklearn:<name>`` (bundled, offline), ``synthetic:blobs`` (generated lazily, block by
block, so it can exceed memory), a data file or file pair (ingested with
:func:`~kahm_dask.pipeline.stores.dataset.ingest`), or an existing dataset store (``*.zarr``).
Without a separate test source the rows are split with a stratified seeded split.

Raw rows are clipped to the public raw bounds (``data.bounds``; ``tanh255`` implies [0, 255]),
then scaled lazily: ``minmax`` maps the raw bounds to [0, 1] (without them, the training split's
min/max: private), ``tanh255`` = tanh(pixel/255), ``none`` keeps the values.
:func:`feature_bounds` is the one place that says what the bounds of the scaled features are and
whether they are public. The stores live in ``<output>/owner/data`` (the data owner's side).
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dask
import numpy as np
from sklearn.model_selection import train_test_split

from kahm_dask.datasets import load_bundled, split_and_scale
from kahm_dask.pipeline.config import SYNTHETIC_SOURCE
from kahm_dask.pipeline.runs.layout import run_paths
from kahm_dask.pipeline.stores.dataset import DatasetStore, ingest, open_dataset, store_bounds, write_dataset
from kahm_dask.pipeline.stores.synthetic import synthetic_blobs, synthetic_directions
from kahm_dask.privacy.bounds import (
    BOUNDS_PRIVATE,
    BOUNDS_PRIVATE_SCALING,
    BOUNDS_PUBLIC,
    ResolvedBounds,
    Scaling,
    public_bounds,
)
from kahm_dask.privacy.randomness import PrivacyLeakWarning
from kahm_dask.storage.atomic import sibling_path
from kahm_dask.storage.private import private_directory

__all__ = [
    "prepare_stores",
    "write_data_stores",
    "load_source",
    "raw_bounds",
    "feature_bounds",
    "data_scaling",
    "scaled_d",
    "TANH255_RAW_BOUNDS",
    "PRIVATE_MINMAX",
]

#: The run folder's two halves: ``public/`` may be published, ``owner/`` stays with the owner.
#: Raw bounds implied by ``scale: tanh255`` (8-bit pixels).
TANH255_RAW_BOUNDS = (0.0, 255.0)


def load_source(source: str, raw_path: Path, chunk_rows: int | None) -> DatasetStore:
    """Open a dataset store source, or ingest a file source into a new dataset store at
    ``raw_path`` (which must not exist: a store found there is never taken for the source)."""
    if source.endswith(".zarr") or source.endswith(".zarr/"):
        return open_dataset(source)
    if "," in source:
        source = tuple(s.strip() for s in source.split(","))
    return ingest(source, raw_path, chunk_rows=chunk_rows)


@contextmanager
def _raw_copies(train_path: Path) -> Iterator[Path]:
    """A new owner-only (0700) hidden folder beside the train store, ``.<name>.raw.tmp-<hex>``,
    for the raw copies of file sources while the stores are written from them; it is removed
    when the block ends, on success and on failure, so no later write can pick up its rows."""
    folder = private_directory(sibling_path(train_path, "raw.tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def raw_bounds(data, n_features: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The public range of the raw features: ``data.bounds``, [0, 255] for ``tanh255``, else None."""
    if data.bounds is not None:
        return public_bounds(data.bounds, n_features)
    if data.scale == "tanh255":
        return public_bounds(TANH255_RAW_BOUNDS, n_features)
    return None


def feature_bounds(data, n_features: int, train: DatasetStore | None = None) -> ResolvedBounds | None:
    """``(lower, upper, source, scaling)`` of the scaled features, the bounds of the DP release.

    ``source`` is :data:`~kahm_dask.privacy.bounds.BOUNDS_PUBLIC` when they follow from public
    raw bounds (``data.bounds``, or tanh255's [0, 255]), else private, with a
    :class:`~kahm_dask.privacy.randomness.PrivacyLeakWarning`: ``minmax`` without bounds
    scales by the training split's private min/max
    (:data:`~kahm_dask.privacy.bounds.BOUNDS_PRIVATE_SCALING`); ``none`` without bounds takes
    the min/max of the training store ``train`` (None is returned when it is not given). Call
    it only for DP runs (it warns). ``scaling``: the public
    :class:`~kahm_dask.privacy.bounds.Scaling` from the raw bounds, when there is one.
    """
    public = _feature_range(data, n_features)
    if public is not None:
        return ResolvedBounds(*public_bounds(public, n_features), BOUNDS_PUBLIC, data_scaling(data, n_features))
    if data.scale == "minmax":
        warnings.warn(
            "data.scale 'minmax' without data.bounds: the features are scaled by the training "
            "split's min and max, which are private and not covered by the guarantee. Give "
            "data.bounds: [lower, upper], the public range of the raw features.",
            PrivacyLeakWarning,
            stacklevel=2,
        )
        return ResolvedBounds(np.zeros(n_features), np.ones(n_features), BOUNDS_PRIVATE_SCALING)
    if train is None:
        return None
    return ResolvedBounds(*store_bounds(train), BOUNDS_PRIVATE)


def data_scaling(data, n_features: int) -> Scaling | None:
    """The :class:`~kahm_dask.privacy.bounds.Scaling` of a ``data`` section with public raw
    bounds (None without them: the scaling is then private)."""
    raw = raw_bounds(data, n_features)
    return None if raw is None else Scaling(data.scale, raw[0], raw[1])


def scaled_d(data, d, n_features: int):
    """``privacy.d``, given in raw units, in the units of the scaled features (None stays None:
    the bound width). Needs public raw bounds for ``minmax``."""
    if d is None:
        return None
    scaling = data_scaling(data, n_features)
    if scaling is None:
        if data.scale == "minmax":
            raise ValueError("privacy.d is in raw units and needs data.bounds to be scaled with minmax; "
                             "give data.bounds (or leave privacy.d unset: the width of the bounds).")
        return d
    out = np.atleast_1d(scaling.scaled_d(d))
    return float(out[0]) if np.all(out == out[0]) else out.tolist()


def _transform(X, X_train, data):
    """Clip to the public raw bounds, then scale (NumPy or Dask arrays, lazily for Dask)."""
    raw = raw_bounds(data, X.shape[1])
    dtype = X.dtype if np.issubdtype(X.dtype, np.floating) else np.dtype(np.float64)
    if raw is not None:
        lo, hi = raw[0].astype(dtype), raw[1].astype(dtype)
        X, X_train = np.minimum(np.maximum(X, lo), hi), np.minimum(np.maximum(X_train, lo), hi)
    if data.scale == "none":
        return X
    if data.scale == "tanh255":
        return np.tanh(X / dtype.type(255.0))
    if raw is not None:
        low, width = raw[0], raw[1] - raw[0]
    else:
        low, high = (np.asarray(v, np.float64) for v in dask.compute(X_train.min(axis=0), X_train.max(axis=0)))
        width = np.where(high > low, high - low, 1.0)
    if np.all(low == 0) and np.all(width == 1):
        return X
    return (X - low) / width


def _feature_range(data, n_features: int):
    """The public feature range recorded in the stores (None when it is not public)."""
    raw = raw_bounds(data, n_features)
    if raw is None:
        return None
    if data.scale == "minmax":
        return (0.0, 1.0)
    if data.scale == "tanh255":
        return (np.tanh(raw[0] / 255.0), np.tanh(raw[1] / 255.0))
    return raw


def prepare_stores(cfg, out: Path) -> tuple[DatasetStore, DatasetStore]:
    """The train and test stores of a pipeline run at ``out``: ``owner/data/{train,test}.zarr``
    (:class:`~kahm_dask.pipeline.runs.layout.RunPaths`; :func:`write_data_stores`; both reused if
    they exist: a rerun resumes)."""
    paths = run_paths(out, private=False)  # where the data stores are does not depend on privacy
    private_directory(paths.data)
    train_path, test_path = paths.train_store, paths.test_store
    if train_path.exists() and test_path.exists():
        return open_dataset(train_path), open_dataset(test_path)
    return write_data_stores(cfg.data, train_path, test_path, overwrite=True)


def write_data_stores(
    data, train_path: Path, test_path: Path | None, *, overwrite: bool = False, dtype: str | None = None
) -> tuple[DatasetStore, DatasetStore | None]:
    """Write the stores a ``data`` section (:class:`~kahm_dask.pipeline.config.DataConfig`)
    describes: raw rows clipped to the public raw bounds and scaled (module docstring), split
    into ``train_path`` and ``test_path`` (stratified, ``data.test_size``, ``data.split_seed``;
    or the ``data.test_source`` rows), or all rows into ``train_path`` when ``test_path`` is None.

    Each store records its public ``feature_range`` and ``scaling`` when the bounds are public.
    ``dtype``: of the stored rows (default float64; a synthetic source's own).
    File sources are read through raw copies in a private folder beside the train store that
    lives only while the stores are written (:func:`_raw_copies`).
    """
    with _raw_copies(Path(train_path)) as raw_folder:
        return _write_data_stores(data, train_path, test_path, raw_folder, overwrite=overwrite, dtype=dtype)


def _write_data_stores(
    data, train_path: Path, test_path: Path | None, raw_folder: Path, *, overwrite: bool, dtype: str | None
) -> tuple[DatasetStore, DatasetStore | None]:
    """:func:`write_data_stores`, the raw copies of file sources in ``raw_folder``."""
    kw = {"chunk_rows": data.chunk_rows, "overwrite": overwrite}
    if data.source.startswith("sklearn:"):
        X, y = load_bundled(data.source.split(":", 1)[1])
        if test_path is None:
            Xtr, ytr, Xte, yte = X, y, None, None
        else:
            sp = split_and_scale(X, y, test_size=data.test_size, split_seed=data.split_seed, scale=False)
            Xtr, ytr, Xte, yte = sp.X_train, sp.y_train, sp.X_test, sp.y_test
        source_dtype = "float64"
    elif data.source == SYNTHETIC_SOURCE:
        syn = data.synthetic
        common = dict(seed=data.split_seed, dtype=syn.dtype, chunk_rows=data.chunk_rows or 20_000)
        if syn.generator == "directions":
            X, y = synthetic_directions(
                syn.n_samples, syn.n_features, syn.n_classes, n_directions=syn.n_directions,
                amplitude=syn.amplitude, **common,
            )
        else:
            X, y = synthetic_blobs(syn.n_samples, syn.n_features, syn.n_classes, **common)
        n_train = syn.n_samples if test_path is None else syn.n_samples - int(round(syn.n_samples * data.test_size))
        Xtr, ytr, Xte, yte = X[:n_train], y[:n_train], X[n_train:], y[n_train:]  # labels are i.i.d.
        source_dtype = syn.dtype
    else:
        raw = load_source(data.source, raw_folder / "train.zarr", data.chunk_rows)
        source_dtype = "float64"
        if data.test_source:
            test_raw = load_source(data.test_source, raw_folder / "test.zarr", data.chunk_rows)
            Xtr, ytr, Xte, yte = raw.X(), raw.labels(), test_raw.X(), test_raw.labels()
        elif test_path is None:
            Xtr, ytr, Xte, yte = raw.X(), raw.labels(), None, None
        else:
            idx_tr, idx_te = train_test_split(
                np.arange(raw.n_samples), test_size=data.test_size, stratify=raw.y(), random_state=data.split_seed
            )
            idx_tr.sort(), idx_te.sort()
            labels = raw.labels()
            Xtr, ytr, Xte, yte = raw.X()[idx_tr], labels[idx_tr], raw.X()[idx_te], labels[idx_te]
    p = Xtr.shape[1]
    attrs = {"feature_range": _feature_range(data, p), "scaling": _scaling(data, p), "dtype": dtype or source_dtype}
    train = write_dataset(train_path, _transform(Xtr, Xtr, data), ytr, source=data.source, **attrs, **kw)
    if test_path is None:
        return train, None
    return train, write_dataset(test_path, _transform(Xte, Xtr, data), yte, source=data.source, **attrs, **kw)


#: The ``scaling`` attribute of stores scaled by the training rows' private min and max.
PRIVATE_MINMAX = {"kind": "minmax", "private": True}


def _scaling(data, n_features: int) -> dict | None:
    """The public scaling of the features (``Scaling.describe()``), :data:`PRIVATE_MINMAX` for
    ``minmax`` without public raw bounds (a DP release from the store then names it), else None."""
    scaling = data_scaling(data, n_features)
    if scaling is None:
        return dict(PRIVATE_MINMAX) if data.scale == "minmax" else None
    return None if scaling.kind == "none" else scaling.describe()
