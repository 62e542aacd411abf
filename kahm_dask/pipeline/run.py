"""One pipeline run: ingest → partition → train → predict → evaluate → report.

Every stage reads and writes Zarr under the run's ``output`` directory; each is resumable
(stores, the noisy rows and finished clusters are reused), so rerunning the same command after
an interruption recomputes only what is missing.

The run folder is split at the release boundary (:class:`RunPaths`):

* ``public/`` may be published: ``model.zarr`` (DP rows and models fitted on them),
  ``PRIVACY.md`` (the privacy statement of the settings used, and the ledger's total) and
  ``fabricated.png`` (fabricated rows only). Only DP runs have one.
* ``owner/`` stays with the data owner: ``data/`` (the private stores and their privacy
  ledger), ``work/`` (private copies, the noisy rows), ``predictions.zarr``, ``report.json``,
  ``report.md`` and ``distances.png``: everything computed on private rows (accuracy on the
  private test split, membership metrics, distances, timings). A non-private run's model store
  is fitted on private rows and lives here too.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from kahm_dask.pipeline.data import OWNER, PUBLIC, feature_bounds
from kahm_dask.pipeline.modelstore import read_manifest
from kahm_dask.pipeline.predict import DISTANCES, PREDICTIONS, class_distance_array, predict_to_store
from kahm_dask.pipeline.store import DatasetStore
from kahm_dask.pipeline.tasks import TrainParams
from kahm_dask.pipeline.train import TrainSettings, train_pipeline
from kahm_dask.privacy.membership import (
    membership_attack_from_distances,
    membership_inference_from_distances,
    training_row_subset,
)
from kahm_dask.report import write_privacy_statement, write_report

__all__ = ["RunPaths", "run_paths", "settings_from_config", "settings_fields", "evaluate", "run_pipeline"]

log = logging.getLogger("kahm_dask")


@dataclass(frozen=True)
class RunPaths:
    """Where a run writes what (module docstring); ``private`` = a DP run."""

    root: Path
    private: bool

    @property
    def public(self) -> Path:
        return self.root / PUBLIC

    @property
    def owner(self) -> Path:
        return self.root / OWNER

    @property
    def model(self) -> Path:
        return (self.public if self.private else self.owner) / "model.zarr"

    @property
    def predictions(self) -> Path:
        return self.owner / "predictions.zarr"

    @property
    def data(self) -> Path:
        return self.owner / "data"

    @property
    def work(self) -> Path:
        return self.owner / "work"

    @property
    def statement(self) -> Path:
        return self.public / "PRIVACY.md"


def run_paths(output: str | Path, private: bool) -> RunPaths:
    return RunPaths(Path(output), bool(private))


def settings_from_config(cfg, train: DatasetStore | None = None) -> TrainSettings:
    """Translate a :class:`~kahm_dask.pipeline.config.PipelineConfig` into train settings.

    For a DP run the feature bounds come from :func:`~kahm_dask.pipeline.data.feature_bounds`
    (given the training store ``train``); without ``train`` they are left to
    :func:`~kahm_dask.pipeline.train.release_bounds` (the store's public feature range, else
    its private min/max, with a warning).
    """
    m, p, part = cfg.model, cfg.privacy, cfg.partition
    params = TrainParams(
        n_components=m.n_components,
        n_layers=m.n_layers,
        epsilon=p.epsilon,
        dp_data=p.dp_data,
        r_source=p.r_source,
        r_value=p.r_value,
        max_passes=p.max_passes,
    )
    bounds = source = None
    if p.epsilon is not None and train is not None:
        found = feature_bounds(cfg.data, train.n_features, train)
        if found is not None:
            bounds, source = (found[0], found[1]), found[2]
    return TrainSettings(
        params,
        seed=cfg.seed,
        delta=p.delta,
        d=p.d,
        bounds=bounds,
        bounds_source=source,
        block_size=m.block_size,
        s_rule=m.s_rule,
        min_cluster_size=m.min_cluster_size,
        cluster_on=p.cluster_on,
        oversampling_factor=part.oversampling_factor,
        init_max_iter=part.init_max_iter,
        kmeans_max_iter=part.max_iter,
        max_cluster_rows=part.max_cluster_rows,
        kmeans_persist_fraction=part.persist_fraction,
        budget=None if p.budget is None else tuple(p.budget),
    )


def settings_fields(cfg, client) -> dict:
    """The report fields that describe the run's privacy and model settings (the seed seeds
    k-means only and is not secret; ``d`` null = the bound width)."""
    p = cfg.privacy
    private = p.epsilon is not None
    return {
        "epsilon": p.epsilon,
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


def evaluate(
    model_path: Path, pred_path: Path, train: DatasetStore, test: DatasetStore, *,
    membership: bool = True, max_train_rows: int | None = None, seed: int = 0,
) -> tuple[dict, np.ndarray | None, np.ndarray | None]:
    """Accuracy from stored predictions; membership score and attack on the original
    training rows (or their seeded subset) vs the test rows. Computed on private rows: the
    result belongs to the owner's folder."""
    group = zarr.open_group(str(pred_path), mode="r")
    classes = np.asarray(group.attrs["classes"], dtype=object)
    pred = classes[group[PREDICTIONS][...]]
    truth = test.labels()
    metrics = {"accuracy": float(np.mean(pred.astype(str) == truth.astype(str)))}
    if not membership:
        return metrics, None, None
    d_test = np.min(group[DISTANCES][...], axis=1)
    rows = training_row_subset(train.n_samples, max_train_rows, random_state=seed)
    d_train = class_distance_array(model_path, train.X()[np.sort(rows)]).min(axis=1).compute()
    mia = membership_inference_from_distances(d_train, d_test, random_state=seed)
    attack = membership_attack_from_distances(d_train, d_test)
    metrics.update(
        mis=mia.mis, mis_norm=mia.mis_norm, median_distance=mia.median_distance,
        n_train_used=mia.n_train_used, n_infinite=mia.n_infinite,
        attack_auc=attack.auc, attack_advantage=attack.advantage,
        attack_tpr_at_1pct_fpr=attack.tpr_at_1pct_fpr, attack_tpr_at_0_1pct_fpr=attack.tpr_at_0_1pct_fpr,
    )
    return metrics, d_train, d_test


