"""Prepare a run's train and test stores from a source (the ingest stage), and the public
feature bounds of its DP release.

Sources: ``sklearn:<name>`` (bundled, offline), ``synthetic:blobs`` (generated lazily, block by
block, so it can exceed memory), a data file or file pair (ingested with
:func:`~kahm_dask.pipeline.store.ingest`), or an existing dataset store (``*.zarr``).
Without a separate test source the rows are split with a stratified seeded split.

Raw rows are clipped to the public raw bounds (``data.bounds``; ``tanh255`` implies [0, 255]),
then scaled lazily: ``minmax`` maps the raw bounds to [0, 1] (without them, the training split's
min/max: private), ``tanh255`` = tanh(pixel/255), ``none`` keeps the values.
:func:`feature_bounds` is the one place that says what the bounds of the scaled features are and
whether they are public. The stores live in ``<output>/owner/data`` (the data owner's side).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import dask
import numpy as np
from sklearn.model_selection import train_test_split

from kahm_dask.datasets import load_bundled, split_and_scale
from kahm_dask.pipeline.store import DatasetStore, ingest, open_dataset, write_dataset
from kahm_dask.pipeline.synthetic import synthetic_blobs
from kahm_dask.privacy.bounds import (
    BOUNDS_PRIVATE,
    BOUNDS_PUBLIC,
    bounds_from_private_data,
    public_bounds,
)
from kahm_dask.privacy.randomness import PrivacyLeakWarning

__all__ = [
    "prepare_stores",
    "load_source",
    "raw_bounds",
    "feature_bounds",
    "store_bounds",
    "OWNER",
    "PUBLIC",
    "TANH255_RAW_BOUNDS",
]

#: The run folder's two halves: ``public/`` may be published, ``owner/`` stays with the owner.
PUBLIC, OWNER = "public", "owner"
#: Raw bounds implied by ``scale: tanh255`` (8-bit pixels).
TANH255_RAW_BOUNDS = (0.0, 255.0)


def load_source(source: str, raw_path: Path, chunk_rows: int | None) -> DatasetStore:
    """Open or ingest a file source into a dataset store at ``raw_path``."""
    if source.endswith(".zarr") or source.endswith(".zarr/"):
        return open_dataset(source)
    if "," in source:
        source = tuple(s.strip() for s in source.split(","))
    if raw_path.exists():
        return open_dataset(raw_path)
    return ingest(source, raw_path, chunk_rows=chunk_rows)


def raw_bounds(data, n_features: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The public range of the raw features: ``data.bounds``, [0, 255] for ``tanh255``, else None."""
    if data.bounds is not None:
        return public_bounds(data.bounds, n_features)
    if data.scale == "tanh255":
        return public_bounds(TANH255_RAW_BOUNDS, n_features)
    return None


def feature_bounds(
    data, n_features: int, train: DatasetStore | None = None
) -> tuple[np.ndarray, np.ndarray, str] | None:
    """``(lower, upper, source)`` of the scaled features, the bounds of the DP release.

    ``source`` is :data:`~kahm_dask.privacy.bounds.BOUNDS_PUBLIC` when they follow from public
    raw bounds (``data.bounds``, or tanh255's [0, 255]), else
    :data:`~kahm_dask.privacy.bounds.BOUNDS_PRIVATE`, with a
    :class:`~kahm_dask.privacy.randomness.PrivacyLeakWarning`: ``minmax`` without bounds
    scales by the training split's private min/max; ``none`` without bounds takes the min/max
    of the training store ``train`` (None is returned when it is not given). Call it only for
    DP runs (it warns).
    """
    public = _feature_range(data, n_features)
    if public is not None:
        return (*public_bounds(public, n_features), BOUNDS_PUBLIC)
    if data.scale == "minmax":
        warnings.warn(
            "data.scale 'minmax' without data.bounds: the features are scaled by the training "
            "split's min and max, which are private and not covered by the guarantee. Give "
            "data.bounds: [lower, upper], the public range of the raw features.",
            PrivacyLeakWarning,
            stacklevel=2,
        )
        return (np.zeros(n_features), np.ones(n_features), BOUNDS_PRIVATE)
    if train is None:
        return None
    return (*store_bounds(train), BOUNDS_PRIVATE)


