"""``kahm-dask audit``: an empirical lower bound on the ε of the release mechanism
(:mod:`kahm_dask.privacy.audit`)."""

from __future__ import annotations

import click

from kahm_dask.cli.options import param_type
from kahm_dask.cli.session import fail, user_errors

__all__ = ["audit", "VIOLATION_EXIT"]

#: Exit status of an audit whose bound exceeds the claim (1 is a usage or input error).
VIOLATION_EXIT = 3


@click.command()
@click.option("--epsilon", type=param_type("epsilon"), required=True, help="The claimed ε (per entry).")
@click.option("--delta", type=param_type("delta"), default=0.0, show_default=True, help="The claimed δ.")
@click.option("--d", "d", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Adjacency bound (default: the width of --bounds).")
@click.option("--bounds", type=float, nargs=2, metavar="LOW HIGH", default=(0.0, 1.0), show_default=True,
              help="Public bounds of the audited feature.")
@click.option("--canaries", type=click.IntRange(min=1), default=None,
              help="Canary entries released (default 1000000: about 2 s).")
@click.option("--confidence", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.95,
              show_default=True, help="Probability with which the printed bound holds.")
def audit(epsilon, delta, d, bounds, canaries, confidence) -> None:
    """Release canary entries, each at LOW or LOW + d by a fair coin, through the real mechanism
    (noise from OS entropy) and print a lower bound on the ε it achieves, from the optimal
    attack's guesses. Exits with status 3 and prints VIOLATION when the bound exceeds --epsilon."""
    from kahm_dask.privacy.audit import DEFAULT_CANARIES, audit_release

    try:
        result = audit_release(epsilon, delta=delta, d=d, bounds=bounds, confidence=confidence,
                               canaries=DEFAULT_CANARIES if canaries is None else canaries)
    except user_errors() as exc:
        fail(exc)
    click.echo(result.summary())
    if result.violation:
        raise SystemExit(VIOLATION_EXIT)
