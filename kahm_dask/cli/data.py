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
@click.option("--overwrite", is_flag=True, help="Replace existing stores (atomically).")
@storage_option
def ingest(source: str, store, test_store, test_size, split_seed, bounds, scale, chunk_rows, dtype: str,
           overwrite: bool, storage_options) -> None:
    """Write SOURCE into a Zarr dataset STORE (a path or a URL such as s3://bucket/data.zarr), and
    with --test-store a test store of held-out rows. The stores hold private rows: they are
    created 0700 (owner only).

    SOURCE: sklearn:<digits|breast_cancer|iris|wine>, a .npz (arrays X, y), a .csv (label in
    the last column), "x.npy,y.npy" or "images.idx3-ubyte.gz,labels.idx1-ubyte.gz".
    """
    from kahm_dask.pipeline.config import DataConfig
    from kahm_dask.pipeline.runs.data import write_data_stores
    from kahm_dask.pipeline.stores.dataset import ingest as ingest_store

    try:
        if bounds is None and scale == "none" and test_store is None:
            src = tuple(s.strip() for s in source.split(",")) if "," in source else source
            stores = (ingest_store(src, store, chunk_rows=chunk_rows, dtype=dtype, overwrite=overwrite,
                                   storage_options=storage_options), None)
        else:
            if storage_options:
                raise click.UsageError("--bounds, --scale and --test-store write local stores; "
                                       "drop --storage-options, or ingest without them.")
            data = DataConfig(source=source, test_size=test_size, split_seed=split_seed, scale=scale,
                              bounds=None if bounds is None else list(bounds), chunk_rows=chunk_rows)
            _refuse_existing(overwrite, store, test_store)
            if scale == "minmax" and bounds is None:
                warn_private_scaling(remedy="give --bounds LOW HIGH, the public range of the raw features "
                                            "(--scale minmax without --bounds)")
            stores = write_data_stores(data, Path(store), None if test_store is None else Path(test_store),
                                       overwrite=overwrite, dtype=dtype)
    except user_errors() as exc:
        fail(exc)
    for path, ds in zip((store, test_store), stores, strict=True):
        if ds is not None:
            fr = ds.attrs.get("feature_range")
            public = "" if not fr else f"; public feature range recorded ({_range_text(fr)})"
            click.echo(f"{path}: {ds.n_samples} rows × {ds.n_features} features, classes {list(ds.classes)}{public}")


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
