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
membership summary. Membership is evaluated site by site (:func:`site_membership`): site q's
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
in its own graph because ``class_distance_array`` names its layers ``kahm-dist-c{c}-s{s}``
whatever the model store: two sites' layers in one graph would share keys.

Everything a central run does too (connecting, computing, the folder layout, the accuracy and
membership metrics, the privacy statements, the report's metrics) is the central run's code
(:mod:`kahm_dask.pipeline.cluster`, :mod:`kahm_dask.pipeline.runs.central`); this module adds the
split, the per-site training, the combination of the sites' answers and the site-local
membership evaluation. Its files (``sites.json``, the answer stores, ``predictions.zarr``,
``membership.json``, the report) are written atomically: a reader sees the old file or the
new one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import zarr
from distributed import Client

from kahm_dask.federated import (
    FederatedDecision,
    SiteAnswer,
    combine,
    label_heterogeneity,
    membership_summary,
    site_answer,
    site_noise_seed,
    site_seed,
    split_sites,
)
from kahm_dask.pipeline.cluster import compute
from kahm_dask.pipeline.cluster.progress import Progress, as_progress
from kahm_dask.pipeline.cluster.sites import check_site_resources, pinned
from kahm_dask.pipeline.config.sections import FederatedPipelineConfig, FederationConfig
from kahm_dask.pipeline.predict import class_distance_array
from kahm_dask.pipeline.runs.central import (
    RunPaths,
    Stopwatch,
    accuracy,
    member_rows,
    membership_metrics,
    report_metrics,
    run_paths,
    settings_from_config,
    write_statement,
)
from kahm_dask.pipeline.runs.data import OWNER, prepare_stores
from kahm_dask.pipeline.runs.report import write_report
from kahm_dask.pipeline.stores.dataset import DatasetStore, open_dataset, write_dataset
from kahm_dask.pipeline.stores.manifest import read_manifest
from kahm_dask.pipeline.training import TrainSettings, train_pipeline
from kahm_dask.storage.atomic import atomic_directory, write_json_atomic, write_text_atomic
from kahm_dask.storage.locks import exclusive
from kahm_dask.storage.private import make_private, private_directory

__all__ = [
    "site_dir",
    "site_paths",
    "write_site_stores",
    "train_site",
    "site_membership",
    "site_answer_arrays",
    "answer_to_store",
    "federated_decision_arrays",
    "federated_predict",
    "run_federated_pipeline",
]

log = logging.getLogger("kahm_dask")

# array names of the answer stores and of predictions.zarr (a FederatedDecision)
LABEL, MIN_DISTANCE, SITE = "label", "min_distance", "site"


# --------------------------------------------------------------------------- sites


def site_dir(sites_dir: Path, q: int) -> Path:
    """Directory of site q: its ``public/`` and ``owner/`` folders and its answers."""
    return Path(sites_dir) / f"site{q}"


def site_paths(sites_dir: Path, q: int, private: bool) -> RunPaths:
    """Site q's folders, split at the release boundary like a central run's
    (``public/model.zarr`` for a DP site; ``owner/data``, ``owner/work``)."""
    return run_paths(site_dir(sites_dir, q), private)


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


@contextmanager
def _outside_the_sites(local: bool) -> Iterator[None]:
    """Run the dask computations inside on local threads of the client process (``local``),
    not on the cluster: no site's worker touches what is computed here."""
    if not local:
        yield
        return
    with dask.config.set(scheduler="threads"):
        yield


def write_site_stores(
    train: DatasetStore, sites: list[np.ndarray], sites_dir: Path, record: dict, *,
    pin: bool = False, record_path: Path | None = None,
) -> list[DatasetStore]:
    """Write site q's private store ``sites_dir/site{q}/owner/data/train.zarr`` with the
    pooled training rows ``sites[q]`` (and the pooled store's public feature range).

    The pooled store stands for rows that are never in one place in a real federation: with
    ``pin`` the split runs in the client process (local threads), so no site's worker reads a
    chunk of the pooled store (which holds other sites' rows). ``record`` (the split) is kept
    in ``record_path`` (default ``sites_dir.parent/owner/sites.json``); a rerun reuses the
    stores of the same split (resume) and refuses a directory that holds another split.
    """
    record_path = Path(record_path or Path(sites_dir).parent / OWNER / "sites.json")
    if record_path.exists() and json.loads(record_path.read_text()) != record:
        raise ValueError(
            f"{record_path.parent.parent} holds site stores of a different split; use a new "
            "output directory (or delete it) to run this federation."
        )
    write_json_atomic(record_path, record)
    fr = train.attrs.get("feature_range")
    feature_range = None if not fr else (fr["min"], fr["max"])
    X, labels = train.X(), train.labels()
    stores = []
    for q, rows in enumerate(sites):
        path = site_paths(sites_dir, q, False).data / "train.zarr"
        if path.exists():
            stores.append(open_dataset(path))
            continue
        private_directory(path.parent)
        with _outside_the_sites(pin):
            stores.append(write_dataset(path, X[rows], labels[rows], source=f"site{q}",
                                        feature_range=feature_range))
    return stores


def train_site(
    q: int,
    store: DatasetStore,
    directory: Path | RunPaths,
    settings: TrainSettings,
    client: Client | None,
    *,
    partition: np.ndarray | None = None,
    pin: bool = False,
    progress: Progress | bool = False,
) -> dict:
    """Train site q's model store from its store; with ``pin`` every task carries the resource
    ``site{q}``. ``directory``: the site's :class:`~kahm_dask.pipeline.runs.central.RunPaths` (model
    store ``public/model.zarr`` for a DP site, work store ``owner/work``), or a plain
    directory (``directory/model.zarr``, ``directory/work``)."""
    if isinstance(directory, RunPaths):
        model, work = directory.model, directory.work
    else:
        model, work = Path(directory) / "model.zarr", Path(directory) / "work"
    with pinned(q, pin):
        return train_pipeline(store, model, work, settings, client, partition=partition,
                              progress=progress)


# --------------------------------------------------------------------------- prediction


def _answer_block(D: np.ndarray, table: np.ndarray, part: str) -> np.ndarray:
    """One field of the site's answer (:func:`kahm_dask.federated.site_answer`) on a block of its
    (m_b, C_q) class distances, its labels as codes into the pooled classes (``table``)."""
    return getattr(site_answer(D, table), part)


def site_answer_arrays(
    model_path: Path, X: da.Array, classes: Sequence[Any], *, n_probe: int | None = None,
    eval_dtype: str = "float64",
) -> tuple[da.Array, da.Array]:
    """Lazy ``(ρ_q, ĉ_q)`` of one site for the rows of X (m, p): min and argmin over the
    site's classes of its (m, C_q) class distances (routed with ``n_probe``,
    docs/algorithm.md#routing; kernel blocks in ``eval_dtype``,
    docs/algorithm.md#evaluation-precision); both (m,), ĉ_q as a code into ``classes`` (the
    pooled class labels)."""
    site_classes = read_manifest(model_path)["classes"]
    index = {label: code for code, label in enumerate(classes)}
    table = np.array([index[label] for label in site_classes], dtype=np.int64)
    D = class_distance_array(model_path, X, n_probe=n_probe, eval_dtype=eval_dtype)  # (m, C_q), stays at the site
    D = D.rechunk({1: -1})  # all of the site's classes in each block
    parts = {"min_distance": np.float64, "label": np.int64}
    rho, code = (da.map_blocks(_answer_block, D, table, part, drop_axis=1, dtype=dtype, meta=np.empty((0,), dtype))
                 for part, dtype in parts.items())
    return rho, code


def _store_arrays(
    arrays: dict[str, da.Array], path: Path, client: Client | None, attrs: dict | None = None
) -> None:
    """Write (m,) dask arrays (one task per row chunk) and the attributes ``attrs`` into a new
    Zarr group that replaces ``path`` atomically once complete."""
    with atomic_directory(path) as tmp:
        group = zarr.open_group(str(tmp), mode="w", zarr_format=3)
        targets = [
            group.create_array(name, shape=a.shape, dtype=a.dtype, chunks=(a.chunks[0][0],))
            for name, a in arrays.items()
        ]
        compute(da.store(list(arrays.values()), targets, lock=False, compute=False), client)
        if attrs:
            group.attrs.update(attrs)


def answer_to_store(
    q: int, model_path: Path, X: da.Array, classes: Sequence[Any], path: Path,
    client: Client | None, *, pin: bool = False, n_probe: int | None = None, eval_dtype: str = "float64",
) -> Path:
    """Site q answers the queries X (m, p): ``(ρ_q, ĉ_q)`` into the Zarr group ``path``
    (arrays ``min_distance`` and ``label``), its only output. With ``pin`` all of it runs on
    the workers with resource ``site{q}``. One graph per site: the model stores of all sites
    name their layers alike (``kahm-dist-c{c}-s{s}``). X are queries (the coordinator's test
    rows), sent to every site: never pass a site's training rows here."""
    with pinned(q, pin):
        rho, code = site_answer_arrays(model_path, X, classes, n_probe=n_probe, eval_dtype=eval_dtype)
        _store_arrays({MIN_DISTANCE: rho, LABEL: code}, path, client)
    return Path(path)


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


def answer_path(model_path: Path, name: str) -> Path:
    """Where site q (model store ``model_path``) keeps its answers to the queries ``name``:
    ``sites/site{q}/answers/<name>.zarr``, beside its ``public/`` and ``owner/`` folders."""
    return Path(model_path).parent.parent / "answers" / f"{name}.zarr"


def federated_predict(
    model_paths: Sequence[Path], X: da.Array, classes: Sequence[Any], name: str,
    client: Client | None, *, pin: bool = False, n_probe: int | None = None, eval_dtype: str = "float64",
) -> FederatedDecision:
    """Every site answers the queries X (m, p) into :func:`answer_path` (``n_probe`` and
    ``eval_dtype`` as in :func:`site_answer_arrays`); returns the lazy global decision over
    those answers (codes into ``classes``)."""
    paths = [
        answer_to_store(q, path, X, classes, answer_path(path, name), client, pin=pin, n_probe=n_probe,
                        eval_dtype=eval_dtype)
        for q, path in enumerate(model_paths)
    ]
    return federated_decision_arrays(paths)


# --------------------------------------------------------------------------- membership


def _site_membership_task(d_train: np.ndarray, d_test: np.ndarray, seed: int, path: str) -> dict:
    """At the site: the membership report from its members' and the queries' distances,
    written to the site's owner folder; returns only the summary fields."""
    fields = membership_metrics(d_train, d_test, seed)
    write_json_atomic(path, {**fields, "n_test": int(np.size(d_test))}, indent=2, default=float)
    return fields


def site_membership(
    q: int, store: DatasetStore, model_path: Path, test_answers: Path, out_path: Path,
    client: Client | None, *, max_train_rows: int | None = None, seed: int = 0,
    pin: bool = False, n_probe: int | None = None, eval_dtype: str = "float64",
) -> dict:
    """Site q's membership report, computed at site q: its model's distances ρ_q of its own
    training rows (``store``; a seeded subset of ``max_train_rows``; computed as the answers,
    with ``n_probe`` and ``eval_dtype``) against its answers to
    the shared queries (``test_answers``), written to ``out_path`` (site q's owner folder).

    Returns only the summary fields (:func:`~kahm_dask.pipeline.runs.central.membership_metrics`). With
    ``pin`` every task (reading the rows, the distances, the metrics) runs on site q's
    workers; the member distances never leave them. Equal to
    :func:`kahm_dask.federated.site_membership_evaluation` with ``random_state=seed``.
    """
    with pinned(q, pin):
        X = member_rows(store, max_train_rows, seed)  # built here: reads carry site q's resource
        d_train = class_distance_array(model_path, X, n_probe=n_probe, eval_dtype=eval_dtype).min(axis=1)
        d_test = da.from_zarr(str(test_answers), component=MIN_DISTANCE)
        job = dask.delayed(_site_membership_task, pure=False)(d_train, d_test, seed, str(out_path))
        return compute(job, client)


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
    root = Path(cfg.output)
    with exclusive(root, "the run folder"):
        try:
            return _run_federated(cfg, client, as_progress(progress), site_partitions, insecure_noise_seed)
        finally:
            sites = root / "sites"
            for private in (root / OWNER, *sites.glob("site*/owner"), *sites.glob("site*/answers")):
                make_private(private)


def _run_federated(
    cfg: FederatedPipelineConfig, client: Client | None, progress: Progress,
    site_partitions: Sequence[np.ndarray | None] | None, insecure_noise_seed: int | None,
) -> dict:
    fed = cfg.federation
    private = cfg.privacy.epsilon is not None
    paths = run_paths(cfg.output, False)  # the coordinator's folders: nothing is published
    paths.make_dirs()
    if site_partitions is not None and len(site_partitions) != fed.sites:
        raise ValueError(f"got {len(site_partitions)} site partitions for {fed.sites} sites.")
    if fed.pin_sites:
        check_site_resources(client, fed.sites)
    clock = Stopwatch()
    with clock.stage("ingest"), progress.stage(f"ingest and split into {fed.sites} sites (private stores)"):
        with _outside_the_sites(fed.pin_sites):
            train, test = prepare_stores(cfg, paths.root)
        labels = train.labels()
        sites = split_sites(labels, fed.sites, fed.split, classes_per_site=fed.classes_per_site,
                            alpha=fed.alpha, random_state=fed.split_seed)
        record = _split_record(fed, labels, sites)
        stores = write_site_stores(train, sites, paths.root / "sites", record, pin=fed.pin_sites)

    folders = [site_paths(paths.root / "sites", q, private) for q in range(fed.sites)]
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
        decision = federated_predict(model_paths, test.X(), train.classes, "test", client,
                                     pin=fed.pin_sites, n_probe=cfg.model.n_probe,
                                     eval_dtype=cfg.model.eval_dtype)
        arrays = {LABEL: decision.label, MIN_DISTANCE: decision.min_distance, SITE: decision.site}
        _store_arrays(arrays, paths.predictions, client, {"classes": list(train.classes)})
    group = zarr.open_group(str(paths.predictions), mode="r")
    quality = {
        "accuracy": accuracy(group, LABEL, test),
        "site_wins": np.bincount(group[SITE][...], minlength=fed.sites).tolist(),
    }
    if cfg.evaluate.membership:
        with progress.stage("membership metrics, site by site (owner only)"):
            per_site = [
                site_membership(q, store, model_paths[q], answer_path(model_paths[q], "test"),
                                folders[q].owner / "membership.json", client,
                                max_train_rows=cfg.evaluate.max_train_rows,
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
    write_text_atomic(paths.owner / "report.md", text + _folders_markdown(paths.root, private))
    return metrics


def _folders_markdown(out: Path, private: bool) -> str:
    """The report's section on which folder of a federated run is which."""
    model = "public/model.zarr" if private else "owner/model.zarr"
    lines = [
        "",
        "## Folders",
        "",
        f"- `sites/site{{q}}/public/` ({out / 'sites'}): "
        + ("**may be published**: site q's DP model store `model.zarr` and its `PRIVACY.md`."
           if private else "absent: a non-private site's model store is fitted on private "
           f"rows and stays in `sites/site{{q}}/{model}`."),
        "- `sites/site{q}/owner/`: **stays at site q**: its private rows (`data/`, with its "
        "privacy ledger), its work store (`work/`: the noisy rows, private copies) and its "
        "membership report (`membership.json`, computed on its own training rows only).",
        "- `sites/site{q}/answers/`: site q's answers (ρ_q, ĉ_q) to the coordinator's queries "
        "(the test rows): what crosses the site boundary, as private as the queries.",
        f"- `owner/` ({out / OWNER}): the coordinator's and the simulation's: the pooled input "
        "(`data/`, which in a real federation never exists in one place), the split "
        "(`sites.json`), the global decision (`predictions.zarr`) and this report. The "
        "membership figures above are combined from the sites' summaries only.",
        "",
    ]
    return "\n".join(lines)
