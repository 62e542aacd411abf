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
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from numbers import Integral
from pathlib import Path

import click

from kahm_dask.params import PARAMS
from kahm_dask.pipeline.config import DASHBOARD
from kahm_dask.privacy.ledger import LEDGER_DIR_ENV as LEDGER_ENV

__all__ = ["main"]

log = logging.getLogger("kahm_dask")


def _dashboard_option(f):
    return click.option(
        "--dashboard-address", default=DASHBOARD, show_default=True, metavar="HOST:PORT",
        help="Dashboard of the LocalCluster. It has no authentication, so it listens on this machine only; "
             "another host (e.g. 0.0.0.0:8787) warns. 'none' turns it off.",
        callback=lambda ctx, param, value: None if value in (None, "none") else value,
    )(f)


def _cluster_options(f):
    f = _dashboard_option(f)
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
    (kahm_dask.pipeline.cluster.security), or None if none is given."""
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
    if values.text is not None:  # a floor said in words (ε): click checks > 0, the parameter rule the rest
        return click.FloatRange(min=0, min_open=True)
    return (click.IntRange if values.type is Integral else click.FloatRange)(
        min=values.left, max=values.right,
        min_open=values.closed in ("right", "neither"), max_open=values.closed in ("left", "neither"),
    )


#: Options of ``kahm-dask train`` that are not named after their parameter, or take another form
#: (the other parameters of the Dask estimator are options ``--<name>``, generated from the table).
_SPECIAL_OPTIONS = {
    "random_state": click.option(
        "--seed", "random_state", type=_param_type("random_state"), default=None,
        help="Seed of the k-means steps (not secret: the noise never depends on it). Default: drawn once and "
             "kept in the work store."),
    "bounds": click.option(
        "--bounds", type=float, nargs=2, metavar="LOW HIGH", default=None,
        help="Public bounds of every feature of STORE (in STORE's units), known without looking at the data; "
             "entries are clipped to them before noise. Default: the public feature range STORE records "
             "(`kahm-dask ingest --bounds`), else each feature's min/max (private: warns, and the privacy "
             "statement says so)."),
    "budget": click.option(
        "--budget", type=float, nargs=2, metavar="EPS DELTA", default=None,
        help="Cap of STORE's privacy ledger: lowers its budget (never raises it); a release beyond it is "
             "refused before any noise is drawn."),
    "ledger": click.option(
        "--ledger-dir", "ledger", type=click.Path(file_okay=False, path_type=Path), default=None,
        help=f"Ledger directory (default: ${LEDGER_ENV}, else ~/.local/share/kahm-dask/ledgers)."),
}
#: Parameters ``kahm-dask train`` does not take: this process's threads, and the test-only seed.
_NOT_OPTIONS = ("n_jobs", "insecure_noise_seed")


def _parameter_options(f):
    """Every model, privacy and partition parameter of the Dask estimator as an option of
    ``f`` (``--n-components`` …), from the parameter table (type, default, meaning)."""
    from kahm_dask.params import CLASSIFIER_PARAMS, PARTITION_PARAMS

    for name in reversed((*CLASSIFIER_PARAMS, *PARTITION_PARAMS)):
        if name in _NOT_OPTIONS:
            continue
        if name in _SPECIAL_OPTIONS:
            f = _SPECIAL_OPTIONS[name](f)
            continue
        param = PARAMS[name]
        f = click.option(f"--{name.replace('_', '-')}", name, type=_param_type(name), default=param.default,
                         show_default=param.default is not None, help=param.meaning + ".")(f)
    return f


def _check_as_options(estimator, budget) -> None:
    """The estimator's parameter checks, their errors naming the command-line flag."""
    import re

    from sklearn.utils._param_validation import InvalidParameterError

    try:
        estimator.train_settings(budget=budget)
    except InvalidParameterError as exc:
        match = re.match(r"The '(\w+)' parameter of \w+ (.*)", str(exc), flags=re.S)
        if match is None:
            raise
        name, rest = match.groups()
        rest = rest.removeprefix("is invalid: ")
        flag = {"random_state": "seed", "ledger": "ledger-dir"}.get(name, name).replace("_", "-")
        raise click.UsageError(f"Invalid value for '--{flag}': {rest}") from None
    except ValueError as exc:
        if str(exc).startswith("budget "):
            raise click.UsageError(f"Invalid value for '--budget': {str(exc)[len('budget '):]}") from None
        raise


