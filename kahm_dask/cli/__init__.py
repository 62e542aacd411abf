"""The ``kahm-dask`` command (face layer): ingest, train, predict, evaluate, run, ledger, audit, release,
combine.

Built with click (a well-kept CLI library: typed options, help text, testable with
``click.testing.CliRunner``). One module per group of commands (:mod:`~kahm_dask.cli.data`,
:mod:`~kahm_dask.cli.model`, :mod:`~kahm_dask.cli.run`, :mod:`~kahm_dask.cli.ledger`,
:mod:`~kahm_dask.cli.federation`), their
shared options (:mod:`~kahm_dask.cli.options`) and what every command does around its work
(:mod:`~kahm_dask.cli.session`). Every command that computes accepts ``--scheduler ADDR`` (a
running Dask cluster) or ``--cluster-config FILE`` (``cluster_configs/*.yaml``); the default is a
LocalCluster.
"""

from __future__ import annotations

import click

from kahm_dask.cli.audit import audit
from kahm_dask.cli.data import ingest
from kahm_dask.cli.federation import combine
from kahm_dask.cli.ledger import ledger
from kahm_dask.cli.model import evaluate, predict, train
from kahm_dask.cli.options import VERBOSE_HELP
from kahm_dask.cli.release import release
from kahm_dask.cli.run import run
from kahm_dask.cli.session import configure_logging

__all__ = ["main"]


@click.group()
@click.option("-v", "--verbose", is_flag=True, help=VERBOSE_HELP)
@click.version_option(package_name="kahm-dask")
def main(verbose: bool) -> None:
    """Differentially private classification with Kernel Affine Hull Machines on Dask."""
    configure_logging(verbose)


for command in (ingest, train, predict, evaluate, run, ledger, audit, release, combine):
    main.add_command(command)
