"""What every computing command does around its work: the cluster it connects to, the
dashboard line, one-line errors (and the resume hint where it is true), Ctrl-C, and a console
that shows progress and warnings, not library logging."""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import click

from kahm_dask.cli.options import TLS_WITH_CLUSTER_CONFIG, tls_settings
from kahm_dask.pipeline.config import DASHBOARD

__all__ = ["cluster_cfg", "echo_dashboard", "connect", "user_errors", "fail", "interruptible", "configure_logging",
           "one_line_warning"]


def cluster_cfg(scheduler, cluster_config, n_workers, memory_limit, dashboard_address=DASHBOARD):
    from kahm_dask.pipeline.config import ClusterConfig
    from kahm_dask.pipeline.config.sections import ClusterTLSConfig

    if scheduler and cluster_config:
        raise click.UsageError("give at most one of --scheduler and --cluster-config.")
    tls = tls_settings()
    if tls and cluster_config:
        raise click.UsageError(TLS_WITH_CLUSTER_CONFIG)
    return ClusterConfig(scheduler=scheduler, config=cluster_config, n_workers=n_workers, memory_limit=memory_limit,
                         tls=None if tls is None else ClusterTLSConfig.from_mapping(tls),
                         dashboard_address=dashboard_address)


def echo_dashboard(client) -> None:
    """The dashboard's address on the console (where it listens, in words), or that it is off.

    A cluster started without a dashboard (``--dashboard-address none``) still answers
    ``dashboard_link`` with the default port (its scheduler serves plain HTTP routes there),
    so the cluster's own scheduler options decide."""
    cluster = getattr(client, "cluster", None)
    if (getattr(cluster, "scheduler_spec", None) or {}).get("options", {}).get("dashboard") is False:
        click.echo("Dask dashboard: off", err=True)
        return
    link = getattr(client, "dashboard_link", None)
    if not link:
        return
    from kahm_dask.pipeline.config import dashboard_is_local

    host = link.split("//", 1)[-1].split("/", 1)[0]
    where = " (this machine only)" if dashboard_is_local(host) else ""
    click.echo(f"Dask dashboard{where}: {link}", err=True)


def connect(cluster_cfg):
    from kahm_dask.pipeline.cluster import connect

    return connect(cluster_cfg)


def user_errors() -> tuple[type[BaseException], ...]:
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


def fail(exc: BaseException, *, resume_from=None) -> None:
    """Exit with ``exc`` as one line. ``resume_from``: the staged model store of a training run:
    the resume hint is added only when it holds finished clusters, or when its work store keeps
    a DP release that was charged (then it is true)."""
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
    elif _kept_release(resume_from):
        hint += (" The DP release stays charged in the privacy ledger; its work store keeps it: rerun the same "
                 "command to continue it without a second charge.")
    raise click.ClickException(f"{type(exc).__name__}: {exc}{hint}")


def _kept_release(staged) -> bool:
    """Whether the work store of the staged model store ``staged`` keeps a charged DP release
    (the marker of its noise, pending or complete), which a rerun continues without a new charge."""
    if staged is None:
        return False
    from kahm_dask.pipeline.training.work import NOISY, PENDING_FILE
    from kahm_dask.storage.location import COMPLETE_FILE, as_location

    try:
        staged = as_location(staged)
        return staged.with_name(PENDING_FILE).exists() or (staged.with_name(NOISY) / COMPLETE_FILE).exists()
    except (OSError, ValueError):
        return False


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
def interruptible(what: str, resume_from=None) -> Iterator[None]:
    """Ctrl-C in the block: one line (and the resume hint where it is true), exit code 130."""
    try:
        yield
    except KeyboardInterrupt:
        n = _finished_clusters(resume_from)
        kept = f" {n} finished cluster(s) are kept in {resume_from}: rerun the same command to resume." if n else ""
        click.echo(f"\nInterrupted: {what} stopped.{kept}", err=True)
        sys.exit(130)


def configure_logging(verbose: bool) -> None:
    """Log warnings to the console; with ``verbose`` also INFO lines: kahm-dask's progress
    details and Dask's (its scheduler and nannies in this process, its local workers).

    Dask's level goes to its config ``logging.distributed``, which distributed applies to its
    loggers when it is imported (later, in a command) and local clusters started afterwards
    apply to their workers; a distributed imported already gets it directly.
    """
    import dask

    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    warnings.formatwarning = one_line_warning
    dask.config.set({"logging.distributed": logging.getLevelName(level).lower()})
    for name in ("kahm_dask", "distributed", "dask_ml"):
        logging.getLogger(name).setLevel(level)


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning on the console: its kind and its message, without the library's source line."""
    return f"{category.__name__}: {message}\n"
