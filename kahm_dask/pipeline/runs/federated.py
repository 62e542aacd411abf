"""Federated pipeline (docs/federated.md) on Dask: one data store, one training run and one
model store per site; prediction by the minimum-distance combination of the sites' answers.

A run is a **simulation** that starts from one pooled data set (the ``data`` section of an
ordinary pipeline file), splits its training rows into sites (``federation`` section,
:func:`kahm_dask.federated.split_sites`) and then keeps every site apart. Every site's folder
is split at the release boundary as a central run's is (:class:`~kahm_dask.pipeline.runs.central.RunPaths`)::

    <output>/owner/data/{train,test}.zarr       pooled input of the simulation (the harness's)
    <output>/owner/sites.json                   the split: spec, rows and classes per site
    <output>/owner/predictions.zarr             global decision: class code, min distance, site
    <output>/owner/report.{json,md}             the coordinator's report (per-site summaries)
    <output>/sites/site{q}/owner/data/train.zarr      site q's private rows (+ its privacy ledger)
    <output>/sites/site{q}/owner/work/                site q's private work store (noisy rows, ...)
    <output>/sites/site{q}/owner/membership.json      site q's membership report (its own rows)
    <output>/sites/site{q}/public/model.zarr          site q's DP model store (DP rows + models)
    <output>/sites/site{q}/public/PRIVACY.md          site q's privacy statement and ledger total
    <output>/sites/site{q}/answers/test.zarr          site q's answers (ρ_q, ĉ_q) to the queries

(a non-private site's model store is fitted on private rows and stays in its ``owner/``).

**Site boundary.** With ``federation.pin_sites: true`` every task of site q (training, its
answers, its membership evaluation) carries the worker resource ``site{q}``
(``dask.annotate``), so it runs only on workers that advertise it; :func:`connect_federated`
starts such a local cluster (:func:`site_resources`: worker ``q mod n_workers`` holds site q).
The pooled input and the split into site stores stand for data that, in a real federation,
never exist in one place: with pinning they are prepared in the client process (local threads),
so no site's worker holds another site's rows. What crosses a site's boundary: its answers to
the coordinator's queries (the test rows, sent to every site) and the few scalars of its
membership summary. Membership is evaluated site by site
(:func:`~kahm_dask.pipeline.runs.sites.site_membership`): site q's
model is queried with site q's own training rows only, on site q's workers, and the member
distances stay there.

**Noise.** Each site's DP noise is drawn from the secure source by its own training run
(:func:`~kahm_dask.pipeline.training.train.train_pipeline`) and recorded in its own ledger: no noise is
shared between sites. ``seed`` (when given) seeds only the k-means steps, site q with
``site_seed(seed, q)``. A test may pass ``insecure_noise_seed`` to
:func:`run_federated_pipeline`; site q then draws from ``site_noise_seed(seed, q)``.

Prediction: per site, the lazy per-class distances of
:func:`~kahm_dask.pipeline.predict.class_distance_array` are reduced on the site's workers to
``(ρ_q, ĉ_q)`` (min and argmin over the site's classes) and written to the site's answer
store; the global decision is a lazy blockwise :func:`kahm_dask.federated.combine` over the Q
answer stores. No per-class distance leaves a site or reaches the client. Each site answers
in its own graph because ``class_distance_array`` names its layers ``kahm-home-…``
whatever the model store: two sites' layers in one graph would share keys.

Everything a central run does too (connecting, computing, the folder layout, the accuracy and
membership metrics, the privacy statements, the report's metrics) is the central run's code
(:mod:`kahm_dask.pipeline.cluster`, :mod:`kahm_dask.pipeline.runs.central`), and what happens at
one site (its store, training, answers and membership report) is
:mod:`kahm_dask.pipeline.runs.sites`; this module adds the split and the combination of the
sites' answers. The files (``sites.json``, the answer stores, ``predictions.zarr``,
``membership.json``, the report) are written atomically: a reader sees the old file or the
new one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import zarr
from distributed import Client

from kahm_dask._validation import check_n_classes
from kahm_dask.federated import (
    FederatedDecision,
    SiteAnswer,
    combine,
    label_heterogeneity,
    membership_summary,
    site_noise_seed,
    site_seed,
    split_sites,
)
from kahm_dask.pipeline.cluster.progress import Progress, as_progress
from kahm_dask.pipeline.cluster.sites import check_site_resources, pinned
from kahm_dask.pipeline.config.sections import FederatedPipelineConfig, FederationConfig
from kahm_dask.pipeline.runs.central import (
    Stopwatch,
    accuracy,
    report_metrics,
    settings_from_config,
    write_statement,
)
from kahm_dask.pipeline.runs.data import prepare_stores
from kahm_dask.pipeline.runs.layout import FederationPaths
from kahm_dask.pipeline.runs.report import write_report
from kahm_dask.pipeline.runs.sites import (
    LABEL,
    MIN_DISTANCE,
    SITE,
    answer_to_store,
    outside_the_sites,
    site_membership,
    store_arrays,
    train_site,
    write_site_stores,
)
from kahm_dask.storage.atomic import write_text_atomic
from kahm_dask.storage.locks import exclusive
from kahm_dask.storage.private import make_private

__all__ = ["federated_decision_arrays", "federated_predict", "run_federated_pipeline"]

log = logging.getLogger("kahm_dask")


# --------------------------------------------------------------------------- sites


def _split_record(fed: FederationConfig, labels: np.ndarray, sites: list[np.ndarray]) -> dict:
    """The split of a run as stored in ``sites.json`` (also compared on a rerun)."""
    spec = ("sites", "split", "classes_per_site", "alpha", "split_seed")
    return {
        "split": {k: getattr(fed, k) for k in spec},
        "site_sizes": [int(r.size) for r in sites],
        "site_classes": [np.unique(labels[r]).tolist() for r in sites],
        "label_heterogeneity": label_heterogeneity(labels, sites),
        "rows": [r.tolist() for r in sites],
    }


# --------------------------------------------------------------------------- prediction


def _decision_block(rho: np.ndarray, code: np.ndarray, part: str) -> np.ndarray:
    """One field of :func:`kahm_dask.federated.combine` on a block of (Q, m_b) answers."""
    answers = [SiteAnswer(r, c) for r, c in zip(rho, code, strict=True)]
    return getattr(combine(answers), part)


def federated_decision_arrays(answer_paths: Sequence[Path]) -> FederatedDecision:
    """Lazy global decision from the sites' answer stores (in site order): a
    :class:`FederatedDecision` of three (m,) dask arrays (class code, min distance, site)."""
    rho = da.stack([da.from_zarr(str(p), component=MIN_DISTANCE) for p in answer_paths])
    code = da.stack([da.from_zarr(str(p), component=LABEL) for p in answer_paths])
    rho, code = rho.rechunk({0: -1}), code.rechunk({0: -1})  # (Q, m), all sites per block
    dtypes = {"label": np.int64, "min_distance": np.float64, "site": np.int64}
    parts = {
        part: da.map_blocks(_decision_block, rho, code, part, drop_axis=0, dtype=dtype,
                            meta=np.empty((0,), dtype))
        for part, dtype in dtypes.items()
    }
    return FederatedDecision(**parts)


def federated_predict(
    layout: FederationPaths, n_sites: int, X: da.Array, classes: Sequence[Any], name: str,
    client: Client | None, *, pin: bool = False, n_probe: int | None = None, eval_dtype: str = "float64",
) -> FederatedDecision:
    """Every site of ``layout`` answers the queries X (m, p) into its answer store for ``name``
    (``n_probe`` and ``eval_dtype`` as in
    :func:`~kahm_dask.pipeline.runs.sites.site_answer_arrays`); returns the lazy global decision
    over those answers (codes into ``classes``)."""
    paths = [
        answer_to_store(q, layout.site(q).model, X, classes, layout.answers(q, name), client, pin=pin,
                        n_probe=n_probe, eval_dtype=eval_dtype)
        for q in range(n_sites)
    ]
    return federated_decision_arrays(paths)


# --------------------------------------------------------------------------- membership


# --------------------------------------------------------------------------- run


def run_federated_pipeline(
    cfg: FederatedPipelineConfig,
    client: Client | None,
    *,
    progress: Progress | bool = True,
    site_partitions: Sequence[np.ndarray | None] | None = None,
    insecure_noise_seed: int | None = None,
) -> dict:
    """Run a federated pipeline config on ``client``; returns the metrics of report.json
    (``<output>/owner``).

    ``site_partitions`` : optional per-site (N_q,) within-class branch labels (rows in the
    order of the site store) that replace the dask-ml k-means (to compare with the in-memory
    :class:`~kahm_dask.federated.FederatedClassifier` given the same labels).
    ``insecure_noise_seed`` : tests only (voids the guarantee, warns): site q's noise from
    ``site_noise_seed(insecure_noise_seed, q)``, as :func:`~kahm_dask.federated.fit_sites`.
    The run folder is locked for the run; the coordinator's and every site's ``owner/`` folder
    and the answer stores are private by file mode (0700 / 0600).
    """
    layout = FederationPaths(Path(cfg.output), cfg.privacy.private)
    with exclusive(layout.root, "the run folder"):
        try:
            return _run_federated(cfg, layout, client, as_progress(progress), site_partitions, insecure_noise_seed)
        finally:
            for private in layout.private_folders():
                make_private(private)


def _run_federated(
    cfg: FederatedPipelineConfig, layout: FederationPaths, client: Client | None, progress: Progress,
    site_partitions: Sequence[np.ndarray | None] | None, insecure_noise_seed: int | None,
) -> dict:
    fed = cfg.federation
    private = layout.private
    paths = layout.coordinator  # nothing of the coordinator's is published
    paths.make_dirs()
    if site_partitions is not None and len(site_partitions) != fed.sites:
        raise ValueError(f"got {len(site_partitions)} site partitions for {fed.sites} sites.")
    if fed.pin_sites:
        check_site_resources(client, fed.sites)
    clock = Stopwatch()
    with clock.stage("ingest"), progress.stage(f"ingest and split into {fed.sites} sites (private stores)"):
        with outside_the_sites(fed.pin_sites):
            train, test = prepare_stores(cfg, paths.root)
        check_n_classes(train.classes)  # pooled, before any site spends; a site may hold one class
        labels = train.labels()
        sites = split_sites(labels, fed.sites, fed.split, classes_per_site=fed.classes_per_site,
                            alpha=fed.alpha, random_state=fed.split_seed)
        record = _split_record(fed, labels, sites)
        stores = write_site_stores(train, sites, layout, record, pin=fed.pin_sites)

    folders = [layout.site(q) for q in range(fed.sites)]
    summaries, site_clock = [], Stopwatch()
    with clock.stage("fit"):
        for q, store in enumerate(stores):
            with site_clock.stage(f"site{q}"):
                with pinned(q, fed.pin_sites):  # bounds (if not public) from the site's own rows
                    base = settings_from_config(cfg, store)
                settings = dataclasses.replace(
                    base,
                    seed=None if cfg.seed is None else site_seed(cfg.seed, q),
                    insecure_noise_seed=(None if insecure_noise_seed is None
                                         else site_noise_seed(insecure_noise_seed, q)),
                )
                part = None if site_partitions is None else site_partitions[q]
                progress.note(f"  site {q}: {store.n_samples} training rows")
                summary = train_site(q, store, folders[q], settings, client, partition=part,
                                     pin=fed.pin_sites, progress=progress)
                write_statement(folders[q], summary)
                summaries.append(summary)
                log.info("site %d: %d rows, %d clusters", q, store.n_samples, summary["n_clusters"])

    model_paths = [f.model for f in folders]
    with clock.stage("predict"), progress.stage(f"predict: {fed.sites} sites answer, then combine"):
        decision = federated_predict(layout, fed.sites, test.X(), train.classes, "test", client,
                                     pin=fed.pin_sites, n_probe=cfg.model.n_probe,
                                     eval_dtype=cfg.model.eval_dtype)
        arrays = {LABEL: decision.label, MIN_DISTANCE: decision.min_distance, SITE: decision.site}
        store_arrays(arrays, paths.predictions, client, {"classes": list(train.classes)})
    with clock.stage("evaluate"):
        group = zarr.open_group(str(paths.predictions), mode="r")
        quality = {
            "accuracy": accuracy(group, LABEL, test),
            "site_wins": np.bincount(group[SITE][...], minlength=fed.sites).tolist(),
        }
        if cfg.evaluate.membership:
            with progress.stage("membership metrics, site by site (owner only)"):
                per_site = [
                    site_membership(q, store, model_paths[q], layout.answers(q, "test"), layout.membership(q),
                                    client, max_train_rows=cfg.evaluate.max_train_rows,
                                    seed=cfg.data.split_seed, pin=fed.pin_sites, n_probe=cfg.model.n_probe,
                                    eval_dtype=cfg.model.eval_dtype)
                    for q, store in enumerate(stores)
                ]
            quality.update(membership_summary(per_site))
            quality["site_membership"] = quality.pop("sites")

    metrics = report_metrics(
        cfg, client, quality, clock.seconds, train, test, summaries, seed=cfg.seed,
        fit_details={},
        run_details={
            "n_sites": fed.sites,
            "split": fed.split,
            "classes_per_site": fed.classes_per_site,
            "alpha": fed.alpha,
            "split_seed": fed.split_seed,
            "pin_sites": fed.pin_sites,
            "label_heterogeneity": record["label_heterogeneity"],
            "site_sizes": record["site_sizes"],
            "site_classes": record["site_classes"],
            "site_fit_seconds": [round(t, 3) for t in site_clock.seconds.values()],
        },
        outputs={
            "owner_dir": str(paths.owner),
            "site_public_dirs": [str(f.public) for f in folders] if private else None,
            "site_model_stores": [str(p) for p in model_paths],
            "site_privacy": [s["privacy"] for s in summaries] if private else None,
        },
    )
    text = write_report(paths.owner, metrics, plots=cfg.report.plots)
    write_text_atomic(paths.report_md, text + _folders_markdown(layout))
    return metrics


def _folders_markdown(layout: FederationPaths) -> str:
    """The report's section on which folder of a federated run is which."""
    private = layout.private
    model = "public/model.zarr" if private else "owner/model.zarr"
    lines = [
        "",
        "## Folders",
        "",
        f"- `sites/site{{q}}/public/` ({layout.sites_dir}): "
        + ("**may be published**: site q's DP model store `model.zarr` and its `PRIVACY.md`."
           if private else "absent: a non-private site's model store is fitted on private "
           f"rows and stays in `sites/site{{q}}/{model}`."),
        "- `sites/site{q}/owner/`: **stays at site q**: its private rows (`data/`, with its "
        "privacy ledger), its work store (`work/`: the noisy rows, private copies) and its "
        "membership report (`membership.json`, computed on its own training rows only).",
        "- `sites/site{q}/answers/`: site q's answers (ρ_q, ĉ_q) to the coordinator's queries "
        "(the test rows): what crosses the site boundary, as private as the queries.",
        f"- `owner/` ({layout.coordinator.owner}): the coordinator's and the simulation's: the pooled input "
        "(`data/`, which in a real federation never exists in one place), the split "
        "(`sites.json`), the global decision (`predictions.zarr`) and this report. The "
        "membership figures above are combined from the sites' summaries only.",
        "",
    ]
    return "\n".join(lines)