def _fabricated_samples(model_path: Path, k: int = 4) -> dict:
    """A few DP rows per class from the model store (fabricated or noisy rows only)."""
    manifest = read_manifest(model_path)
    fabricated = {}
    for entry in manifest["clusters"]:
        label = manifest["classes"][entry["class"]]
        if label in fabricated:
            continue
        group = zarr.open_group(str(model_path / "clusters" / f"c{entry['class']}_s{entry['cluster']}"), mode="r")
        if "fabricated" not in group:
            return {}
        fabricated[label] = group["fabricated"][:k]
    return fabricated


def run_pipeline(cfg, client, *, progress: bool = True) -> dict:
    """Run a whole pipeline config on ``client``; returns the metrics written to report.json
    (in ``<output>/owner``; the publishable part is in ``<output>/public``)."""
    from kahm_dask.pipeline.data import prepare_stores

    p = cfg.privacy
    paths = run_paths(cfg.output, p.epsilon is not None)
    paths.owner.mkdir(parents=True, exist_ok=True)
    if paths.private:
        paths.public.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    train, test = prepare_stores(cfg, paths.root)
    t_ingest = time.perf_counter() - t0
    log.info("data: %d training rows, %d test rows, %d features", train.n_samples, test.n_samples, train.n_features)

    settings = settings_from_config(cfg, train)
    t1 = time.perf_counter()
    summary = train_pipeline(train, paths.model, paths.work, settings, client, progress=progress)
    fit_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    predict_to_store(paths.model, test.X(), paths.predictions, client, progress=progress)
    predict_s = time.perf_counter() - t2
    metrics, d_train, d_test = evaluate(
        paths.model, paths.predictions, train, test, membership=cfg.evaluate.membership,
        max_train_rows=cfg.evaluate.max_train_rows, seed=cfg.data.split_seed,
    )
    privacy = summary["privacy"]
    fields = settings_fields(cfg, client)
    fields["seed"] = summary["seed"]
    if privacy is not None:
        mech = privacy["statement"]["mechanism"]
        fields.update(d=mech["d"], bounds=[mech["lower"], mech["upper"]],
                      bounds_source=privacy["statement"]["bounds_source"])
    metrics = {
        "name": cfg.name,
        **metrics,
        "fit_seconds": round(fit_s, 3),
        "fit_stage_seconds": {**summary["stage_seconds"], "tasks": summary["train_seconds"]},
        "predict_seconds": round(predict_s, 3),
        "ingest_seconds": round(t_ingest, 3),
        "n_train": train.n_samples,
        "n_test": test.n_samples,
        "n_features": train.n_features,
        "n_clusters": summary["n_clusters"],
        "n_clusters_resumed": summary["n_resumed"],
        **fields,
        "public_dir": str(paths.public) if paths.private else None,
        "owner_dir": str(paths.owner),
        "model_store": str(paths.model),
        "privacy": privacy,
    }
    fabricated = {}
    if paths.private:
        write_privacy_statement(paths.public, summary["privacy_statement_markdown"], privacy["ledger"])
        fabricated = _fabricated_samples(paths.model)
    write_report(paths.owner, metrics, plots=cfg.report.plots, fabricated=fabricated,
                 d_train=d_train, d_test=d_test,
                 statement_markdown=summary["privacy_statement_markdown"],
                 public_dir=paths.public if paths.private else None)
    return metrics
