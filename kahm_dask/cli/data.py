"""``kahm-dask ingest``: a data source into a dataset store (and a test store)."""

from __future__ import annotations

from pathlib import Path

import click

from kahm_dask.cli.options import StoreArgument, storage_option
from kahm_dask.cli.session import fail, user_errors
from kahm_dask.privacy.bounds import warn_private_scaling

__all__ = ["ingest"]


@click.command()
@click.argument("source")
@click.argument("store", type=StoreArgument())
@click.option("--test-store", type=StoreArgument(),
              help="Also write a test store: a stratified split of SOURCE's rows (--test-size, --split-seed).")
@click.option("--test-size", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.3,
              show_default=True, help="Share of the rows in --test-store.")
@click.option("--split-seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the split (not private).")
@click.option("--bounds", type=float, nargs=2, metavar="LOW HIGH", default=None,
              help="Public range of the raw features, known without looking at the data (digits 0 16, pixels "
                   "0 255); entries are clipped to it, and the stores record it, so `train` needs no --bounds.")
@click.option("--scale", type=click.Choice(["none", "minmax", "tanh255"]), default="none", show_default=True,
              help="minmax maps --bounds to [0, 1] (without --bounds: the private min/max, which warns); tanh255 "
                   "is tanh(x/255) for 8-bit pixels; none keeps the raw values.")
@click.option("--chunk-rows", type=click.IntRange(min=1), help="Rows per Zarr chunk (default: about 32 MiB).")
@click.option("--dtype", type=click.Choice(["float64", "float32"]), default="float64", show_default=True)
@click.option("--overwrite", is_flag=True,
              help="Replace existing stores (atomically). Without it, existing stores that hold exactly the rows "
                   "this command writes are kept unchanged (a rerun), and any others are refused.")
@storage_option
def ingest(source: str, store, test_store, test_size, split_seed, bounds, scale, chunk_rows, dtype: str,
           overwrite: bool, storage_options) -> None:
    """Write SOURCE into a Zarr dataset STORE (a path or a URL such as s3://bucket/data.zarr), and
    with --test-store a test store of held-out rows. The stores hold private rows: they are
    created 0700 (owner only).

    SOURCE: sklearn:<digits|breast_cancer|iris|wine>, a .npz (arrays X, y), a .csv (label in
    the last column), "x.npy,y.npy" or "images.idx3-ubyte.gz,labels.idx1-ubyte.gz".
    """
    try:
        if not overwrite and _all_local_and_existing(store, test_store):
            # a rerun of the same command: keep the stores when they hold exactly these rows
            stores, unchanged = _reingest(source, store, test_store, test_size, split_seed, bounds, scale,
                                          chunk_rows, dtype)
        else:
            stores = _write(source, store, test_store, test_size, split_seed, bounds, scale, chunk_rows, dtype,
                            overwrite, storage_options)
            unchanged = False
    except user_errors() as exc:
        fail(exc)
    for path, ds in zip((store, test_store), stores, strict=True):
        if ds is not None:
            fr = ds.attrs.get("feature_range")
            public = "" if not fr else f"; public feature range recorded ({_range_text(fr)})"
            kept = "unchanged (it already holds these rows; its remembered releases are kept): " if unchanged else ""
            click.echo(f"{path}: {kept}{ds.n_samples} rows × {ds.n_features} features, classes {list(ds.classes)}"
                       f"{public}")