def _estimator_params(options: dict) -> dict:
    """The estimator's parameters from the options of :func:`_parameter_options`."""
    params = dict(options)
    if params["r_value"] is not None and float(params["r_value"]).is_integer():
        params["r_value"] = int(params["r_value"])  # a whole number on the command line: also a number of passes
    params["ledger"] = "auto" if params["ledger"] is None else str(params["ledger"])
    return params


class _StoreArgument(click.ParamType):
    """A store: a local path (→ :class:`~pathlib.Path`, checked to exist if ``exists``) or a URL
    fsspec reaches (→ the URL string, read with ``--storage-options``; existence is checked when
    the store is opened)."""

    name = "path|url"

    def __init__(self, exists: bool = False) -> None:
        self.exists = exists

    def convert(self, value, param, ctx):
        from kahm_dask.storage.location import as_location

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


def _cluster_cfg(scheduler, cluster_config, n_workers, memory_limit, dashboard_address=DASHBOARD):
    from kahm_dask.pipeline.config import ClusterConfig
    from kahm_dask.pipeline.config.sections import ClusterTLSConfig

    if scheduler and cluster_config:
        raise click.UsageError("give at most one of --scheduler and --cluster-config.")
    tls = _tls_settings()
    if tls and cluster_config:
        raise click.UsageError(_TLS_WITH_CLUSTER_CONFIG)
    return ClusterConfig(scheduler=scheduler, config=cluster_config, n_workers=n_workers, memory_limit=memory_limit,
                         tls=None if tls is None else ClusterTLSConfig.from_mapping(tls),
                         dashboard_address=dashboard_address)


def _echo_dashboard(client) -> None:
    """The dashboard's address on the console (where it listens, in words)."""
    link = getattr(client, "dashboard_link", None)
    if not link:
        return
    from kahm_dask.pipeline.config import dashboard_is_local

    host = link.split("//", 1)[-1].split("/", 1)[0]
    where = " (this machine only)" if dashboard_is_local(host) else ""
    click.echo(f"Dask dashboard{where}: {link}", err=True)


_TLS_WITH_CLUSTER_CONFIG = ("the --tls-* options go with --scheduler (or the LocalCluster); a --cluster-config "
                            "file holds its own 'tls' settings.")


def _connect(cluster_cfg):
    from kahm_dask.pipeline.cluster import connect

    return connect(cluster_cfg)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors reported as a one-line message (exit code 1) instead of a traceback.

    ``OSError`` covers missing files, unreachable schedulers and full disks;
    ``KilledWorker`` a task whose worker processes died ``allowed-failures + 1`` times;
    ``BudgetExceededError`` a DP release refused by the privacy ledger's budget; the others a
    busy folder, an unusable ledger file and a failed task's own error.
    """
    from distributed.scheduler import KilledWorker

    from kahm_dask.privacy.ledger import BudgetExceededError, LedgerError
    from kahm_dask.storage.locks import FolderBusyError

    return (ValueError, TypeError, OSError, KilledWorker, BudgetExceededError, LedgerError, FolderBusyError)


def _fail(exc: BaseException, *, resume_from=None) -> None:
    """Exit with ``exc`` as one line. ``resume_from``: the staged model store of a training run:
    the resume hint is added only when it holds finished clusters (then it is true)."""
    from distributed.scheduler import KilledWorker

    from kahm_dask.pipeline.stores.dataset import StoreExistsError
    from kahm_dask.privacy.ledger import BudgetExceededError

    hint = ""
    if isinstance(exc, BudgetExceededError):
        hint = " No noise was drawn."
    if isinstance(exc, StoreExistsError):
        raise click.ClickException(f"{str(exc).split(';')[0]}; add --overwrite to replace it, or choose another path.")
    if isinstance(exc, KilledWorker):
        hint = (" Worker processes died while running this task (out of memory, or killed);"
                " give the workers more memory (--memory-limit) or fewer threads.")
    n = _finished_clusters(resume_from)
    if n:
        hint += f" The {n} finished cluster(s) are kept ({resume_from}): rerun the same command to resume."
    raise click.ClickException(f"{type(exc).__name__}: {exc}{hint}")


def _finished_clusters(staged) -> int:
    """Finished clusters in the staged model store ``staged`` (a path/URL, or None: 0)."""
    if staged is None:
        return 0
    from kahm_dask.storage.location import as_location

    try:
        return sum(1 for name in (as_location(staged) / "clusters").children() if not name.startswith("."))
    except (OSError, ValueError):
        return 0


@contextmanager
def _interruptible(what: str, resume_from=None) -> Iterator[None]:
    """Ctrl-C in the block: one line (and the resume hint where it is true), exit code 130."""
    try:
        yield
    except KeyboardInterrupt:
        n = _finished_clusters(resume_from)
        kept = f" {n} finished cluster(s) are kept in {resume_from}: rerun the same command to resume." if n else ""
        click.echo(f"\nInterrupted: {what} stopped.{kept}", err=True)
        sys.exit(130)


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
    warnings.formatwarning = _one_line_warning
    dask.config.set({"logging.distributed": logging.getLevelName(level).lower()})
    for name in ("kahm_dask", "distributed", "dask_ml"):
        logging.getLogger(name).setLevel(level)


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning on the console: its kind and its message, without the library's source line."""
    return f"{category.__name__}: {message}\n"


