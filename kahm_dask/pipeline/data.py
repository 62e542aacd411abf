"""Prepare a run's train and test stores from a source (ARCHITECTURE.md, ingest stage).

Sources: ``sklearn:<name>`` (bundled, offline), ``synthetic:blobs`` (generated lazily, block by
block, so it can exceed memory), a data file or file pair (ingested with
:func:`~kahm_dask.pipeline.store.ingest`), or an existing dataset store (``*.zarr``).
Without a separate test source the rows are split with a stratified seeded split (§11); the
scaling (``minmax`` by the training split's min/max, or ``tanh255``) is applied lazily.
"""

from __future__ import annotations

from pathlib import Path

import dask.array as da
import numpy as np
from sklearn.model_selection import train_test_split

from kahm_dask._random import child_seed_sequence
from kahm_dask.datasets import load_bundled, split_and_scale
from kahm_dask.pipeline.store import DatasetStore, ingest, open_dataset, write_dataset

__all__ = ["prepare_stores", "synthetic_blobs", "load_source"]


def synthetic_blobs(
    n_samples: int, n_features: int, n_classes: int, *, seed: int, chunk_rows: int = 20_000,
    dtype: str = "float64", separation: float = 6.0, modes_per_class: int = 16,
) -> tuple[da.Array, np.ndarray]:
    """Lazy class data squashed to [0, 1]: X (N, p) dask array, y (N,) int64.

    Each class is a mixture of ``modes_per_class`` unit-variance Gaussian modes around a class
    centre (class centres ``separation`` apart in RMS, modes half as far from their centre), so
    the per-class k-means partition has structure to find. Row block b is generated from
    ``child(SeedSequence(seed), 1, b)``: the data never exist whole in memory, and any block
    can be regenerated alone.
    """
    root = np.random.SeedSequence(seed)
    rng = np.random.default_rng(child_seed_sequence(root, 0))
    scale = separation / np.sqrt(2.0 * n_features)
    centres = rng.standard_normal((n_classes, 1, n_features)) * scale
    centres = centres + rng.standard_normal((n_classes, modes_per_class, n_features)) * (scale / 2)
    y = rng.integers(0, n_classes, size=n_samples).astype(np.int64)
    mode = rng.integers(0, modes_per_class, size=n_samples)
    chunks = tuple(min(chunk_rows, n_samples - a) for a in range(0, n_samples, chunk_rows))

    def block(block_info=None) -> np.ndarray:
        (start, stop), _ = block_info[None]["array-location"]
        g = np.random.default_rng(child_seed_sequence(root, 1, block_info[None]["chunk-location"][0]))
        x = centres[y[start:stop], mode[start:stop]] + g.standard_normal((stop - start, n_features))
        return (1.0 / (1.0 + np.exp(-x / 4.0))).astype(dtype)

    X = da.map_blocks(block, chunks=(chunks, (n_features,)), dtype=np.dtype(dtype), meta=np.empty((0, 0), dtype))
    return X, y


def load_source(source: str, raw_path: Path, chunk_rows: int | None) -> DatasetStore:
    """Open or ingest a file source into a dataset store at ``raw_path``."""
    if source.endswith(".zarr") or source.endswith(".zarr/"):
        return open_dataset(source)
    if "," in source:
        source = tuple(s.strip() for s in source.split(","))
    if raw_path.exists():
        return open_dataset(raw_path)
    return ingest(source, raw_path, chunk_rows=chunk_rows)


def _scale(X: da.Array, X_train: da.Array, scale: str) -> da.Array:
    if scale == "none":
        return X
    if scale == "tanh255":
        return da.tanh(X / 255.0)
    low, high = da.compute(X_train.min(axis=0), X_train.max(axis=0))
    width = np.where(high > low, high - low, 1.0)
    return (X - low) / width


def prepare_stores(cfg, out: Path) -> tuple[DatasetStore, DatasetStore]:
    """Write ``out/data/train.zarr`` and ``out/data/test.zarr`` for a pipeline config.

    Reuses both stores if they already exist (a rerun resumes).
    """
    data = cfg.data
    train_path, test_path = out / "data" / "train.zarr", out / "data" / "test.zarr"
    if train_path.exists() and test_path.exists():
        return open_dataset(train_path), open_dataset(test_path)
    train_path.parent.mkdir(parents=True, exist_ok=True)
    kw = {"chunk_rows": data.chunk_rows, "overwrite": True}
    if data.source.startswith("sklearn:"):
        X, y = load_bundled(data.source.split(":", 1)[1])
        if data.scale == "tanh255":
            X = np.tanh(X / 255.0)
        sp = split_and_scale(X, y, test_size=data.test_size, split_seed=data.split_seed, scale=data.scale == "minmax")
        return (
            write_dataset(train_path, sp.X_train, sp.y_train, source=data.source, **kw),
            write_dataset(test_path, sp.X_test, sp.y_test, source=data.source, **kw),
        )
    if data.source == "synthetic:blobs":
        syn = data.synthetic
        X, y = synthetic_blobs(
            syn.n_samples, syn.n_features, syn.n_classes, seed=data.split_seed, dtype=syn.dtype,
            chunk_rows=data.chunk_rows or 20_000,
        )
        n_train = syn.n_samples - int(round(syn.n_samples * data.test_size))  # labels are i.i.d.
        Xtr, ytr, Xte, yte = X[:n_train], y[:n_train], X[n_train:], y[n_train:]
        return (
            write_dataset(train_path, Xtr, ytr, source=data.source, dtype=syn.dtype, **kw),
            write_dataset(test_path, Xte, yte, source=data.source, dtype=syn.dtype, **kw),
        )
    raw = load_source(data.source, out / "data" / "raw.zarr", data.chunk_rows)
    if data.test_source:
        test_raw = load_source(data.test_source, out / "data" / "raw_test.zarr", data.chunk_rows)
        Xtr, ytr, Xte, yte = raw.X(), raw.labels(), test_raw.X(), test_raw.labels()
    else:
        idx_tr, idx_te = train_test_split(
            np.arange(raw.n_samples), test_size=data.test_size, stratify=raw.y(), random_state=data.split_seed
        )
        idx_tr.sort(), idx_te.sort()
        labels = raw.labels()
        Xtr, ytr, Xte, yte = raw.X()[idx_tr], labels[idx_tr], raw.X()[idx_te], labels[idx_te]
    Xtr_s, Xte_s = _scale(Xtr, Xtr, data.scale), _scale(Xte, Xtr, data.scale)
    return (
        write_dataset(train_path, Xtr_s, ytr, source=data.source, **kw),
        write_dataset(test_path, Xte_s, yte, source=data.source, **kw),
    )
