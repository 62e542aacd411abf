"""``kahm-dask ledger``: what has been spent on each data set, and its budget."""

from __future__ import annotations

from pathlib import Path

import click

from kahm_dask.cli.options import LEDGER_DIR_HELP, StoreArgument, param_type
from kahm_dask.cli.session import fail, user_errors

__all__ = ["ledger"]


@click.group()
def ledger() -> None:
    """The privacy ledgers: what has been spent on each data set, and its budget."""


def _ledger_of(store, ledger_dir):
    from kahm_dask.pipeline.stores.dataset import open_dataset
    from kahm_dask.privacy.ledger import PrivacyLedger

    return PrivacyLedger.for_data(open_dataset(store).fingerprint(), ledger_dir)


@ledger.command("show")
@click.argument("store", type=StoreArgument(exists=True), required=False)
@click.option("--ledger-dir", type=click.Path(file_okay=False, path_type=Path),
              help=LEDGER_DIR_HELP + ".")
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
    except user_errors() as exc:
        fail(exc)


def _summary_line(summary: dict) -> str:
    budget = summary["budget"]
    spent = (f"spent ε = {summary['epsilon_total']:g}, δ = {summary['delta_total']:g} "
             f"in {summary['releases']} release(s)")
    if budget is None:
        return spent + "; no budget"
    left = summary["remaining"]
    return spent + f"; budget ({budget[0]:g}, {budget[1]:g}), remaining ({left[0]:g}, {left[1]:g})"


@ledger.command("budget")
@click.argument("store", type=StoreArgument(exists=True))
@click.argument("epsilon", type=param_type("epsilon"))
@click.argument("delta", type=param_type("delta"), default=0.0)
@click.option("--raise", "allow_raise", is_flag=True,
              help="Allow a budget above the stored one (the data owner's decision).")
@click.option("--ledger-dir", type=click.Path(file_okay=False, path_type=Path),
              help=LEDGER_DIR_HELP + ".")
def ledger_budget(store, epsilon, delta, allow_raise, ledger_dir) -> None:
    """Set the budget (EPSILON, DELTA) of dataset STORE's rows: lowering is always allowed,
    raising only with --raise."""
    try:
        book = _ledger_of(store, ledger_dir)
        book.set_budget(epsilon, delta, allow_raise=allow_raise)
        click.echo(_summary_line(book.summary()))
    except user_errors() as exc:
        fail(exc)
