"""``kahm-dask combine``: the global model store of a federation, from the model stores the sites
published (:mod:`kahm_dask.pipeline.stores.combine`)."""

from __future__ import annotations

import json

import click

from kahm_dask.cli.options import StoreArgument, storage_option
from kahm_dask.cli.session import fail, user_errors

__all__ = ["combine"]


@click.command()
@click.argument("models", nargs=-1, required=True, type=StoreArgument())
@click.argument("global_model", metavar="GLOBAL", type=StoreArgument())
@click.option("--disjoint-classes", is_flag=True,
              help="Combine sites that share no class (each holds other classes of one labelling).")
@storage_option
def combine(models, global_model, disjoint_classes, storage_options) -> None:
    """Combine the model stores MODEL... that separate sites published into one global model store
    GLOBAL: the class of a query is the class of the smallest distance over every site's class
    models. Only models travel: no row leaves a site. GLOBAL is read by `kahm-dask predict` and
    `evaluate` on any cluster; GLOBAL.PRIVACY.md lists each site's guarantee. MODEL and GLOBAL may
    be paths or URLs (s3://…, with --storage-options).

    Sites are refused, before anything is written, unless their models measure the same thing:
    the same features, public bounds and scaling, labels of one type sharing a class, and one unit
    of privacy (all DP with the same d, or none).
    """
    from kahm_dask.pipeline.stores.combine import combine_models, federation_markdown
    from kahm_dask.storage.location import as_location

    try:
        manifest = combine_models(models, global_model, storage_options=storage_options,
                                  disjoint_classes=disjoint_classes)
        target = as_location(global_model, storage_options)
        statement_at = target.with_name(target.name + ".PRIVACY.md")
        statement_at.write_text(federation_markdown(manifest))
    except user_errors() as exc:
        fail(exc)
    private = manifest["privacy"] is not None
    click.echo(f"privacy statement{' (publishable, with GLOBAL)' if private else ''}: {statement_at}", err=True)
    if not private:
        click.echo(f"Non-private sites: {global_model} holds their private rows' models; keep it with the data "
                   "owners.", err=True)
    click.echo(json.dumps({"model": str(global_model), "sites": len(models), "classes": manifest["classes"],
                           "n_clusters": len(manifest["clusters"])}, indent=2, default=str))
