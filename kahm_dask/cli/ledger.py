"""``kahm-dask ledger``: what has been spent on each row, and the budgets."""

from __future__ import annotations

from pathlib import Path

import click

from kahm_dask.cli.options import LEDGER_DIR_HELP, StoreArgument, param_type
from kahm_dask.cli.session import fail, user_errors

__all__ = ["ledger"]


@click.group()
def ledger() -> None:
    """The privacy ledger: what has been spent on each row, and the budgets."""


def _ledger_of(store, ledger_dir):
    from kahm_dask.pipeline.stores.dataset import open_dataset
    from kahm_dask.privacy.ledger import PrivacyLedger

    return PrivacyLedger.for_data(open_dataset(store), ledger_dir)


@ledger.command("show")
@click.argument("store", type=StoreArgument(exists=True), required=False)
@click.option("--ledger-dir", type=click.Path(file_okay=False, path_type=Path),
              help=LEDGER_DIR_HELP + ".")
def ledger_show(store, ledger_dir) -> None:
    """The spend per row of dataset STORE's rows (how many rows at each level) and the releases
    that covered them; without STORE, the same over every row of the ledger."""
    from kahm_dask.privacy.ledger import PrivacyLedger, default_ledger_dir

    try:
        if store is not None:
            book = _ledger_of(store, ledger_dir)
            click.echo(f"{store}: {book.n_rows} distinct row(s); ledger {book.file}")
        else:
            root = Path(ledger_dir or default_ledger_dir())
            if not (root / "ledger.json").is_file():
                click.echo(f"no ledger in {root}")
                return
            book = PrivacyLedger(root)
            click.echo(f"ledger {book.file}: {book.n_rows} row(s) released or budgeted")
        _echo_view(book)
    except user_errors() as exc:
        fail(exc)


def _echo_view(book) -> None:
    """Rows at each level of spend, then the releases, then the summary line."""
    for level in book.levels():
        budget = "no budget" if level["budget"] is None else f"budget ({level['budget'][0]:g}, {level['budget'][1]:g})"
        click.echo(f"  {level['rows']:>10} row(s) at ε = {level['spent'][0]:g}, δ = {level['spent'][1]:g} "
                   f"({len(level['releases'])} release(s); {budget})")
    for e in book.entries:
        click.echo(f"  {e['time']}  {e['release_id'][:12]}  ε = {e['epsilon']:g}, δ = {e['delta']:g}  "
                   f"{e.get('rows', '?')} row(s)  {e['what']}")
    click.echo(_summary_line(book.summary()))


def _summary_line(summary: dict) -> str:
    levels = summary["levels"]
    low = min(level["spent"][0] for level in levels)
    spent = (f"spent per row: ε from {low:g} to {summary['epsilon_total']:g}, δ up to {summary['delta_total']:g}, "
             f"in {summary['releases']} release(s)")
    budget = summary["budget"]
    if budget is None:
        return spent + "; no budget"
    left = summary["remaining"]
    return spent + f"; budget ({budget[0]:g}, {budget[1]:g}), remaining on every row ({left[0]:g}, {left[1]:g})"


@ledger.command("budget")
@click.argument("store", type=StoreArgument(exists=True))
@click.argument("epsilon", type=param_type("epsilon"))
@click.argument("delta", type=param_type("delta"), default=0.0)
@click.option("--raise", "allow_raise", is_flag=True,
              help="Allow a budget above the stored one (the data owner's decision).")
@click.option("--ledger-dir", type=click.Path(file_okay=False, path_type=Path),
              help=LEDGER_DIR_HELP + ".")
def ledger_budget(store, epsilon, delta, allow_raise, ledger_dir) -> None:
    """Set the budget (EPSILON, DELTA) of each of dataset STORE's rows: lowering is always
    allowed, raising only with --raise."""
    try:
        book = _ledger_of(store, ledger_dir)
        book.set_budget(epsilon, delta, allow_raise=allow_raise)
        click.echo(_summary_line(book.summary()))
    except user_errors() as exc:
        fail(exc)


@ledger.command("adopt")
@click.argument("store", type=StoreArgument(exists=True))
@click.option("--forget", is_flag=True,
              help="Instead, make dataset STORE forget its releases: the data owner starting over.")
@click.option("--ledger-dir", type=click.Path(file_okay=False, path_type=Path),
              help=LEDGER_DIR_HELP + ".")
def ledger_adopt(store, forget, ledger_dir) -> None:
    """Charge the DP releases that dataset STORE remembers, and the ledger lacks (a ledger moved,
    deleted or another ledger directory), to the store's rows in this ledger; with --forget,
    clear the store's memory instead (its rows' earlier releases are then counted nowhere)."""
    from kahm_dask.pipeline.stores.dataset import open_dataset, remember_release

    try:
        data = open_dataset(store)
        book = _ledger_of(store, ledger_dir)
        if forget:
            with book.book.transaction():
                remember_release(data, None, forget=True)
            click.echo(f"{store} no longer remembers its {len(data.releases)} release(s); the ledger "
                       f"{book.file} counts only what it records.")
            return
        missing = book.adopt_remembered(data.releases)
        click.echo(f"adopted {len(missing)} release(s) into {book.file}")
        click.echo(_summary_line(book.summary()))
    except user_errors() as exc:
        fail(exc)
