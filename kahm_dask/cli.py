"""The ``kahm-dask`` command (face layer): ingest, train, predict, evaluate, run.

Built with click (a well-kept CLI library: typed options, help text, testable with
``click.testing.CliRunner``). Every command that computes accepts ``--scheduler ADDR`` (a
running Dask cluster) or ``--cluster-config FILE`` (``cluster_configs/*.yaml``); the default
is a LocalCluster.
"""

from __future__ import annotations

import json
import logging
import sys
from numbers import Integral
from pathlib import Path

import click

from kahm_dask.params import PARAMS
from kahm_dask.privacy.fabrication import DEFAULT_PASSES

__all__ = ["main"]

log = logging.getLogger("kahm_dask")


def _cluster_options(f):
    f = click.option("--memory-limit", default="auto", show_default=True,
                     help="Per-worker memory limit of the LocalCluster, e.g. 2GiB.")(f)
    f = click.option("--n-workers", type=int, default=2, show_default=True, help="Workers of the LocalCluster.")(f)
    f = click.option("--cluster-config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="A cluster_configs/*.yaml file.")(f)
    f = _tls_options(f)
    f = click.option("--scheduler", help="Address of a running Dask scheduler, e.g. tcp://127.0.0.1:8786 "
                                         "(tls://host:port with --tls-ca-file, --tls-cert, --tls-key).")(f)
    return f


_TLS_META = "kahm_dask.tls"  # where the --tls-* options wait in the click context
_TLS_HELP = {
    "--tls-ca-file": "CA certificate (PEM) of a tls:// scheduler's cluster; with --tls-cert and --tls-key: "
                     "mutual TLS (without --scheduler: for the LocalCluster).",
    "--tls-cert": "This client's certificate (PEM), signed by that CA.",
    "--tls-key": "This client's private key (PEM); omit it if the --tls-cert file holds the key.",
}


def _remember_tls(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """Keep a given --tls-* option in the click context, for :func:`_tls_settings`."""
    if value is not None:
        ctx.meta.setdefault(_TLS_META, {})[param.opts[0]] = value
    return value


def _tls_options(f):
    """The options --tls-ca-file, --tls-cert, --tls-key (existing files). They are not passed to
    the command function: :func:`_tls_settings` reads them from the click context."""
    for name, text in reversed(_TLS_HELP.items()):
        f = click.option(name, type=click.Path(exists=True, dir_okay=False, path_type=Path),
                         expose_value=False, callback=_remember_tls, help=text)(f)
    return f


def _tls_settings() -> dict[str, str] | None:
    """The --tls-* options of the running command as the keys of a ``tls`` section
    (kahm_dask.pipeline.security), or None if none is given."""
    given = click.get_current_context().meta.get(_TLS_META, {})
    if not given:
        return None
    missing = [name for name in ("--tls-ca-file", "--tls-cert") if name not in given]
    if missing:
        raise click.UsageError(f"TLS needs {' and '.join(missing)} too (and --tls-key unless the "
                               "--tls-cert file holds the private key).")
    keys = {"--tls-ca-file": "ca_file", "--tls-cert": "cert", "--tls-key": "key"}
    return {keys[name]: str(path) for name, path in given.items()}


def _param_type(name: str) -> click.ParamType:
    """The click type of the model/privacy parameter ``name``: its choices or its range
    (kahm_dask/params.py). The rule tying r_value to r_source is checked by the config."""
    param = PARAMS[name]
    if param.choices:
        return click.Choice(param.choices)
    values = param.range
    return (click.IntRange if values.type is Integral else click.FloatRange)(
        min=values.left, max=values.right,
        min_open=values.closed in ("right", "neither"), max_open=values.closed in ("left", "neither"),
    )


class _StoreArgument(click.ParamType):
    """A store: a local path (→ :class:`~pathlib.Path`, checked to exist if ``exists``) or a URL
    fsspec reaches (→ the URL string, read with ``--storage-options``; existence is checked when
    the store is opened)."""

    name = "path|url"

    def __init__(self, exists: bool = False) -> None:
        self.exists = exists

    def convert(self, value, param, ctx):
        from kahm_dask.pipeline.location import as_location

        try:
            where = as_location(value)
        except (ValueError, ImportError) as exc:
            self.fail(str(exc), param, ctx)
        if not where.is_local:
            return where.url
        if self.exists and not where.path.exists():
            self.fail(f"{value!r} does not exist.", param, ctx)
        return where.path


def _parse_storage_options(ctx: click.Context, param: click.Parameter, value: str | None) -> dict | None:
    if value is None:
        return None
    try:
        options = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON ({exc.msg}); give an object such as "
                                 '\'{"client_kwargs": {"endpoint_url": "https://..."}}\'') from None
    if not isinstance(options, dict):
        raise click.BadParameter(f"must be a JSON object, got {type(options).__name__}.")
    return options


_storage_options = click.option(
    "--storage-options", callback=_parse_storage_options, metavar="JSON",
    help="fsspec options of the URL arguments (s3://, gs://, …), a JSON object, e.g. "
         '\'{"client_kwargs": {"endpoint_url": "https://s3.example.org"}}\'. Leave credentials to the '
         "environment (AWS_* variables, ~/.aws): a command line is visible to other users.",
)


def _work_beside(model):
    """The default work store of ``model`` (a path or URL): its name with the suffix ``.work``."""
    from kahm_dask.pipeline.location import as_location

    where = as_location(model)
    stem = where.name.rsplit(".", 1)[0] if "." in where.name else where.name
    return where.with_name(stem + ".work").public()


def _cluster_cfg(scheduler, cluster_config, n_workers, memory_limit):
    from kahm_dask.pipeline.config import ClusterConfig
    from kahm_dask.pipeline.security import ClusterTLSConfig

    if scheduler and cluster_config:
        raise click.UsageError("give at most one of --scheduler and --cluster-config.")
    tls = _tls_settings()
    if tls and cluster_config:
        raise click.UsageError(_TLS_WITH_CLUSTER_CONFIG)
    return ClusterConfig(scheduler=scheduler, config=cluster_config, n_workers=n_workers, memory_limit=memory_limit,
                         tls=None if tls is None else ClusterTLSConfig.from_mapping(tls))


_TLS_WITH_CLUSTER_CONFIG = ("the --tls-* options go with --scheduler (or the LocalCluster); a --cluster-config "
                            "file holds its own 'tls' settings.")


def _connect(cluster_cfg):
    from kahm_dask.pipeline.cluster import connect

    return connect(cluster_cfg)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors reported as a one-line message (exit code 1) instead of a traceback.

    ``OSError`` covers missing files, unreachable schedulers and full disks;
    ``KilledWorker`` a task whose worker processes died ``allowed-failures + 1`` times;
    ``BudgetExceededError`` a DP release refused by the privacy ledger's budget.
    """
    from distributed.scheduler import KilledWorker

    from kahm_dask.privacy.ledger import BudgetExceededError

    return (ValueError, TypeError, OSError, KilledWorker, BudgetExceededError)


_RESUME_HINT = (" Finished clusters are kept (each is written atomically): rerun the same command "
                "to resume.")


def _fail(exc: BaseException, *, resumable: bool = False) -> None:
    from distributed.scheduler import KilledWorker

    from kahm_dask.privacy.ledger import BudgetExceededError

    hint = ""
    if isinstance(exc, BudgetExceededError):
        resumable = False
        hint = " No noise was drawn."
    if isinstance(exc, KilledWorker):
        hint = (" Worker processes died while running this task (out of memory, or killed);"
                " give the workers more memory (--memory-limit) or fewer threads.")
    if resumable and not isinstance(exc, (ValueError, TypeError)):
        hint += _RESUME_HINT
    raise click.ClickException(f"{type(exc).__name__}: {exc}{hint}")


_VERBOSE_HELP = "Log progress details and Dask's INFO lines (scheduler, nannies, workers)."


def _configure_logging(verbose: bool) -> None:
    """Log warnings to the console; with ``verbose`` also INFO lines: kahm-dask's progress
    details and Dask's (its scheduler and nannies in this process, its local workers).

    Dask's level goes to its config ``logging.distributed``, which distributed applies to its
    loggers when it is imported (later, in a command) and local clusters started afterwards
    apply to their workers; a distributed imported already gets it directly.
    """
    import dask

    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    dask.config.set({"logging.distributed": logging.getLevelName(level).lower()})
    for name in ("kahm_dask", "distributed", "dask_ml"):
        logging.getLogger(name).setLevel(level)


@click.group()
@click.option("-v", "--verbose", is_flag=True, help=_VERBOSE_HELP)
@click.version_option(package_name="kahm-dask")
def main(verbose: bool) -> None:
    """Differentially private classification with Kernel Affine Hull Machines on Dask."""
    _configure_logging(verbose)


@main.command()
@click.argument("source")
@click.argument("store", type=_StoreArgument())
@click.option("--chunk-rows", type=int, help="Rows per Zarr chunk (default: about 32 MiB).")
@click.option("--dtype", type=click.Choice(["float64", "float32"]), default="float64", show_default=True)
@click.option("--overwrite", is_flag=True, help="Replace an existing store (atomically).")
@_storage_options
def ingest(source: str, store, chunk_rows, dtype: str, overwrite: bool, storage_options) -> None:
    """Write SOURCE into a Zarr dataset STORE (a path or a URL such as s3://bucket/data.zarr).

    SOURCE: sklearn:<digits|breast_cancer|iris|wine>, a .npz (arrays X, y), a .csv (label in
    the last column), "x.npy,y.npy" or "images.idx3-ubyte.gz,labels.idx1-ubyte.gz".
    """
    from kahm_dask.pipeline.store import ingest as ingest_store

    src = tuple(s.strip() for s in source.split(",")) if "," in source else source
    try:
        ds = ingest_store(src, store, chunk_rows=chunk_rows, dtype=dtype, overwrite=overwrite,
                          storage_options=storage_options)
    except _user_errors() as exc:
        _fail(exc)
    click.echo(f"{store}: {ds.n_samples} rows × {ds.n_features} features, classes {list(ds.classes)}")


@main.command()
@click.argument("store", type=_StoreArgument(exists=True))
@click.argument("model", type=_StoreArgument())
@click.option("--work", type=_StoreArgument(),
              help="Work directory (private side: keep it with the data). Default: MODEL with suffix .work")
@click.option("--n-components", type=_param_type("n_components"), default=20, show_default=True)
@click.option("--n-layers", type=_param_type("n_layers"), default=1, show_default=True)
@click.option("--block-size", type=_param_type("block_size"), default=1000, show_default=True)
@click.option("--epsilon", type=_param_type("epsilon"),
              help="Privacy-loss bound ε per entry; omit for a non-private model.")
@click.option("--delta", type=_param_type("delta"), default=0.0, show_default=True, help="δ; 0 is pure ε-DP.")
@click.option("--bounds", type=float, nargs=2, metavar="LOW HIGH", default=None,
              help="Public bounds of every feature of STORE, known without looking at the data; entries are "
                   "clipped to them before noise. Default: the store's public feature range, else each "
                   "feature's min/max (private: warns, and the privacy statement says so).")
@click.option("--d", "d", type=_param_type("d"), default=None,
              help="Adjacency bound (largest change of one entry covered). Default: the bound width.")
@click.option("--dp-data", type=_param_type("dp_data"), default="fabricated", show_default=True)
@click.option("--r-source", type=_param_type("r_source"), default="passes", show_default=True,
              help="Stopping rule of the fabrication; 'private' (the paper's r from the private rows) leaks.")
@click.option("--r-value", type=_param_type("r_value"),
              help=f"Number of passes (passes; default {DEFAULT_PASSES}) or per-row threshold (threshold).")
@click.option("--cluster-on", type=_param_type("cluster_on"), default="noisy", show_default=True,
              help="Rows the k-means partition runs on; 'original' (the private rows) leaks.")
@click.option("--budget", type=float, nargs=2, metavar="EPS DELTA", default=None,
              help="Privacy budget of STORE's ledger: refuse a release that would take the total beyond it.")
@click.option("--seed", type=_param_type("random_state"), default=None,
              help="Seed of the k-means steps (not secret: the noise never depends on it). "
                   "Default: drawn once and kept in the work directory.")
@_storage_options
@_cluster_options
def train(store, model, work, n_components, n_layers, block_size, epsilon, delta, bounds, d, dp_data,
          r_source, r_value, cluster_on, budget, seed, storage_options, scheduler, cluster_config, n_workers,
          memory_limit) -> None:
    """Train a model store MODEL from the dataset STORE: DP release, partition, one task per cluster.
    STORE, MODEL and --work may be paths or URLs (s3://…, with --storage-options).

    A DP run records its release in STORE's privacy ledger (STORE.privacy-ledger.json) and writes
    the privacy statement to MODEL.PRIVACY.md (also in MODEL's manifest).
    """
    from kahm_dask._validation import check_class_sizes
    from kahm_dask.pipeline.config import ModelConfig, PrivacyConfig
    from kahm_dask.pipeline.estimator import DaskKAHMClassifier
    from kahm_dask.pipeline.location import as_location
    from kahm_dask.pipeline.store import open_dataset

    try:
        if r_value is not None and r_value.is_integer():
            r_value = int(r_value)  # a whole number on the command line: also a number of passes
        # validate every argument before a cluster starts or a file is written
        ModelConfig(n_components=n_components, n_layers=n_layers, block_size=block_size)
        privacy = PrivacyConfig(epsilon=epsilon, delta=delta, d=d, dp_data=dp_data, r_source=r_source,
                                r_value=r_value, cluster_on=cluster_on, budget=None if budget is None else list(budget))
        ds = open_dataset(store, storage_options=storage_options)
        check_class_sizes(ds.class_counts)
        if bounds is not None:
            from kahm_dask.privacy.bounds import public_bounds

            bounds = public_bounds(bounds, ds.n_features)
        if n_components > ds.n_features:
            click.echo(f"Warning: --n-components {n_components} exceeds the {ds.n_features} "
                       f"features of {store}; every KAHM subspace is capped at {ds.n_features} "
                       "dimensions (docs/algorithm.md#kahm-guards).", err=True)
        estimator = DaskKAHMClassifier(
            n_components, n_layers, block_size, seed, epsilon=epsilon, delta=delta, bounds=bounds, d=d,
            dp_data=dp_data, r_source=r_source, r_value=privacy.r_value, cluster_on=cluster_on,
        )
        estimator.train_settings(budget=budget)  # every check, before a cluster starts
        with _connect(_cluster_cfg(scheduler, cluster_config, n_workers, memory_limit)) as client:
            summary = estimator.fit_store(ds, as_location(model, storage_options),
                                          as_location(work or _work_beside(model), storage_options),
                                          client=client, budget=budget)
    except _user_errors() as exc:
        _fail(exc, resumable=True)
    statement = summary.pop("privacy_statement_markdown", None)
    if statement is not None:
        from kahm_dask.report import ledger_markdown

        where = as_location(model, storage_options)
        path = where.with_name(where.name + ".PRIVACY.md")
        path.write_text(statement + "\n" + ledger_markdown(summary["privacy"]["ledger"]))
        click.echo(f"privacy statement: {path}", err=True)
    click.echo(json.dumps({k: v for k, v in summary.items() if k != "clusters"}, indent=2))


@main.command()
@click.argument("model", type=_StoreArgument(exists=True))
@click.argument("store", type=_StoreArgument(exists=True))
@click.argument("out", type=_StoreArgument())
@click.option("--n-probe", type=_param_type("n_probe"), default=None,
              help="Clusters per class each row meets (nearest centres); default: all.")
@click.option("--eval-dtype", type=_param_type("eval_dtype"), default="float64", show_default=True,
              help="Precision of the kernel blocks; float32 is faster, distances within ~1e-5 relative.")
@_storage_options
@_cluster_options
def predict(model, store, out, n_probe, eval_dtype, storage_options, scheduler, cluster_config, n_workers,
            memory_limit) -> None:
    """Predict the rows of dataset STORE with MODEL; write distances and labels to OUT (Zarr).
    Each may be a path or a URL (s3://…, with --storage-options)."""
    from kahm_dask.pipeline.modelstore import read_manifest
    from kahm_dask.pipeline.predict import predict_to_store
    from kahm_dask.pipeline.store import open_dataset

    try:
        ds = open_dataset(store, storage_options=storage_options)
        n_features = read_manifest(model, storage_options=storage_options)["n_features"]  # both before a cluster
        if ds.n_features != n_features:
            raise ValueError(f"{store} has {ds.n_features} features; the model {model} expects "
                             f"{n_features}. Predict rows with the features it was trained on.")
        with _connect(_cluster_cfg(scheduler, cluster_config, n_workers, memory_limit)) as client:
            predict_to_store(model, ds.X(), out, client, progress=True, n_probe=n_probe, eval_dtype=eval_dtype,
                             storage_options=storage_options)
    except _user_errors() as exc:
        _fail(exc)
    click.echo(f"predictions for {ds.n_samples} rows written to {out}")


@main.command()
@click.argument("model", type=click.Path(exists=True, path_type=Path))
@click.argument("predictions", type=click.Path(exists=True, path_type=Path))
@click.argument("train_store", type=click.Path(exists=True, path_type=Path))
@click.argument("test_store", type=click.Path(exists=True, path_type=Path))
@click.option("--membership/--no-membership", default=True, show_default=True)
@click.option("--max-train-rows", type=int, help="Seeded subset of training rows for the membership metrics.")
@click.option("--seed", type=int, default=0, show_default=True)
@_cluster_options
def evaluate(model, predictions, train_store, test_store, membership, max_train_rows, seed,
             scheduler, cluster_config, n_workers, memory_limit) -> None:
    """Accuracy and membership-inference metrics of stored PREDICTIONS (JSON to stdout)."""
    from kahm_dask.pipeline.run import evaluate as evaluate_run
    from kahm_dask.pipeline.store import open_dataset

    try:
        with _connect(_cluster_cfg(scheduler, cluster_config, n_workers, memory_limit)):
            metrics, _, _ = evaluate_run(
                model, predictions, open_dataset(train_store), open_dataset(test_store),
                membership=membership, max_train_rows=max_train_rows, seed=seed,
            )
    except _user_errors() as exc:
        _fail(exc)
    click.echo(json.dumps(metrics, indent=2))


@main.command()
@click.argument("pipeline", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--scheduler", help="Address of a running Dask scheduler (overrides the file's cluster.scheduler, "
                                   "cluster.config and cluster.tls; tls://host:port with the --tls-* options).")
@_tls_options
@click.option("--cluster-config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A cluster_configs/*.yaml file (overrides the file).")
@click.option("--output", type=click.Path(path_type=Path), help="Run directory (overrides the file).")
@click.option("--budget", type=float, nargs=2, metavar="EPS DELTA", default=None,
              help="Privacy budget of the training data's ledger (overrides privacy.budget).")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@click.option("-v", "--verbose", is_flag=True, help=_VERBOSE_HELP)
def run(pipeline: Path, scheduler, cluster_config, output, budget, no_progress: bool, verbose: bool) -> None:
    """Run PIPELINE.yaml end to end: ingest → partition → train → predict → evaluate.

    A file with a top-level `federation:` section runs the federated pipeline (one model per
    site, global decision from the sites' minimum distances). A DP run writes what may be
    published to <output>/public/ (model.zarr, PRIVACY.md, a plot of fabricated rows) and
    everything computed on private rows to <output>/owner/ (report.json, report.md, plots,
    predictions, data and work stores), which stays with the data owner.
    """
    if verbose:  # raise the group's level (`kahm-dask -v run` raised it already)
        _configure_logging(True)
    from kahm_dask.pipeline.config import load_config, load_yaml
    from kahm_dask.pipeline.federated import (
        connect_federated,
        load_federated_config,
        run_federated_pipeline,
    )
    from kahm_dask.pipeline.run import run_pipeline

    if scheduler and cluster_config:
        raise click.UsageError("give at most one of --scheduler and --cluster-config.")
    tls = _tls_settings()
    if tls and cluster_config:
        raise click.UsageError(_TLS_WITH_CLUSTER_CONFIG)
    try:
        raw = load_yaml(pipeline)
        federated = isinstance(raw, dict) and "federation" in raw
        cfg = load_federated_config(pipeline) if federated else load_config(pipeline)
        overrides = {}
        if scheduler or tls:  # --scheduler alone also drops the file's cluster.tls
            overrides["cluster.tls"] = tls
        if scheduler:
            overrides.update({"cluster.scheduler": scheduler, "cluster.config": None})
        if cluster_config:
            overrides.update({"cluster.config": str(cluster_config), "cluster.scheduler": None, "cluster.tls": None})
        if output:
            overrides["output"] = str(output)
        if budget:
            overrides["privacy.budget"] = list(budget)
        if overrides:
            cfg = cfg.with_overrides(**overrides)
        with (connect_federated(cfg) if federated else _connect(cfg.cluster)) as client:
            click.echo(f"Dask dashboard: {client.dashboard_link}", err=True)
            run_fn = run_federated_pipeline if federated else run_pipeline
            run_fn(cfg, client, progress=not no_progress)
    except _user_errors() as exc:
        _fail(exc, resumable=True)
    _echo_run_end(Path(cfg.output))


def _echo_run_end(out: Path) -> None:
    """Print the report, then where the public and the owner's folders are."""
    from kahm_dask.pipeline.data import OWNER, PUBLIC

    owner, public = out / OWNER, out / PUBLIC
    report = owner / "report.md" if (owner / "report.md").exists() else out / "report.md"
    click.echo(report.read_text())
    if public.is_dir():
        click.echo(f"Public folder (may be published: DP model store, PRIVACY.md): {public}")
    if owner.is_dir():
        click.echo(f"Owner folder (keep with the data owner: data, work, report, predictions): {owner}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
