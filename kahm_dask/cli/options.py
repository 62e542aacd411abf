"""The options of the ``kahm-dask`` commands: the cluster, TLS and storage options every
computing command shares, store arguments (a path or a URL), and the training options,
generated from the parameter table (:data:`kahm_dask.params.PARAMS`: type, default, meaning)."""

from __future__ import annotations

import json
from numbers import Integral
from pathlib import Path

import click

from kahm_dask.params import PARAMS
from kahm_dask.pipeline.config import DASHBOARD
from kahm_dask.privacy.ledger import LEDGER_DIR_ENV as LEDGER_ENV

__all__ = ["cluster_options", "tls_options", "tls_settings", "param_type", "options_of", "parameter_options",
           "check_as_options", "estimator_params", "StoreArgument", "storage_option", "SPECIAL_OPTIONS", "NOT_OPTIONS",
           "TLS_WITH_CLUSTER_CONFIG", "VERBOSE_HELP", "LEDGER_DIR_HELP"]


def dashboard_option(f):
    return click.option(
        "--dashboard-address", default=DASHBOARD, show_default=True, metavar="HOST:PORT",
        help="Dashboard of the LocalCluster. It has no authentication, so it listens on this machine only; "
             "another host (e.g. 0.0.0.0:8787) warns. 'none' turns it off.",
        callback=lambda ctx, param, value: None if value in (None, "none") else value,
    )(f)


def cluster_options(f):
    f = dashboard_option(f)
    f = click.option("--memory-limit", default="auto", show_default=True,
                     help="Per-worker memory limit of the LocalCluster, e.g. 2GiB.")(f)
    f = click.option("--n-workers", type=int, default=2, show_default=True, help="Workers of the LocalCluster.")(f)
    f = click.option("--cluster-config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="A cluster_configs/*.yaml file.")(f)
    f = tls_options(f)
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
    """Keep a given --tls-* option in the click context, for :func:`tls_settings`."""
    if value is not None:
        ctx.meta.setdefault(_TLS_META, {})[param.opts[0]] = value
    return value


def tls_options(f):
    """The options --tls-ca-file, --tls-cert, --tls-key (existing files). They are not passed to
    the command function: :func:`tls_settings` reads them from the click context."""
    for name, text in reversed(_TLS_HELP.items()):
        f = click.option(name, type=click.Path(exists=True, dir_okay=False, path_type=Path),
                         expose_value=False, callback=_remember_tls, help=text)(f)
    return f


def tls_settings() -> dict[str, str] | None:
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


def param_type(name: str) -> click.ParamType:
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


#: Where the privacy ledgers are, for the help of every --ledger-dir.
LEDGER_DIR_HELP = (f"Ledger directory (default: ${LEDGER_ENV}, else $XDG_DATA_HOME/kahm-dask/ledgers, "
                   "by default ~/.local/share/kahm-dask/ledgers)")

#: Options of ``kahm-dask train`` that are not named after their parameter, or take another form
#: (the other parameters of the Dask estimator are options ``--<name>``, generated from the table).
SPECIAL_OPTIONS = {
    "random_state": click.option(
        "--seed", "random_state", type=param_type("random_state"), default=None,
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
        help=LEDGER_DIR_HELP + "."),
}


#: Parameters ``kahm-dask train`` does not take: this process's threads, and the test-only seed.
NOT_OPTIONS = ("n_jobs", "insecure_noise_seed")


def options_of(*names: str):
    """A decorator adding the options of the parameters ``names`` (in this order; those of
    :data:`NOT_OPTIONS` skipped): ``--<name>`` from the parameter table (type, default,
    meaning), or its :data:`SPECIAL_OPTIONS` form."""

    def add(f):
        for name in reversed(names):
            if name in NOT_OPTIONS:
                continue
            if name in SPECIAL_OPTIONS:
                f = SPECIAL_OPTIONS[name](f)
                continue
            param = PARAMS[name]
            f = click.option(f"--{name.replace('_', '-')}", name, type=param_type(name), default=param.default,
                             show_default=param.default is not None, help=param.meaning + ".")(f)
        return f

    return add


def parameter_options(f):
    """Every model, privacy and partition parameter of the Dask estimator as an option of
    ``f`` (``--n-components`` …), from the parameter table (type, default, meaning)."""
    from kahm_dask.params import CLASSIFIER_PARAMS, PARTITION_PARAMS

    return options_of(*CLASSIFIER_PARAMS, *PARTITION_PARAMS)(f)


def check_as_options(estimator, budget) -> None:
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


def estimator_params(options: dict) -> dict:
    """The estimator's parameters from the options of :func:`parameter_options`."""
    params = dict(options)
    if params["r_value"] is not None and float(params["r_value"]).is_integer():
        params["r_value"] = int(params["r_value"])  # a whole number on the command line: also a number of passes
    params["ledger"] = "auto" if params["ledger"] is None else str(params["ledger"])
    return params


class StoreArgument(click.ParamType):
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


storage_option = click.option(
    "--storage-options", callback=_parse_storage_options, metavar="JSON",
    help="fsspec options of the URL arguments (s3://, gs://, …), a JSON object, e.g. "
         '\'{"client_kwargs": {"endpoint_url": "https://s3.example.org"}}\'. Leave credentials to the '
         "environment (AWS_* variables, ~/.aws): a command line is visible to other users.",
)


TLS_WITH_CLUSTER_CONFIG = ("the --tls-* options go with --scheduler (or the LocalCluster); a --cluster-config "
                            "file holds its own 'tls' settings.")


VERBOSE_HELP = "Log progress details and Dask's INFO lines (scheduler, nannies, workers)."
