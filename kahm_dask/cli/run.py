"""``kahm-dask run``: a pipeline file end to end (central or federated)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from kahm_dask.cli import session
from kahm_dask.cli.options import LEDGER_DIR_HELP, TLS_WITH_CLUSTER_CONFIG, VERBOSE_HELP, tls_options, tls_settings
from kahm_dask.cli.session import configure_logging, echo_dashboard, fail, interruptible, user_errors

__all__ = ["run"]


@click.command()
@click.argument("pipeline", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--scheduler", help="Address of a running Dask scheduler (overrides the file's cluster.scheduler, "
                                   "cluster.config and cluster.tls; tls://host:port with the --tls-* options).")
@tls_options
@click.option("--cluster-config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A cluster_configs/*.yaml file (overrides the file).")
@click.option("--output", type=click.Path(path_type=Path), help="Run directory (overrides the file).")
@click.option("--budget", type=float, nargs=2, metavar="EPS DELTA", default=None,
              help="Cap of the training data's privacy ledger (overrides privacy.budget; lowers a stored budget, "
                   "never raises it).")
@click.option("--ledger-dir", type=click.Path(file_okay=False, path_type=Path),
              help=LEDGER_DIR_HELP + "; overrides privacy.ledger_dir.")
@click.option("--dashboard-address", metavar="HOST:PORT",
              help="Dashboard of the LocalCluster (overrides cluster.dashboard_address; default 127.0.0.1:8787, "
                   "this machine only; 'none' turns it off).")
@click.option("--no-progress", is_flag=True, help="No progress lines.")
@click.option("--full-report", is_flag=True,
              help="Print the whole report (owner only: results, membership metrics, timings, settings, privacy "
                   "statement) before the summary; it is always written to <output>/owner/report.md.")
@click.option("-v", "--verbose", is_flag=True, help=VERBOSE_HELP)
def run(pipeline: Path, scheduler, cluster_config, output, budget, ledger_dir, dashboard_address,
        no_progress: bool, full_report: bool, verbose: bool) -> None:
    """Run PIPELINE.yaml end to end: ingest → release → partition → train → predict → evaluate.

    A file with a top-level `federation:` section runs the federated pipeline (one model per
    site, global decision from the sites' minimum distances). A DP run writes what may be
    published to <output>/public/ (model.zarr, PRIVACY.md, a plot of DP rows) and
    everything computed on private rows to <output>/owner/ (report.json, report.md, plots,
    predictions, data and work stores; 0700, owner only), which stays with the data owner.
    Every release is recorded in the privacy ledger of the training rows before its noise is
    drawn. A second run on the same output folder while one runs is refused. The console ends
    with the accuracy, the timings, the privacy spent and the folders; --full-report prints
    the whole report too.
    """
    if verbose:  # raise the group's level (`kahm-dask -v run` raised it already)
        configure_logging(True)
    from kahm_dask.pipeline.cluster.progress import SILENT, ConsoleProgress
    from kahm_dask.pipeline.cluster.sites import connect_federated
    from kahm_dask.pipeline.config import load_config, load_yaml
    from kahm_dask.pipeline.config.sections import load_federated_config
    from kahm_dask.pipeline.runs.central import run_pipeline
    from kahm_dask.pipeline.runs.federated import run_federated_pipeline
    from kahm_dask.pipeline.runs.layout import run_paths

    t0 = time.perf_counter()
    if scheduler and cluster_config:
        raise click.UsageError("give at most one of --scheduler and --cluster-config.")
    tls = tls_settings()
    if tls and cluster_config:
        raise click.UsageError(TLS_WITH_CLUSTER_CONFIG)
    cfg, federated, staged, metrics = None, False, None, None
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
        staged = run_paths(cfg.output, cfg.privacy.private).staged_model
        with interruptible(f"the run {cfg.name!r}", resume_from=None if federated else staged):
            click.echo(_run_banner(cfg, federated), err=True)
            with (connect_federated(cfg) if federated else session.connect(cfg.cluster)) as client:
                echo_dashboard(client)
                run_fn = run_federated_pipeline if federated else run_pipeline
                metrics = run_fn(cfg, client, progress=SILENT if no_progress else ConsoleProgress())
    except user_errors() as exc:
        fail(exc, resume_from=None if federated else staged)
    _echo_run_end(metrics, Path(cfg.output), federated, full_report)
    click.echo(f"done in {time.perf_counter() - t0:.1f} s (cluster start-up included)", err=True)


def _run_banner(cfg, federated: bool) -> str:
    """The first line of a run: what it is."""
    p = cfg.privacy
    if not p.private:
        privacy = "non-private"
    elif p.epsilon is None:
        privacy = f"DP, ε = {p.record_epsilon:g} per record at δ = {p.record_delta:g} ({p.dp_data} rows)"
    else:
        privacy = f"DP, ε = {p.epsilon:g} per entry ({p.dp_data} rows)"
    sites = f", {cfg.federation.sites} sites" if federated else ""
    return f"kahm-dask run {cfg.name!r}: {cfg.data.source}, {privacy}{sites} → {cfg.output}"


def _echo_run_end(metrics: dict, out: Path, federated: bool, full_report: bool) -> None:
    """Print the run's summary (:func:`~kahm_dask.pipeline.runs.report.console_summary`), after
    the whole report with ``full_report``."""
    from kahm_dask.pipeline.runs.layout import FederationPaths, run_paths
    from kahm_dask.pipeline.runs.report import console_summary

    report_md = run_paths(out, private=False).report_md  # the owner's report, DP or not
    if full_report:
        click.echo(report_md.read_text())
    sites = FederationPaths(out, private=False).sites_dir if federated else None
    click.echo(console_summary(metrics, report_md, sites))