@click.group()
@click.option("-v", "--verbose", is_flag=True, help=_VERBOSE_HELP)
@click.version_option(package_name="kahm-dask")
def main(verbose: bool) -> None:
    """Differentially private classification with Kernel Affine Hull Machines on Dask."""
    _configure_logging(verbose)


@main.command()
@click.argument("source")
@click.argument("store", type=_StoreArgument())
@click.option("--test-store", type=_StoreArgument(),
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
@_storage_options
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
            stores = write_data_stores(data, Path(store), None if test_store is None else Path(test_store),
                                       overwrite=overwrite, dtype=dtype)
    except _user_errors() as exc:
        _fail(exc)
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


@main.command()
@click.argument("store", type=_StoreArgument(exists=True))
@click.argument("model", type=_StoreArgument())
@click.option("--work", type=_StoreArgument(),
              help="Work store (private copies, the noisy rows, the model while it is trained; owner only). "
                   "Default: beside STORE, STORE's name with .kahm-work/, one folder per MODEL.")
@_parameter_options
@_storage_options
@_cluster_options
def train(store, model, work, storage_options, scheduler, cluster_config, n_workers, memory_limit,
          dashboard_address, **options) -> None:
    """Train a model store MODEL from the dataset STORE: DP release, partition, one task per cluster.
    STORE, MODEL and --work may be paths or URLs (s3://…, with --storage-options).

    A DP run records its release in the privacy ledger of STORE's rows (the same one every
    kahm-dask entry point uses for them) before any noise is drawn, and writes its privacy
    statement to MODEL.PRIVACY.md (also in MODEL's manifest). MODEL is written when every
    cluster is trained (an interrupted run leaves none; rerun to resume). A non-private MODEL
    holds private rows: it is created 0700 (owner only).
    """
    from kahm_dask._validation import check_class_sizes
    from kahm_dask.pipeline.cluster.progress import ConsoleProgress
    from kahm_dask.pipeline.estimator import DaskKAHMClassifier
    from kahm_dask.pipeline.stores.dataset import open_dataset
    from kahm_dask.pipeline.training import STAGED_MODEL, check_training_targets
    from kahm_dask.storage.location import as_location
    from kahm_dask.storage.private import private_directory

    t0 = time.perf_counter()
    if work is None:
        work = _default_work(store, model)
        if as_location(work).is_local:
            private_directory(Path(work).parent)  # the data's work stores: owner only
    staged = as_location(work, storage_options) / STAGED_MODEL
    try:
        with _interruptible("training", resume_from=staged):
            params = _estimator_params(options)
            ds = open_dataset(store, storage_options=storage_options)
            check_class_sizes(ds.class_counts)
            if params["bounds"] is not None:
                from kahm_dask.privacy.bounds import public_bounds

                params["bounds"] = public_bounds(params["bounds"], ds.n_features)
            estimator = DaskKAHMClassifier(**params)
            budget = params["budget"]
            _check_as_options(estimator, budget)
            if params["n_components"] > ds.n_features:
                click.echo(f"Warning: --n-components {params['n_components']} exceeds the {ds.n_features} "
                           f"features of {store}; every KAHM subspace is capped at {ds.n_features} "
                           "dimensions (docs/algorithm.md#kahm-guards).", err=True)
            model_at, work_at = as_location(model, storage_options), as_location(work, storage_options)
            check_training_targets(model_at, work_at)
            statement_at = model_at.with_name(model_at.name + ".PRIVACY.md")
            if params["epsilon"] is not None and statement_at.is_local and statement_at.path.is_dir():
                raise FileExistsError(f"{statement_at} is a folder; the privacy statement cannot be written there.")
            progress = ConsoleProgress()
            with _connect(_cluster_cfg(scheduler, cluster_config, n_workers, memory_limit,
                                       dashboard_address)) as client:
                _echo_dashboard(client)
                summary = estimator.fit_store(ds, model_at, work_at, client=client, budget=budget, progress=progress)
    except _user_errors() as exc:
        _fail(exc, resume_from=staged)
    statement = summary.get("privacy_statement_markdown")
    if statement is not None:
        from kahm_dask.pipeline.runs.report import ledger_markdown

        statement_at.write_text(statement + "\n" + ledger_markdown(summary["privacy"]["ledger"]))
        click.echo(f"privacy statement (publishable, with MODEL): {statement_at}", err=True)
    else:
        click.echo(f"Non-private model: {model} holds private rows (folders 0700); keep it with the data owner.",
                   err=True)
    click.echo(f"work store (owner only): {work}", err=True)
    privacy = summary.get("privacy") or {}
    click.echo(json.dumps({
        "model": str(model), **{k: summary.get(k) for k in ("n_clusters", "n_resumed", "seed")},
        **{k: privacy.get(k) for k in ("release_id", "noise_reused", "ledger", "ledger_path")},
        **{k: summary.get(k) for k in ("prepare_seconds", "train_seconds")},
    }, indent=2))
    click.echo(f"done in {time.perf_counter() - t0:.1f} s", err=True)


def _default_work(store, model) -> str | Path:
    """The default work store of training ``model`` from ``store``: beside the data store (the
    owner's side, never beside the publishable model), ``<store stem>.kahm-work/<model name>-<hash>``
    (the hash of the model's full path keeps two models of the same name apart)."""
    import hashlib

    from kahm_dask.storage.location import as_location

    data, target = as_location(store), as_location(model)
    stem = data.name.rsplit(".", 1)[0] if "." in data.name else data.name
    tag = hashlib.blake2b(str(target).encode(), digest_size=4).hexdigest()
    return (data.with_name(f"{stem}.kahm-work") / f"{target.name}-{tag}").public()


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
            memory_limit, dashboard_address) -> None:
    """Predict the rows of dataset STORE with MODEL; write distances and labels to OUT (Zarr).
    Each may be a path or a URL (s3://…, with --storage-options). OUT must be free or hold
    earlier predictions (they are replaced); anything else there is refused."""
    from kahm_dask.pipeline.cluster.progress import ConsoleProgress
    from kahm_dask.pipeline.predict import check_prediction_target, predict_to_store
    from kahm_dask.pipeline.stores.dataset import open_dataset
    from kahm_dask.pipeline.stores.manifest import read_manifest
    from kahm_dask.storage.location import as_location

    try:
        with _interruptible("prediction"):
            ds = open_dataset(store, storage_options=storage_options)
            n_features = read_manifest(model, storage_options=storage_options)["n_features"]  # all before a cluster
            if ds.n_features != n_features:
                raise ValueError(f"{store} has {ds.n_features} features; the model {model} expects "
                                 f"{n_features}. Predict rows with the features it was trained on.")
            check_prediction_target(as_location(out, storage_options))
            with _connect(_cluster_cfg(scheduler, cluster_config, n_workers, memory_limit,
                                       dashboard_address)) as client:
                _echo_dashboard(client)
                predict_to_store(model, ds.X(), out, client, progress=ConsoleProgress(), n_probe=n_probe,
                                 eval_dtype=eval_dtype, storage_options=storage_options)
    except _user_errors() as exc:
        _fail(exc)
    click.echo(f"predictions for {ds.n_samples} rows written to {out}")