def store_bounds(store: DatasetStore) -> tuple[np.ndarray, np.ndarray]:
    """Each feature's min and max over a dataset store (private: warns PrivacyLeakWarning)."""
    X = store.X()
    low, high = dask.compute(X.min(axis=0), X.max(axis=0))
    return bounds_from_private_data(np.stack([np.asarray(low, np.float64), np.asarray(high, np.float64)]),
                                    stacklevel=2)


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
    """Write ``out/owner/data/train.zarr`` and ``out/owner/data/test.zarr`` for a pipeline config.

    Reuses both stores if they already exist (a rerun resumes). The training store records
    the public feature range (when there is one) as its ``feature_range`` attribute.
    """
    data = cfg.data
    data_dir = Path(out) / OWNER / "data"
    train_path, test_path = data_dir / "train.zarr", data_dir / "test.zarr"
    if train_path.exists() and test_path.exists():
        return open_dataset(train_path), open_dataset(test_path)
    data_dir.mkdir(parents=True, exist_ok=True)
    kw = {"chunk_rows": data.chunk_rows, "overwrite": True}
    if data.source.startswith("sklearn:"):
        X, y = load_bundled(data.source.split(":", 1)[1])
        sp = split_and_scale(X, y, test_size=data.test_size, split_seed=data.split_seed, scale=False)
        Xtr, Xte = _transform(sp.X_train, sp.X_train, data), _transform(sp.X_test, sp.X_train, data)
        fr = _feature_range(data, X.shape[1])
        return (
            write_dataset(train_path, Xtr, sp.y_train, source=data.source, feature_range=fr, **kw),
            write_dataset(test_path, Xte, sp.y_test, source=data.source, feature_range=fr, **kw),
        )
    if data.source == "synthetic:blobs":
        syn = data.synthetic
        X, y = synthetic_blobs(
            syn.n_samples, syn.n_features, syn.n_classes, seed=data.split_seed, dtype=syn.dtype,
            chunk_rows=data.chunk_rows or 20_000,
        )
        n_train = syn.n_samples - int(round(syn.n_samples * data.test_size))  # labels are i.i.d.
        Xtr, ytr, Xte, yte = X[:n_train], y[:n_train], X[n_train:], y[n_train:]
        Xtr, Xte = _transform(Xtr, Xtr, data), _transform(Xte, Xtr, data)
        fr = _feature_range(data, syn.n_features)
        return (
            write_dataset(train_path, Xtr, ytr, source=data.source, dtype=syn.dtype, feature_range=fr, **kw),
            write_dataset(test_path, Xte, yte, source=data.source, dtype=syn.dtype, feature_range=fr, **kw),
        )
    raw = load_source(data.source, data_dir / "raw.zarr", data.chunk_rows)
    if data.test_source:
        test_raw = load_source(data.test_source, data_dir / "raw_test.zarr", data.chunk_rows)
        Xtr, ytr, Xte, yte = raw.X(), raw.labels(), test_raw.X(), test_raw.labels()
    else:
        idx_tr, idx_te = train_test_split(
            np.arange(raw.n_samples), test_size=data.test_size, stratify=raw.y(), random_state=data.split_seed
        )
        idx_tr.sort(), idx_te.sort()
        labels = raw.labels()
        Xtr, ytr, Xte, yte = raw.X()[idx_tr], labels[idx_tr], raw.X()[idx_te], labels[idx_te]
    Xtr_s, Xte_s = _transform(Xtr, Xtr, data), _transform(Xte, Xtr, data)
    fr = _feature_range(data, raw.n_features)
    return (
        write_dataset(train_path, Xtr_s, ytr, source=data.source, feature_range=fr, **kw),
        write_dataset(test_path, Xte_s, yte, source=data.source, feature_range=fr, **kw),
    )
