"""One pipeline run: ingest → partition → train → predict → evaluate → report.

Every stage reads and writes Zarr under the run's ``output`` directory; each is resumable
(stores, the noisy rows and finished clusters are reused), so rerunning the same command after
an interruption recomputes only what is missing.

The run folder is split at the release boundary (:class:`~kahm_dask.pipeline.runs.layout.RunPaths`):

* ``public/`` may be published: ``model.zarr`` (DP rows and models fitted on them),
  ``PRIVACY.md`` (the privacy statement of the settings used, and the ledger's total) and
  ``dp_rows.png`` (single DP rows beside each class's mean of DP rows). Only DP runs have one.
* ``owner/`` stays with the data owner: ``data/`` (the private stores and their privacy
  ledger), ``work/`` (private copies, the noisy rows), ``predictions.zarr``, ``report.json``,
  ``report.md`` and ``distances.png``: everything computed on private rows (accuracy on the
  private test split, membership metrics, distances, timings). A non-private run's model store
  is fitted on private rows and lives here too.

The steps every run takes are written here once and shared with the federated run
(:mod:`kahm_dask.pipeline.runs.federated`, which adds only what is federated): the folder layout
(:mod:`~kahm_dask.pipeline.runs.layout`), the train settings and report fields of a config, the stage timings
(:class:`Stopwatch`), the accuracy and membership metrics, the privacy statements
(:func:`write_statement`) and the report's metrics (:func:`report_metrics`). Connecting to
the cluster and computing on it are :mod:`kahm_dask.pipeline.cluster`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import dask.array as da
import numpy as np
import zarr
from distributed import Client
from threadpoolctl import threadpool_limits

from kahm_dask.federated import membership_fields
from kahm_dask.pipeline.cluster import compute
from kahm_dask.pipeline.cluster.progress import Progress, as_progress
from kahm_dask.pipeline.config import PipelineConfig
from kahm_dask.pipeline.estimator import DaskKAHMClassifier
from kahm_dask.pipeline.placement import worker_addresses
from kahm_dask.pipeline.predict import (
    DISTANCES,
    PREDICTIONS,
    class_distance_array,
    predict_to_store,
)
from kahm_dask.pipeline.runs.data import feature_bounds, prepare_stores, scaled_d
from kahm_dask.pipeline.runs.layout import RunPaths, run_paths
from kahm_dask.pipeline.runs.report import write_privacy_statement, write_report
from kahm_dask.pipeline.stores.dataset import DatasetStore
from kahm_dask.pipeline.stores.manifest import read_manifest
from kahm_dask.pipeline.stores.model import cluster_dir, dp_rows_array
from kahm_dask.pipeline.training import TrainSettings, trained_on
from kahm_dask.privacy.bounds import BOUNDS_PUBLIC, FeatureBounds
from kahm_dask.privacy.membership import (
    membership_attack_from_distances,
    membership_inference_from_distances,
    training_row_subset,
)
from kahm_dask.report.pictures import ClassSummary
from kahm_dask.storage.locks import exclusive
from kahm_dask.storage.private import make_private

__all__ = [
    "estimator_from_config",
    "settings_from_config",
    "settings_fields",
    "release_fields",
    "Stopwatch",
    "accuracy",
    "member_rows",
    "membership_metrics",
    "evaluate",
    "write_statement",
    "report_metrics",
    "run_pipeline",
]

log = logging.getLogger("kahm_dask")


def estimator_from_config(
    cfg: PipelineConfig, train: DatasetStore | None = None
) -> tuple[DaskKAHMClassifier, str | None]:
    """The :class:`~kahm_dask.DaskKAHMClassifier` a pipeline config describes
    (:meth:`~kahm_dask.DaskKAHMClassifier.from_config`), and where its bounds come from.

    For a DP run the feature bounds come from :func:`~kahm_dask.pipeline.runs.data.feature_bounds`
    (given the training store ``train``) as a :class:`~kahm_dask.privacy.bounds.FeatureBounds`
    with their scaling, and ``privacy.d`` (raw units) is turned into feature units
    (:func:`~kahm_dask.pipeline.runs.data.scaled_d`); without ``train`` the bounds are left to
    :func:`~kahm_dask.pipeline.training.train.release_bounds` (the store's public feature range, else its
    private min/max, with a warning).
    """
    bounds = source = None
    private = cfg.privacy.private
    n_features = None if train is None else train.n_features
    if private and train is not None:
        found = feature_bounds(cfg.data, n_features, train)
        if found is not None:
            bounds = FeatureBounds(found.lower, found.upper, public=found.source == BOUNDS_PUBLIC,
                                   scaling=found.scaling)
            source = found.source
    d = cfg.privacy.d if not private or n_features is None else scaled_d(cfg.data, cfg.privacy.d, n_features)
    return DaskKAHMClassifier.from_config(cfg, bounds=bounds, d=d), source


def settings_from_config(cfg: PipelineConfig, train: DatasetStore | None = None) -> TrainSettings:
    """The train settings of a pipeline config: its estimator's
    (:meth:`~kahm_dask.DaskKAHMClassifier.train_settings`, with the bounds' source and the
    config's privacy budget)."""
    estimator, source = estimator_from_config(cfg, train)
    return estimator.train_settings(bounds_source=source, budget=cfg.privacy.budget)


def settings_fields(cfg: PipelineConfig, client: Client | None) -> dict:
    """The report fields that describe the run's privacy and model settings (the seed seeds
    k-means only and is not secret; ``d`` null = the bound width)."""
    p = cfg.privacy
    private = p.private
    return {
        "epsilon": p.epsilon,
        "record_epsilon": p.record_epsilon,
        "delta": p.delta if private else None,
        "d": p.d,
        "dp_data": p.dp_data if private else None,
        "r_source": p.r_source if private and p.dp_data == "fabricated" else None,
        "cluster_on": p.cluster_on if private else None,
        "budget": p.budget,
        "n_components": cfg.model.n_components,
        "n_layers": cfg.model.n_layers,
        "seed": cfg.seed,
        "dashboard": getattr(client, "dashboard_link", None),
    }


def release_fields(privacy: Sequence[dict | None]) -> dict:
    """``d``, ``bounds`` and ``bounds_source`` of the DP releases of a run's models (the
    ``privacy`` of their training summaries; none for a non-private run), and ``d_raw``,
    ``bounds_raw`` in the raw units when the scaling is public: one value when every model used
    the same, else one per model (e.g. bounds each site took from its own rows)."""
    if not privacy or privacy[0] is None:
        return {}
    statements = [p["statement"] for p in privacy]
    per_model = {
        "d": [s["mechanism"]["d"] for s in statements],
        "bounds": [[s["mechanism"]["lower"], s["mechanism"]["upper"]] for s in statements],
        "bounds_source": [s["bounds_source"] for s in statements],
    }
    if all(s.get("raw") for s in statements):  # the same in the owner's raw units
        per_model["d_raw"] = [s["raw"]["d"] for s in statements]
        per_model["bounds_raw"] = [[s["raw"]["raw_lower"], s["raw"]["raw_upper"]] for s in statements]
    return {k: v[0] if all(x == v[0] for x in v) else v for k, v in per_model.items()}


@dataclass
class Stopwatch:
    """Wall-clock seconds of a run's stages, by name."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block inside as stage ``name``."""
        t0 = time.perf_counter()
        yield
        self.seconds[name] = time.perf_counter() - t0


def accuracy(group: zarr.Group, codes: str, test: DatasetStore) -> float:
    """Share of the test rows whose predicted class (array ``codes`` of ``group``: codes into
    its ``classes`` attribute) is their label."""
    classes = np.asarray(group.attrs["classes"], dtype=object)
    pred = classes[group[codes][...]]
    return float(np.mean(pred.astype(str) == test.labels().astype(str)))


def member_rows(store: DatasetStore, max_train_rows: int | None, seed: int) -> da.Array:
    """The training rows the membership metrics use: all rows of ``store``, or the seeded
    subset of ``max_train_rows`` (:func:`~kahm_dask.privacy.membership.training_row_subset`)."""
    rows = training_row_subset(store.n_samples, max_train_rows, random_state=seed)
    X = store.X()
    return X if rows.size == store.n_samples else X[rows]


def membership_metrics(d_train: np.ndarray, d_test: np.ndarray, seed: int) -> dict:
    """The membership report fields (docs/algorithm.md#mis-reporting) of the members'
    min-over-class distances ``d_train`` against the non-members' ``d_test``."""
    inference = membership_inference_from_distances(d_train, d_test, random_state=seed)
    return membership_fields(inference, membership_attack_from_distances(d_train, d_test))


def evaluate(
    model_path: Path, pred_path: Path, train: DatasetStore, test: DatasetStore, *, client: Client | None = None,
    membership: bool = True, max_train_rows: int | None = None, seed: int = 0, n_probe: int | None = None,
    eval_dtype: str = "float64", trained_on: Mapping[tuple[int, int], str | None] | None = None,
) -> tuple[dict, np.ndarray | None, np.ndarray | None]:
    """Accuracy from stored predictions; membership score and attack on the original
    training rows (or their seeded subset) vs the test rows, their distances computed as the
    predictions were (``n_probe``, ``eval_dtype``), on ``client`` (each model on its home
    worker, where the prediction loaded it: the one that trained it, with ``trained_on``) or
    Dask's default scheduler. Computed on private
    rows: the result belongs to the owner's folder."""
    group = zarr.open_group(str(pred_path), mode="r")
    metrics = {"accuracy": accuracy(group, PREDICTIONS, test)}
    if not membership:
        return metrics, None, None
    d_test = np.min(group[DISTANCES][...], axis=1)
    X = member_rows(train, max_train_rows, seed)
    D = class_distance_array(model_path, X, n_probe=n_probe, eval_dtype=eval_dtype, workers=worker_addresses(client),
                             trained_on=trained_on)
    d_train = compute(D.min(axis=1), client, optimize_graph=False)  # as built: keeps the homes
    # one BLAS thread in the client: its small eigendecompositions stall with two threads on a
    # busy machine (measured: 57 s instead of 1.2 s for the quickstart's metric)
    with threadpool_limits(limits=1, user_api="blas"):
        metrics.update(membership_metrics(d_train, d_test, seed))
    return metrics, d_train, d_test


def write_statement(paths: RunPaths, summary: dict) -> None:
    """Write the privacy statement of a DP model (its training ``summary``) with its data
    set's ledger total to ``paths.public``; nothing for a non-private model."""
    if summary["privacy"] is not None:
        write_privacy_statement(paths.public, summary["privacy_statement_markdown"],
                                summary["privacy"]["ledger"])


def report_metrics(
    cfg: PipelineConfig,
    client: Client | None,
    quality: dict,
    seconds: dict[str, float],
    train: DatasetStore,
    test: DatasetStore,
    summaries: Sequence[dict],
    *,
    seed: int | None,
    fit_details: dict,
    run_details: dict,
    outputs: dict,
) -> dict:
    """The metrics of a run's ``report.json``, in order: the config's name, the ``quality``
    metrics, the ``seconds`` of the stages ``fit`` (then ``fit_details``), ``predict``,
    ``ingest`` and ``evaluate`` (the accuracy and membership metrics), the data sizes (then
    ``run_details``), the cluster counts of the models' training ``summaries``, the settings
    (:func:`settings_fields` with ``seed`` and the :func:`release_fields`) and ``outputs``
    (where the run wrote what)."""
    fields = settings_fields(cfg, client)
    fields["seed"] = seed
    fields.update(release_fields([s["privacy"] for s in summaries]))
    return {
        "name": cfg.name,
        **quality,
        "fit_seconds": round(seconds["fit"], 3),
        **fit_details,
        "predict_seconds": round(seconds["predict"], 3),
        "ingest_seconds": round(seconds["ingest"], 3),
        "evaluate_seconds": round(seconds["evaluate"], 3),
        "n_train": train.n_samples,
        "n_test": test.n_samples,
        "n_features": train.n_features,
        **run_details,
        "n_clusters": sum(s["n_clusters"] for s in summaries),
        "n_clusters_resumed": sum(s["n_resumed"] for s in summaries),
        **fields,
        **outputs,
    }


def _dp_row_summary(model_path: Path) -> ClassSummary | None:
    """A few DP rows and the mean of up to ``ClassSummary.max_rows`` DP rows of each class, read
    cluster by cluster from the model store (fabricated or noisy rows only); None without them."""
    manifest = read_manifest(model_path)
    summary = ClassSummary()
    for entry in manifest["clusters"]:
        label = manifest["classes"][entry["class"]]
        if summary.counts.get(label, 0) >= summary.max_rows:
            continue
        group = zarr.open_group(str(cluster_dir(model_path, entry["class"], entry["cluster"])), mode="r")
        rows = dp_rows_array(group)
        if rows is None:
            return None
        summary.add(label, rows[: summary.max_rows - summary.counts.get(label, 0)])
    return summary


def run_pipeline(cfg: PipelineConfig, client: Client | None, *, progress: Progress | bool = True) -> dict:
    """Run a whole pipeline config on ``client``; returns the metrics written to report.json
    (in ``<output>/owner``; the publishable part is in ``<output>/public``).

    The run folder is locked for the run (a second concurrent run on it is refused at once) and
    its ``owner/`` folder is private by file mode (folders 0700, files 0600). ``progress``: a
    :class:`~kahm_dask.pipeline.cluster.progress.Progress` naming every stage (True: the console).
    """
    progress = as_progress(progress)
    paths = run_paths(cfg.output, cfg.privacy.private)
    with exclusive(paths.root, "the run folder"):
        paths.make_dirs()
        try:
            return _run(cfg, client, paths, progress)
        finally:
            make_private(paths.owner)


def _run(cfg: PipelineConfig, client: Client | None, paths: RunPaths, progress: Progress) -> dict:
    clock = Stopwatch()
    with clock.stage("ingest"), progress.stage("ingest (private stores)"):
        train, test = prepare_stores(cfg, paths.root)
    log.info("data: %d training rows, %d test rows, %d features", train.n_samples, test.n_samples, train.n_features)

    estimator, bounds_source = estimator_from_config(cfg, train)
    with clock.stage("fit"):
        summary = estimator.fit_store(train, paths.model, paths.work, client=client, progress=progress,
                                      bounds_source=bounds_source, budget=cfg.privacy.budget)
    with clock.stage("predict"):
        predict_to_store(paths.model, test.X(), paths.predictions, client, progress=progress,
                         n_probe=cfg.model.n_probe, eval_dtype=cfg.model.eval_dtype, trained_on=trained_on(summary))
    label = "membership metrics (owner only)" if cfg.evaluate.membership else "accuracy (owner only)"
    with clock.stage("evaluate"), progress.stage(label):
        quality, d_train, d_test = evaluate(
            paths.model, paths.predictions, train, test, client=client, membership=cfg.evaluate.membership,
            max_train_rows=cfg.evaluate.max_train_rows, seed=cfg.data.split_seed, n_probe=cfg.model.n_probe,
            eval_dtype=cfg.model.eval_dtype, trained_on=trained_on(summary),
        )
    metrics = report_metrics(
        cfg, client, quality, clock.seconds, train, test, [summary], seed=summary["seed"],
        fit_details={
            "fit_stage_seconds": {**summary["stage_seconds"], "tasks": summary["train_seconds"]},
        },
        run_details={},
        outputs={
            "public_dir": str(paths.public) if paths.private else None,
            "owner_dir": str(paths.owner),
            "model_store": str(paths.model),
            "privacy": summary["privacy"],
        },
    )
    write_statement(paths, summary)
    write_report(paths.owner, metrics, plots=cfg.report.plots,
                 dp_rows=_dp_row_summary(paths.model) if paths.private else None,
                 d_train=d_train, d_test=d_test,
                 statement_markdown=summary["privacy_statement_markdown"],
                 public_dir=paths.public if paths.private else None)
    return metrics