@main.command()
@click.argument("model", type=click.Path(exists=True, path_type=Path))
@click.argument("predictions", type=click.Path(exists=True, path_type=Path))
@click.argument("train_store", type=click.Path(exists=True, path_type=Path))
@click.argument("test_store", type=click.Path(exists=True, path_type=Path))
@click.option("--membership/--no-membership", default=True, show_default=True)
@click.option("--max-train-rows", type=click.IntRange(min=1),
              help="Seeded subset of training rows for the membership metrics.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@_cluster_options
def evaluate(model, predictions, train_store, test_store, membership, max_train_rows, seed,
             scheduler, cluster_config, n_workers, memory_limit, dashboard_address) -> None:
    """Accuracy and membership-inference metrics of stored PREDICTIONS (JSON to stdout).

    Computed on private rows: the numbers are for the data owner (each is explained in
    docs/privacy.md#measuring-membership-risk)."""
    from kahm_dask.pipeline.cluster.progress import ConsoleProgress
    from kahm_dask.pipeline.runs.central import evaluate as evaluate_run
    from kahm_dask.pipeline.stores.dataset import open_dataset

    try:
        with _interruptible("evaluation"), _connect(_cluster_cfg(scheduler, cluster_config, n_workers, memory_limit,
                                                               dashboard_address)):
            with ConsoleProgress().stage("membership metrics (owner only)" if membership else "accuracy"):
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
              help="Cap of the training data's privacy ledger (overrides privacy.budget; lowers a stored budget, "
                   "never raises it).")
