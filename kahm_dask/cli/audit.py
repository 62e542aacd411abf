"""``kahm-dask audit``: an empirical lower bound on the ε of the release mechanism, and with
``--store`` of a whole DP fit (:mod:`kahm_dask.privacy.audit`)."""

from __future__ import annotations

from pathlib import Path

import click

from kahm_dask.cli.options import LEDGER_DIR_HELP, StoreArgument, param_type
from kahm_dask.cli.session import fail, user_errors

__all__ = ["audit", "VIOLATION_EXIT"]

#: Exit status of an audit whose bound exceeds the claim (1 is a usage or input error).
VIOLATION_EXIT = 3


@click.command()
@click.option("--epsilon", type=param_type("epsilon"), required=True, help="The claimed ε (per entry).")
@click.option("--delta", type=param_type("delta"), default=0.0, show_default=True, help="The claimed δ.")
@click.option("--d", "d", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Adjacency bound (default: the width of the bounds).")
@click.option("--bounds", type=float, nargs=2, metavar="LOW HIGH", default=None,
              help="Public bounds of the audited features (default: 0 1, or the public feature range --store "
                   "records).")
@click.option("--canaries", type=click.IntRange(min=1), default=None,
              help="Canary entries released (default 1000000: about 2 s), or canary rows with --store "
                   "(default 1000).")
@click.option("--confidence", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.95,
              show_default=True, help="Probability with which the printed bound holds.")
@click.option("--store", type=StoreArgument(exists=True), default=None,
              help="Also audit a whole DP fit: canary rows added to an in-memory copy of this dataset store's "
                   "rows, fitted with --epsilon (spent once on the store's privacy ledger), scored by the model.")
@click.option("--ledger-dir", type=click.Path(file_okay=False, path_type=Path), help=LEDGER_DIR_HELP + ".")
def audit(epsilon, delta, d, bounds, canaries, confidence, store, ledger_dir) -> None:
    """Release canary entries, each at LOW or LOW + d by a fair coin, through the real mechanism
    (noise from OS entropy) and print a lower bound on the ε it achieves, from the optimal
    attack's guesses on its k most confident canaries (one-run bound of Steinke, Nasr and
    Jagielski 2023; Bonferroni over the k tried). Exits with status 3 and prints VIOLATION when a
    bound exceeds --epsilon. See docs/privacy.md, "Auditing the claim"."""
    from kahm_dask.privacy.audit import DEFAULT_CANARIES, audit_release

    try:
        rows = None if store is None else _store_rows(store, bounds, ledger_dir)
        if rows is None:
            entry_bounds = (0.0, 1.0) if bounds is None else bounds
        else:  # the entry-level audit on the first feature's public bounds (every entry is noised alike)
            entry_bounds = (float(rows[2][0][0]), float(rows[2][1][0]))
        results = [audit_release(epsilon, delta=delta, d=d, bounds=entry_bounds, confidence=confidence,
                                 canaries=DEFAULT_CANARIES if canaries is None or rows else canaries)]
        if rows is not None:
            from kahm_dask.privacy.audit.training import DEFAULT_CANARY_ROWS, audit_training

            X, y, fit_bounds, ledger = rows
            results.append(audit_training(X, y, epsilon, bounds=fit_bounds, delta=delta, d=d, ledger=ledger,
                                          confidence=confidence,
                                          canaries=DEFAULT_CANARY_ROWS if canaries is None else canaries))
    except user_errors() as exc:
        fail(exc)
    for result in results:
        click.echo(result.summary())
    if any(result.violation for result in results):
        raise SystemExit(VIOLATION_EXIT)


def _store_rows(store, bounds, ledger_dir):
    """``(X, y, bounds, ledger)`` of a dataset store: its rows in memory, the public bounds
    (--bounds, else the store's recorded feature range; refused without either) and its ledger."""
    import numpy as np

    from kahm_dask.pipeline.stores.dataset import open_dataset
    from kahm_dask.privacy.ledger import PrivacyLedger

    ds = open_dataset(store)
    if bounds is None:
        fr = ds.attrs.get("feature_range")
        if not fr:
            raise click.UsageError(f"{store} records no public feature range: give --bounds LOW HIGH (known "
                                   "without looking at the data).")
        bounds = (np.asarray(fr["min"], dtype=np.float64), np.asarray(fr["max"], dtype=np.float64))
    else:
        bounds = (np.full(ds.n_features, bounds[0]), np.full(ds.n_features, bounds[1]))
    ledger = PrivacyLedger.for_data(ds, ledger_dir)
    return ds.read_slice(0, ds.n_samples), ds.labels(), bounds, ledger
