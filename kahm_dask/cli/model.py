"""``kahm-dask train``, ``predict`` and ``evaluate``: a model store from a dataset store, its
predictions, and their metrics."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from kahm_dask.cli import session
from kahm_dask.cli.options import (
    StoreArgument,
    check_as_options,
    cluster_options,
    estimator_params,
    param_type,
    parameter_options,
    storage_option,
)
from kahm_dask.cli.session import cluster_cfg, echo_dashboard, fail, interruptible, user_errors

__all__ = ["train", "predict", "evaluate"]


@click.command()
@click.argument("store", type=StoreArgument(exists=True))
@click.argument("model", type=StoreArgument())
@click.option("--work", type=StoreArgument(),
              help="Work store (private copies, the noisy rows, the model while it is trained; owner only). "
                   "Default: beside STORE, STORE's name with .kahm-work/, one folder per MODEL.")
@parameter_options
@storage_option
@cluster_options
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
    owned_parent, made_parent = None, False
    if work is None:
        work = _default_work(store, model)
        if as_location(work).is_local:
            owned_parent = Path(work).parent  # the data's work stores: owner only, made after the checks
    staged = as_location(work, storage_options) / STAGED_MODEL
    try:
        with interruptible("training", resume_from=staged):
            params = estimator_params(options)
            ds = open_dataset(store, storage_options=storage_options)
            check_class_sizes(ds.class_counts)
            if params["bounds"] is not None:
                from kahm_dask.privacy.bounds import public_bounds

                params["bounds"] = public_bounds(params["bounds"], ds.n_features)
            estimator = DaskKAHMClassifier(**params)
            budget = params["budget"]
            check_as_options(estimator, budget)
            if params["n_components"] > ds.n_features:
                click.echo(f"Warning: --n-components {params['n_components']} exceeds the {ds.n_features} "
                           f"features of {store}; every KAHM subspace is capped at {ds.n_features} "
                           "dimensions (docs/algorithm.md#kahm-guards).", err=True)
            model_at, work_at = as_location(model, storage_options), as_location(work, storage_options)
            check_training_targets(model_at, work_at)
            statement_at = model_at.with_name(model_at.name + ".PRIVACY.md")
            private = params["epsilon"] is not None or params["record_epsilon"] is not None
            if private and statement_at.is_local and statement_at.path.is_dir():
                raise FileExistsError(f"{statement_at} is a folder; the privacy statement cannot be written there.")
            if owned_parent is not None:
                made_parent = not owned_parent.exists()
                private_directory(owned_parent)
            progress = ConsoleProgress()
            with session.connect(cluster_cfg(scheduler, cluster_config, n_workers, memory_limit,
                                       dashboard_address)) as client:
                echo_dashboard(client)
                summary = estimator.fit_store(ds, model_at, work_at, client=client, budget=budget, progress=progress)
    except user_errors() as exc:
        if made_parent and not any(owned_parent.iterdir()):
            owned_parent.rmdir()  # refused before the work store was made: leave nothing behind
        fail(exc, resume_from=staged)
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


@click.command()
@click.argument("model", type=StoreArgument(exists=True))
@click.argument("store", type=StoreArgument(exists=True))
@click.argument("out", type=StoreArgument())
@click.option("--n-probe", type=param_type("n_probe"), default=None,
              help="Clusters per class each row meets (nearest centres); default: all.")
@click.option("--eval-dtype", type=param_type("eval_dtype"), default="float64", show_default=True,
              help="Precision of the kernel blocks; float32 is faster, distances within ~1e-5 relative.")
@storage_option
@cluster_options
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
        with interruptible("prediction"):
            ds = open_dataset(store, storage_options=storage_options)
            n_features = read_manifest(model, storage_options=storage_options)["n_features"]  # all before a cluster
            if ds.n_features != n_features:
                raise ValueError(f"{store} has {ds.n_features} features; the model {model} expects "
                                 f"{n_features}. Predict rows with the features it was trained on.")
            check_prediction_target(as_location(out, storage_options))
            with session.connect(cluster_cfg(scheduler, cluster_config, n_workers, memory_limit,
                                       dashboard_address)) as client:
                echo_dashboard(client)
                predict_to_store(model, ds.X(), out, client, progress=ConsoleProgress(), n_probe=n_probe,
                                 eval_dtype=eval_dtype, storage_options=storage_options)
    except user_errors() as exc:
        fail(exc)
    click.echo(f"predictions for {ds.n_samples} rows written to {out}")


@click.command()
@click.argument("model", type=click.Path(exists=True, path_type=Path))
@click.argument("predictions", type=click.Path(exists=True, path_type=Path))
@click.argument("train_store", type=click.Path(exists=True, path_type=Path))
@click.argument("test_store", type=click.Path(exists=True, path_type=Path))
@click.option("--membership/--no-membership", default=True, show_default=True)
@click.option("--max-train-rows", type=click.IntRange(min=1),
              help="Seeded subset of training rows for the membership metrics.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@cluster_options
def evaluate(model, predictions, train_store, test_store, membership, max_train_rows, seed,
             scheduler, cluster_config, n_workers, memory_limit, dashboard_address) -> None:
    """Accuracy and membership-inference metrics of stored PREDICTIONS (JSON to stdout).

    Computed on private rows: the numbers are for the data owner (each is explained in
    docs/privacy.md#measuring-membership-risk)."""
    from kahm_dask.pipeline.cluster.progress import ConsoleProgress
    from kahm_dask.pipeline.runs.central import evaluate as evaluate_run
    from kahm_dask.pipeline.stores.dataset import open_dataset

    try:
        cluster = cluster_cfg(scheduler, cluster_config, n_workers, memory_limit, dashboard_address)
        with interruptible("evaluation"), session.connect(cluster) as client:
            with ConsoleProgress().stage("membership metrics (owner only)" if membership else "accuracy"):
                metrics, _, _ = evaluate_run(
                    model, predictions, open_dataset(train_store), open_dataset(test_store), client=client,
                    membership=membership, max_train_rows=max_train_rows, seed=seed,
                )
    except user_errors() as exc:
        fail(exc)
    click.echo(json.dumps(metrics, indent=2))