@click.option("--ledger-dir", type=click.Path(file_okay=False, path_type=Path),
              help=f"Ledger directory (overrides privacy.ledger_dir; default ${LEDGER_ENV}, else "
                   "~/.local/share/kahm-dask/ledgers).")
@click.option("--dashboard-address", metavar="HOST:PORT",
              help="Dashboard of the LocalCluster (overrides cluster.dashboard_address; default 127.0.0.1:8787, "
                   "this machine only; 'none' turns it off).")
@click.option("--no-progress", is_flag=True, help="No progress lines.")
@click.option("-v", "--verbose", is_flag=True, help=_VERBOSE_HELP)
def run(pipeline: Path, scheduler, cluster_config, output, budget, ledger_dir, dashboard_address,
        no_progress: bool, verbose: bool) -> None:
    """Run PIPELINE.yaml end to end: ingest → release → partition → train → predict → evaluate.

    A file with a top-level `federation:` section runs the federated pipeline (one model per
    site, global decision from the sites' minimum distances). A DP run writes what may be
    published to <output>/public/ (model.zarr, PRIVACY.md, a plot of fabricated rows) and
    everything computed on private rows to <output>/owner/ (report.json, report.md, plots,
    predictions, data and work stores; 0700, owner only), which stays with the data owner.
    Every release is recorded in the privacy ledger of the training rows before its noise is
    drawn. A second run on the same output folder while one runs is refused.
    """
    if verbose:  # raise the group's level (`kahm-dask -v run` raised it already)
        _configure_logging(True)
    from kahm_dask.pipeline.cluster.progress import SILENT, ConsoleProgress
    from kahm_dask.pipeline.cluster.sites import connect_federated
    from kahm_dask.pipeline.config import load_config, load_yaml
    from kahm_dask.pipeline.config.sections import load_federated_config
    from kahm_dask.pipeline.runs.central import run_pipeline
    from kahm_dask.pipeline.runs.federated import run_federated_pipeline

    t0 = time.perf_counter()
    if scheduler and cluster_config:
        raise click.UsageError("give at most one of --scheduler and --cluster-config.")
    tls = _tls_settings()
    if tls and cluster_config:
        raise click.UsageError(_TLS_WITH_CLUSTER_CONFIG)
    cfg, federated, staged = None, False, None
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
        if ledger_dir:
            overrides["privacy.ledger_dir"] = str(ledger_dir)
        if dashboard_address:
            overrides["cluster.dashboard_address"] = None if dashboard_address == "none" else dashboard_address
        if overrides:
            cfg = cfg.with_overrides(**overrides)
        staged = Path(cfg.output) / "owner" / "work" / "model.zarr"
        with _interruptible(f"the run {cfg.name!r}", resume_from=None if federated else staged):
            click.echo(_run_banner(cfg, federated), err=True)
            with (connect_federated(cfg) if federated else _connect(cfg.cluster)) as client:
                _echo_dashboard(client)
                run_fn = run_federated_pipeline if federated else run_pipeline
                run_fn(cfg, client, progress=SILENT if no_progress else ConsoleProgress())
    except _user_errors() as exc:
        _fail(exc, resume_from=None if federated else staged)
    _echo_run_end(Path(cfg.output))
    click.echo(f"done in {time.perf_counter() - t0:.1f} s (cluster start-up included)", err=True)