def _write(source: str, store, test_store, test_size, split_seed, bounds, scale, chunk_rows, dtype: str,
           overwrite: bool, storage_options) -> tuple:
    """Write the stores of ``kahm-dask ingest`` (its arguments) at ``store`` and ``test_store``
    (None: no test store); returns their :class:`~kahm_dask.pipeline.stores.dataset.DatasetStore`
    handles (the second None without a test store)."""
    from kahm_dask.pipeline.config import DataConfig
    from kahm_dask.pipeline.runs.data import write_data_stores
    from kahm_dask.pipeline.stores.dataset import ingest as ingest_store

    if bounds is None and scale == "none" and test_store is None:
        src = tuple(s.strip() for s in source.split(",")) if "," in source else source
        return (ingest_store(src, store, chunk_rows=chunk_rows, dtype=dtype, overwrite=overwrite,
                             storage_options=storage_options), None)
    if storage_options:
        raise click.UsageError("--bounds, --scale and --test-store write local stores; "
                               "drop --storage-options, or ingest without them.")
    data = DataConfig(source=source, test_size=test_size, split_seed=split_seed, scale=scale,
                      bounds=None if bounds is None else list(bounds), chunk_rows=chunk_rows)
    _refuse_existing(overwrite, store, test_store)
    if scale == "minmax" and bounds is None:
        warn_private_scaling(remedy="give --bounds LOW HIGH, the public range of the raw features "
                                    "(--scale minmax without --bounds)")
    return write_data_stores(data, Path(store), None if test_store is None else Path(test_store),
                             overwrite=overwrite, dtype=dtype)


def _all_local_and_existing(*paths) -> bool:
    """Whether every given (not None) target is a local path that exists."""
    given = [p for p in paths if p is not None]
    return all(isinstance(p, Path) and p.exists() for p in given)


def _reingest(source: str, store: Path, test_store: Path | None, *args) -> tuple[tuple, bool]:
    """``kahm-dask ingest`` again onto existing local stores, without --overwrite.

    The stores are written again into an owner-only hidden folder beside ``store``
    (``.<name>.reingest.tmp-<hex>``, deleted when this returns or fails) and compared with the
    existing ones: the same attributes (rows' fingerprint, classes, public range, scaling; not the
    creation time nor the remembered releases), labels and chunking. Identical: the existing
    stores are kept as they are (their remembered releases with them) and returned with True.
    Otherwise the command is refused, naming --overwrite. Memory: the labels (N,) of each store.
    """
    import shutil

    from kahm_dask.pipeline.stores.dataset import open_dataset
    from kahm_dask.storage.atomic import sibling_path
    from kahm_dask.storage.private import private_directory

    paths = [store] if test_store is None else [store, test_store]
    existing = []
    for path in paths:
        try:
            existing.append(open_dataset(path))
        except (ValueError, OSError) as exc:
            raise click.ClickException(f"{path} already exists and is not a dataset store ({exc}); add --overwrite "
                                       "to replace it, or choose another path.") from None
    aside = private_directory(sibling_path(store, "reingest.tmp"))
    try:
        fresh = _write(source, aside / "train.zarr", None if test_store is None else aside / "test.zarr", *args,
                       False, None)
        for path, old, new in zip(paths, existing, fresh, strict=False):
            if not _same_store(old, new):
                raise click.ClickException(
                    f"{path} already exists and holds other rows or settings than this command writes; "
                    "add --overwrite to replace it, or choose another path.")
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    return (existing[0], existing[1] if test_store is not None else None), True


def _same_store(old, new) -> bool:
    """Whether two dataset stores hold the same rows, in the same order and chunks, with the same
    labels and attributes (except when they were created and the releases they remember)."""
    import numpy as np

    def kept(ds) -> dict:
        return {k: v for k, v in ds.attrs.items() if k not in ("created", "releases")}

    return (kept(old) == kept(new) and old.chunk_rows == new.chunk_rows and old.X().dtype == new.X().dtype
            and np.array_equal(old.y(), new.y()))


def _range_text(fr: dict) -> str:
    lo, hi = fr["min"], fr["max"]
    if len(set(lo)) == 1 and len(set(hi)) == 1:
        return f"[{lo[0]:g}, {hi[0]:g}]"
    return f"per feature, {min(lo):g} to {max(hi):g}"


def _refuse_existing(overwrite: bool, *paths) -> None:
    """Refuse existing targets without --overwrite (before any row is read)."""
    for path in paths:
        if path is not None and not overwrite and Path(path).exists():
            raise click.ClickException(f"{path} already exists; add --overwrite to replace it, or choose another path.")
