"""``kahm-dask release``: a DP data set to take away, from a dataset store."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from kahm_dask.cli import session
from kahm_dask.cli.options import (
    StoreArgument,
    check_as_options,
    cluster_options,
    estimator_params,
    options_of,
)
from kahm_dask.cli.session import cluster_cfg, echo_dashboard, fail, interruptible, user_errors

__all__ = ["release", "RELEASE_PARAMS"]

#: The parameters ``kahm-dask release`` takes as options: the release's and the fabrication's
#: (with its partition). The other estimator parameters keep their defaults.
RELEASE_PARAMS = (
    "epsilon", "record_epsilon", "record_delta", "delta", "d", "bounds", "dp_data", "r_source", "r_value",
    "cluster_on", "max_passes",
    "n_components", "block_size", "s_rule", "min_range", "n_init", "kmeans_dims", "random_state", "ledger", "budget",
)


@click.command()
@click.argument("store", type=StoreArgument(exists=True))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["parquet", "csv", "zarr"]), default="parquet", show_default=True,
              help="parquet: a folder of part files (one per task) that pandas reads as one table; csv: one file "
                   "(small data); zarr: a dataset store (larger than memory; `kahm-dask train` reads it).")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write a quality report (HTML, owner only: it compares the release with the private rows "
                   "and the --test-store).")
@click.option("--test-store", type=StoreArgument(exists=True), help="Held-out rows of --report.")
@options_of(*RELEASE_PARAMS)
@cluster_options
def release(store, out, fmt, report, test_store, scheduler, cluster_config, n_workers, memory_limit,
            dashboard_address, **options) -> None:
    """One DP release of the rows of dataset STORE, written with their labels to OUT in the data
    owner's raw units (the scaling undone), beside OUT.PRIVACY.md, its statement.

    The release is recorded in the privacy ledger of STORE's rows (the one `train` uses) before
    any noise is drawn. OUT and its statement may be published; anything computed from them
    (tuning, any model) spends nothing more. A release is never overwritten: OUT must not exist,
    unless it holds the release this same command made of these rows (a rerun: it is kept, and
    nothing is released or spent).
    """
    from kahm_dask.pipeline.estimator import DaskKAHMClassifier
    from kahm_dask.pipeline.release import check_release_target, earlier_release, release_store
    from kahm_dask.pipeline.stores.dataset import open_dataset
    from kahm_dask.privacy.bounds import public_bounds

    t0 = time.perf_counter()
    if options["epsilon"] is None and options["record_epsilon"] is None:
        raise click.UsageError("Missing option '--epsilon' (the ε per entry of the release) or '--record-epsilon' "
                               "(the ε per record, solved to an ε per entry).")
    if report is not None and test_store is None:
        raise click.UsageError("--report needs --test-store (the held-out rows it measures on).")
    try:
        with interruptible("release"):
            params = estimator_params(options)
            ds = open_dataset(store)
            if params["bounds"] is not None:
                params["bounds"] = public_bounds(params["bounds"], ds.n_features)
            estimator = DaskKAHMClassifier(**params)
            check_as_options(estimator, params["budget"])
            settings = estimator.train_settings(budget=params["budget"]).for_features(ds.n_features)
            earlier = earlier_release(ds, out, settings) if isinstance(out, Path) else None
            if earlier is not None:
                _say_released_before(out, earlier, report)
                return
            check_release_target(out, fmt)
            with session.connect(cluster_cfg(scheduler, cluster_config, n_workers, memory_limit,
                                             dashboard_address)) as client:
                echo_dashboard(client)
                summary = release_store(ds, out, settings, fmt=fmt)
                if report is not None:
                    _write_report(report, ds, open_dataset(test_store), out, fmt, summary)
    except user_errors() as exc:
        fail(exc)
    click.echo(f"DP release (publishable): {out}; its statement: {summary['statement']}", err=True)
    shown = ("release", "statement", "release_id", "dp_data", "format", "n_rows", "n_features", "ledger_path")
    click.echo(json.dumps({k: summary[k] for k in shown}, indent=2))
    click.echo(f"done in {time.perf_counter() - t0:.1f} s", err=True)


def _say_released_before(out: Path, earlier: dict, report: Path | None) -> None:
    """A rerun: ``out`` already holds this release of these rows (``earlier``, as the store
    remembers it). Nothing is released, spent or written; say so, and print its summary."""
    click.echo(f"{out} already holds DP release {earlier['release_id']} of these rows (ε = {earlier['epsilon']:g}, "
               f"δ = {earlier['delta']:g}, {earlier['time']}), made by this command: nothing new is released or "
               "spent. A new release needs another OUT (and is charged again).", err=True)
    if report is not None and not report.exists():
        click.echo(f"--report: {report} is not written (it is made with a new release only).", err=True)
    click.echo(json.dumps({"release": str(out), "statement": str(out) + ".PRIVACY.md",
                           "release_id": earlier["release_id"], "ledger_path": earlier.get("ledger"),
                           "released_before": earlier["time"]}, indent=2))


def _write_report(path: Path, ds, test, out: Path, fmt: str, summary: dict) -> None:
    """The quality report of the release at ``out``, computed here, on the owner's side: the
    private rows of ``ds`` and ``test`` (in raw units, as the release) and the released rows."""
    import numpy as np

    from kahm_dask.dp_dataset import LABEL_COLUMN
    from kahm_dask.pipeline.release import read_release, to_raw_units
    from kahm_dask.privacy.statement import PrivacyStatement
    from kahm_dask.report import write_quality_report
    from kahm_dask.report.pictures import image_shape_of

    released = read_release(out, fmt)
    dp_y = released.pop(LABEL_COLUMN).to_numpy()
    to_raw = to_raw_units(summary)
    statement = PrivacyStatement(**{k: v for k, v in summary["privacy_statement"].items() if k != "holds"})
    write_quality_report(path, real_X=to_raw(np.asarray(ds.X())), real_y=ds.labels(), dp_X=released.to_numpy(),
                         dp_y=dp_y, test_X=to_raw(np.asarray(test.X())), test_y=test.labels(), statement=statement,
                         bounds=tuple(summary["raw_bounds"]), feature_names=list(released.columns),
                         image_shape=image_shape_of(released.shape[1]))