def _run_banner(cfg, federated: bool) -> str:
    """The first line of a run: what it is."""
    p = cfg.privacy
    privacy = "non-private" if p.epsilon is None else f"DP, ε = {p.epsilon:g} per entry ({p.dp_data} rows)"
    sites = f", {cfg.federation.sites} sites" if federated else ""
    return f"kahm-dask run {cfg.name!r}: {cfg.data.source}, {privacy}{sites} → {cfg.output}"


def _echo_run_end(out: Path) -> None:
    """Print the report, then where the public and the owner's folders are."""
    from kahm_dask.pipeline.runs.data import OWNER, PUBLIC

    owner, public = out / OWNER, out / PUBLIC
    report = owner / "report.md" if (owner / "report.md").exists() else out / "report.md"
    click.echo(report.read_text())
    if public.is_dir():
        click.echo(f"Public folder (may be published: DP model store, PRIVACY.md): {public}")
    if owner.is_dir():
        click.echo(f"Owner folder (keep with the data owner: data, work, report, predictions): {owner}")


# --------------------------------------------------------------------------- ledger


@main.group()
def ledger() -> None:
    """The privacy ledgers: what has been spent on each data set, and its budget."""


def _ledger_of(store, ledger_dir):
    from kahm_dask.pipeline.stores.dataset import open_dataset
    from kahm_dask.privacy.ledger import PrivacyLedger

    return PrivacyLedger.for_data(open_dataset(store).fingerprint(), ledger_dir)


@ledger.command("show")
@click.argument("store", type=_StoreArgument(exists=True), required=False)
@click.option("--ledger-dir", type=click.Path(file_okay=False, path_type=Path),
              help=f"Ledger directory (default ${LEDGER_ENV}, else ~/.local/share/kahm-dask/ledgers).")
def ledger_show(store, ledger_dir) -> None:
    """The releases and budget of dataset STORE's rows; without STORE, every ledger's total."""
    import json as _json

    from kahm_dask.privacy.ledger import PrivacyLedger, default_ledger_dir

    try:
        if store is not None:
            book = _ledger_of(store, ledger_dir)
            summary = book.summary()
            click.echo(f"{store}: ledger {book.path}")
            for e in book.entries:
                click.echo(f"  {e['time']}  ε = {e['epsilon']:g}, δ = {e['delta']:g}  {e['what']}")
            click.echo(_summary_line(summary))
            return
        root = Path(ledger_dir or default_ledger_dir())
        files = sorted(root.glob("*.json")) if root.is_dir() else []
        if not files:
            click.echo(f"no ledgers in {root}")
        for path in files:
            data = _json.loads(path.read_text()).get("data") or {}
            shape = f"{data.get('n_samples')} x {data.get('n_features')}" if data else "?"
            click.echo(f"{path.stem[:12]}…  ({shape} rows)  " + _summary_line(PrivacyLedger(path).summary()))
    except _user_errors() as exc:
        _fail(exc)


def _summary_line(summary: dict) -> str:
    budget = summary["budget"]
    spent = (f"spent ε = {summary['epsilon_total']:g}, δ = {summary['delta_total']:g} "
             f"in {summary['releases']} release(s)")
    if budget is None:
        return spent + "; no budget"
    left = summary["remaining"]
    return spent + f"; budget ({budget[0]:g}, {budget[1]:g}), remaining ({left[0]:g}, {left[1]:g})"


@ledger.command("budget")
@click.argument("store", type=_StoreArgument(exists=True))
@click.argument("epsilon", type=_param_type("epsilon"))
@click.argument("delta", type=_param_type("delta"), default=0.0)
@click.option("--raise", "allow_raise", is_flag=True,
              help="Allow a budget above the stored one (the data owner's decision).")
@click.option("--ledger-dir", type=click.Path(file_okay=False, path_type=Path),
              help=f"Ledger directory (default ${LEDGER_ENV}, else ~/.local/share/kahm-dask/ledgers).")
def ledger_budget(store, epsilon, delta, allow_raise, ledger_dir) -> None:
    """Set the budget (EPSILON, DELTA) of dataset STORE's rows: lowering is always allowed,
    raising only with --raise."""
    try:
        book = _ledger_of(store, ledger_dir)
        book.set_budget(epsilon, delta, allow_raise=allow_raise)
        click.echo(_summary_line(book.summary()))
    except _user_errors() as exc:
        _fail(exc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
