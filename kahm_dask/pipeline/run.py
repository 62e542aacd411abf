"""One pipeline run: ingest → partition → train → predict → evaluate → report.

Every stage reads and writes Zarr under the run's ``output`` directory; each is resumable
(stores and finished clusters are reused), so rerunning the same command after an
interruption recomputes only what is missing.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import zarr

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
from kahm_dask.report import write_report

__all__ = ["settings_from_config", "evaluate", "run_pipeline"]

log = logging.getLogger("kahm_dask")


def settings_from_config(cfg) -> TrainSettings:
    """Translate a :class:`~kahm_dask.pipeline.config.PipelineConfig` into train settings."""
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
    return TrainSettings(
        params,
        seed=cfg.seed,
        delta=p.delta,
        d=p.d,
        block_size=m.block_size,
        s_rule=m.s_rule,
        min_cluster_size=m.min_cluster_size,
        cluster_on=p.cluster_on,
        oversampling_factor=part.oversampling_factor,
        init_max_iter=part.init_max_iter,
        kmeans_max_iter=part.max_iter,
        kmeans_persist_fraction=part.persist_fraction,
    )


def settings_fields(cfg, client) -> dict:
    """The report fields that describe the run's privacy and model settings (the seed of a DP
    run is reported as "secret": it is never written to a report)."""
    p = cfg.privacy
    return {
        "epsilon": p.epsilon,
        "delta": p.delta,
        "d": p.d,
        "dp_data": p.dp_data if p.epsilon is not None else None,
        "n_components": cfg.model.n_components,
        "n_layers": cfg.model.n_layers,
        "seed": "secret" if p.epsilon is not None else cfg.seed,
        "dashboard": getattr(client, "dashboard_link", None),
    }


def evaluate(
    model_path: Path, pred_path: Path, train: DatasetStore, test: DatasetStore, *,
    membership: bool = True, max_train_rows: int | None = None, seed: int = 0,
) -> tuple[dict, np.ndarray | None, np.ndarray | None]:
    """Accuracy from stored predictions; membership score and attack on the original
    training rows (or their seeded subset, §8.1) vs the test rows."""
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


def _report_samples(model_path: Path, test: DatasetStore, k: int = 4) -> tuple[dict, dict]:
    """A few DP rows per class from the model store and test rows of the same classes."""
    manifest = read_manifest(model_path)
    fabricated, test_rows = {}, {}
    y = test.labels()
    for entry in manifest["clusters"]:
        label = manifest["classes"][entry["class"]]
        if label in fabricated:
            continue
        group = zarr.open_group(str(model_path / "clusters" / f"c{entry['class']}_s{entry['cluster']}"), mode="r")
        if "fabricated" not in group:
            return {}, {}
        fabricated[label] = group["fabricated"][:k]
        rows = np.flatnonzero(y.astype(str) == str(label))[:k]
        test_rows[label] = test.read_rows(rows) if rows.size else np.empty((0, test.n_features))
    return fabricated, test_rows


def run_pipeline(cfg, client, *, progress: bool = True) -> dict:
    """Run a whole pipeline config on ``client``; returns the metrics written to report.json."""
    from kahm_dask.pipeline.data import prepare_stores

    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    train, test = prepare_stores(cfg, out)
    t_ingest = time.perf_counter() - t0
    log.info("data: %d training rows, %d test rows, %d features", train.n_samples, test.n_samples, train.n_features)

    settings = settings_from_config(cfg)
    model_path, pred_path = out / "model.zarr", out / "predictions.zarr"
    t1 = time.perf_counter()
    summary = train_pipeline(train, model_path, out / "work", settings, client, progress=progress)
    fit_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    predict_to_store(model_path, test.X(), pred_path, client, progress=progress)
    predict_s = time.perf_counter() - t2
    metrics, d_train, d_test = evaluate(
        model_path, pred_path, train, test, membership=cfg.evaluate.membership,
        max_train_rows=cfg.evaluate.max_train_rows, seed=cfg.data.split_seed,
    )
    p = cfg.privacy
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
        **settings_fields(cfg, client),
    }
    fabricated, test_rows = _report_samples(model_path, test) if p.epsilon is not None else ({}, {})
    write_report(out, metrics, plots=cfg.report.plots, fabricated=fabricated, test_rows=test_rows,
                 d_train=d_train, d_test=d_test)
    return metrics
