"""Federated pipeline (ALGORITHM.md §12) on Dask: one Zarr store, one training run and one
model store per site; prediction by the minimum-distance combination of the sites' answers.

A run is a **simulation** that starts from one pooled data set (the ``data`` section of an
ordinary pipeline file), splits its training rows into sites (``federation`` section,
:func:`kahm_dask.federated.split_sites`) and then keeps every site apart::

    <output>/data/{train,test}.zarr          pooled input (scaled as in the centralised run)
    <output>/sites.json                      the split: spec, rows and classes per site
    <output>/sites/site{q}/train.zarr        site q's private rows
    <output>/sites/site{q}/work/             site q's private work store (noise, grouping)
    <output>/sites/site{q}/model.zarr        site q's model store (DP rows + models only)
    <output>/sites/site{q}/answers/*.zarr    site q's answers (ρ_q, ĉ_q): all it releases
    <output>/predictions.zarr                global decision: class code, min distance, site
    <output>/report.{json,md}

Each site is trained with :func:`~kahm_dask.pipeline.train.train_pipeline`: with an explicit
``seed`` (experiments), site q uses ``site_seed(seed, q)``; with ``seed: null`` (the default)
each site draws its own secret seed, kept in its work store. Reports never show the seed of a
DP run. With ``federation.pin_sites: true`` every task of site q (training
and its answers) carries the worker resource ``site{q}`` (``dask.annotate``), so it runs only
on workers that advertise it; :func:`connect_federated` starts such a local cluster
(:func:`site_cluster`: worker ``q mod n_workers`` holds site q).

Prediction: per site, the lazy per-class distances of
:func:`~kahm_dask.pipeline.predict.class_distance_array` are reduced on the site's workers to
``(ρ_q, ĉ_q)`` (min and argmin over the site's classes) and written to the site's answer
store; the global decision is a lazy blockwise :func:`kahm_dask.federated.combine` over the Q
answer stores. No per-class distance leaves a site or reaches the client. Each site answers
in its own graph because ``class_distance_array`` names its layers ``kahm-dist-c{c}-s{s}``
whatever the model store: two sites' layers in one graph would share keys.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import dask
import dask.array as da
import numpy as np
import zarr
from distributed import Client, Nanny, Scheduler, SpecCluster, Worker
from threadpoolctl import threadpool_limits

from kahm_dask.federated import (
    FederatedDecision,
    SiteAnswer,
    combine,
    label_heterogeneity,
    site_seed,
    split_sites,
)
from kahm_dask.pipeline.cluster import BLAS_ENV, SingleThreadedBLAS, connect
from kahm_dask.pipeline.config import (
    PipelineConfig,
    Section,
    _set_dotted,
    bound,
    invalid_value,
    load_yaml,
)
from kahm_dask.pipeline.data import prepare_stores
from kahm_dask.pipeline.modelstore import read_manifest
from kahm_dask.pipeline.predict import class_distance_array
from kahm_dask.pipeline.run import settings_fields, settings_from_config
from kahm_dask.pipeline.store import DatasetStore, open_dataset, write_dataset
from kahm_dask.pipeline.train import TrainSettings, train_pipeline
from kahm_dask.privacy.membership import (
    membership_attack_from_distances,
    membership_inference_from_distances,
    training_row_subset,
)
from kahm_dask.report import write_report

__all__ = [
    "FederationConfig",
    "FederatedPipelineConfig",
    "load_federated_config",
    "site_resource",
    "site_cluster",
    "connect_federated",
    "check_site_resources",
    "site_dir",
    "write_site_stores",
    "train_site",
    "site_answer_arrays",
    "answer_to_store",
    "federated_decision_arrays",
    "federated_predict",
    "run_federated_pipeline",
]

log = logging.getLogger("kahm_dask")

SplitScheme = Literal["iid", "per_class", "label_skew", "dirichlet"]
# array names of the answer stores and of predictions.zarr (a FederatedDecision)
LABEL, MIN_DISTANCE, SITE = "label", "min_distance", "site"


# --------------------------------------------------------------------------- config


@dataclass(frozen=True, kw_only=True)
class FederationConfig(Section):
    """``federation``: how the training rows are split into sites (§12).

    ``classes_per_site`` goes with ``split: label_skew`` and ``alpha`` with ``dirichlet``
    (both null otherwise); ``split_seed`` seeds the split; ``pin_sites`` runs site q's tasks
    only on workers with the resource ``site{q}``.
    """

    _key: ClassVar[str] = "federation"
    sites: int = field(metadata=bound(ge=1))
    split: SplitScheme = "iid"
    classes_per_site: int | None = field(default=None, metadata=bound(ge=1))
    alpha: float | None = field(default=None, metadata=bound(gt=0))
    split_seed: int = field(default=0, metadata=bound(ge=0))
    pin_sites: bool = False

    def _validate(self) -> None:
        for name, owner in (("classes_per_site", "label_skew"), ("alpha", "dirichlet")):
            value, key = getattr(self, name), f"federation.{name}"
            if self.split == owner and value is None:
                raise invalid_value(key, f"split '{owner}' needs it", value)
            if self.split != owner and value is not None:
                reason = f"only used with split '{owner}' (split is '{self.split}')"
                raise invalid_value(key, reason, value)


@dataclass(frozen=True, kw_only=True)
class FederatedPipelineConfig(PipelineConfig):
    """A pipeline file with a ``federation`` section; every other key as in
    :class:`~kahm_dask.pipeline.config.PipelineConfig` (same strict validation)."""

    federation: FederationConfig

    def with_overrides(self, **dotted: Any) -> FederatedPipelineConfig:
        """A validated copy with dotted keys replaced (see ``PipelineConfig.with_overrides``)."""
        d = self.to_dict()
        for key, value in dotted.items():
            _set_dotted(d, key, value)
        return FederatedPipelineConfig.from_dict(d, base_dir=Path.cwd(), origin="the overrides")


def load_federated_config(path: str | Path) -> FederatedPipelineConfig:
    """Load and strictly validate a federated pipeline YAML file (``pipelines/federated_*``)."""
    return FederatedPipelineConfig.from_dict(
        load_yaml(path), base_dir=Path(path).absolute().parent, origin=str(path)
    )


# --------------------------------------------------------------------------- cluster


def site_resource(q: int) -> str:
    """Name of the worker resource that marks the workers of site q."""
    return f"site{q}"


def site_cluster(
    n_workers: int,
    n_sites: int,
    *,
    threads_per_worker: int = 1,
    memory_limit: str = "auto",
    processes: bool = True,
) -> SpecCluster:
    """A local cluster whose worker ``w`` advertises ``site{q}: 1`` for every q ≡ w (mod
    n_workers); one BLAS thread per Dask thread as in :mod:`kahm_dask.pipeline.cluster`."""
    worker_cls = Nanny if processes else Worker
    workers = {
        f"worker{w}": {
            "cls": worker_cls,
            "options": {
                "nthreads": threads_per_worker,
                "memory_limit": memory_limit,
                "resources": {site_resource(q): 1 for q in range(w, n_sites, n_workers)},
            },
        }
        for w in range(n_workers)
    }
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": ":0"}}
    environ = {**dask.config.get("distributed.nanny.pre-spawn-environ"), **BLAS_ENV}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
        return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=logging.WARNING)


@contextmanager
def connect_federated(cfg: FederatedPipelineConfig) -> Iterator[Client]:
    """A client for a federated run; everything is closed on exit.

    With ``federation.pin_sites`` and no ``cluster.scheduler``/``cluster.config``, a
    :func:`site_cluster` of ``cluster.n_workers`` workers; otherwise
    :func:`~kahm_dask.pipeline.cluster.connect` (whose workers must then advertise the site
    resources themselves, e.g. ``dask worker ADDR --resources site0=1``).
    """
    c, fed = cfg.cluster, cfg.federation
    if not fed.pin_sites or c.scheduler is not None or c.config is not None:
        with connect(c) as client:
            yield client
        return
    with ExitStack() as stack:
        if not c.processes:
            stack.enter_context(threadpool_limits(limits=1, user_api="blas"))
        cluster = stack.enter_context(
            site_cluster(c.n_workers, fed.sites, threads_per_worker=c.threads_per_worker,
                         memory_limit=c.memory_limit, processes=c.processes)
        )
        client = stack.enter_context(Client(cluster))
        if c.processes:
            client.register_plugin(SingleThreadedBLAS())
        log.info("Dask dashboard: %s", client.dashboard_link)
        yield client


def check_site_resources(client: Client, n_sites: int) -> None:
    """Raise ``ValueError`` unless some worker advertises each resource ``site{q}``."""
    workers = client.scheduler_info(n_workers=-1)["workers"].values()
    have = {name for w in workers for name in (w.get("resources") or {})}
    missing = [site_resource(q) for q in range(n_sites) if site_resource(q) not in have]
    if missing:
        raise ValueError(
            f"federation.pin_sites is set but no worker advertises the resource(s) {missing}; "
            "start workers with e.g. `dask worker ADDR --resources site0=1`, or leave "
            "cluster.scheduler and cluster.config unset to get a local site cluster."
        )


@contextmanager
def _pinned(q: int, pin: bool) -> Iterator[None]:
    """Annotate the tasks built inside with the resource of site q (if ``pin``)."""
    if not pin:
        yield
        return
    with dask.annotate(resources={site_resource(q): 1}):
        yield


# --------------------------------------------------------------------------- sites


def site_dir(sites_dir: Path, q: int) -> Path:
    """Directory of site q: its data, work and model stores and its answers."""
    return Path(sites_dir) / f"site{q}"


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


def write_site_stores(
    train: DatasetStore, sites: list[np.ndarray], sites_dir: Path, record: dict, *,
    pin: bool = False,
) -> list[DatasetStore]:
    """Write ``sites_dir/site{q}/train.zarr`` with the pooled training rows ``sites[q]``
    (by site q's workers if ``pin``).

    ``record`` (the split) is kept in ``sites_dir.parent/sites.json``; a rerun reuses the
    stores of the same split (resume) and refuses a directory that holds another split.
    """
    record_path = Path(sites_dir).parent / "sites.json"
    if record_path.exists() and json.loads(record_path.read_text()) != record:
        raise ValueError(
            f"{record_path.parent} holds site stores of a different split; use a new output "
            "directory (or delete it) to run this federation."
        )
    record_path.write_text(json.dumps(record))
    X, labels = train.X(), train.labels()
    stores = []
    for q, rows in enumerate(sites):
        path = site_dir(sites_dir, q) / "train.zarr"
        if path.exists():
            stores.append(open_dataset(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            with _pinned(q, pin):
                stores.append(write_dataset(path, X[rows], labels[rows], source=f"site{q}"))
    return stores


def train_site(
    q: int,
    store: DatasetStore,
    directory: Path,
    settings: TrainSettings,
    client: Client | None,
    *,
    partition: np.ndarray | None = None,
    pin: bool = False,
    progress: bool = False,
) -> dict:
    """Train site q's model store ``directory/model.zarr`` from its store (work store
    ``directory/work``); with ``pin`` every task carries the resource ``site{q}``."""
    directory = Path(directory)
    with _pinned(q, pin):
        return train_pipeline(store, directory / "model.zarr", directory / "work", settings,
                              client, partition=partition, progress=progress)


# --------------------------------------------------------------------------- prediction


def _global_codes(local: np.ndarray, table: np.ndarray) -> np.ndarray:
    return table[local]


def site_answer_arrays(
    model_path: Path, X: da.Array, classes: Sequence[Any]
) -> tuple[da.Array, da.Array]:
    """Lazy ``(ρ_q, ĉ_q)`` of one site for the rows of X (m, p): min and argmin over the
    site's classes of its (m, C_q) class distances; both (m,), ĉ_q as a code into
    ``classes`` (the pooled class labels)."""
    site_classes = read_manifest(model_path)["classes"]
    index = {label: code for code, label in enumerate(classes)}
    table = np.array([index[label] for label in site_classes], dtype=np.int64)
    D = class_distance_array(model_path, X)  # (m, C_q), never leaves the site's workers
    return D.min(axis=1), D.argmin(axis=1).map_blocks(_global_codes, table, dtype=np.int64,
                                                      meta=np.empty((0,), np.int64))


def _compute(job: Any, client: Client | None) -> None:
    if client is None:
        dask.compute(job)
    else:
        client.gather(client.compute(job, retries=2))


def _store_arrays(arrays: dict[str, da.Array], path: Path, client: Client | None) -> zarr.Group:
    """Write (m,) dask arrays into a new Zarr group at ``path`` (one task per row chunk)."""
    group = zarr.open_group(str(path), mode="w", zarr_format=3)
    targets = [
        group.create_array(name, shape=a.shape, dtype=a.dtype, chunks=(a.chunks[0][0],))
        for name, a in arrays.items()
    ]
    _compute(da.store(list(arrays.values()), targets, lock=False, compute=False), client)
    return group


def answer_to_store(
    q: int, model_path: Path, X: da.Array, classes: Sequence[Any], path: Path,
    client: Client | None, *, pin: bool = False,
) -> Path:
    """Site q answers the queries X (m, p): ``(ρ_q, ĉ_q)`` into the Zarr group ``path``
    (arrays ``min_distance`` and ``label``), its only output (§12). With ``pin`` all of it
    runs on the workers with resource ``site{q}``. One graph per site: the model stores of
    all sites name their layers alike (``kahm-dist-c{c}-s{s}``)."""
    with _pinned(q, pin):
        rho, code = site_answer_arrays(model_path, X, classes)
        _store_arrays({MIN_DISTANCE: rho, LABEL: code}, path, client)
    return Path(path)


def _decision_block(rho: np.ndarray, code: np.ndarray, part: str) -> np.ndarray:
    """One field of :func:`kahm_dask.federated.combine` on a block of (Q, m_b) answers."""
    answers = [SiteAnswer(r, c) for r, c in zip(rho, code)]
    return getattr(combine(answers), part)


def federated_decision_arrays(answer_paths: Sequence[Path]) -> FederatedDecision:
    """Lazy global decision from the sites' answer stores (in site order): a
    :class:`FederatedDecision` of three (m,) dask arrays (class code, min distance, site)."""
    rho = da.stack([da.from_zarr(str(p), component=MIN_DISTANCE) for p in answer_paths])
    code = da.stack([da.from_zarr(str(p), component=LABEL) for p in answer_paths])
    rho, code = rho.rechunk({0: -1}), code.rechunk({0: -1})  # (Q, m), all sites per block
    dtypes = {"label": np.int64, "min_distance": np.float64, "site": np.int64}
    parts = {
        part: da.map_blocks(_decision_block, rho, code, part, drop_axis=0, dtype=dtype, meta=np.empty((0,), dtype))
        for part, dtype in dtypes.items()
    }
    return FederatedDecision(**parts)


def federated_predict(
    model_paths: Sequence[Path], X: da.Array, classes: Sequence[Any], name: str,
    client: Client | None, *, pin: bool = False,
) -> FederatedDecision:
    """Every site answers X (m, p) into ``<site>/answers/<name>.zarr``; returns the lazy
    global decision over those answers (codes into ``classes``)."""
    paths = [
        answer_to_store(q, path, X, classes, Path(path).parent / "answers" / f"{name}.zarr",
                        client, pin=pin)
        for q, path in enumerate(model_paths)
    ]
    return federated_decision_arrays(paths)


# --------------------------------------------------------------------------- run


def _evaluate(
    cfg: FederatedPipelineConfig, model_paths: list[Path], train: DatasetStore,
    test: DatasetStore, decision: zarr.Group, client: Client | None,
) -> tuple[dict, np.ndarray | None, np.ndarray | None]:
    """Accuracy and §8 metrics of the federated classifier (original training rows vs test)."""
    classes = np.asarray(decision.attrs["classes"], dtype=object)
    pred = classes[decision[LABEL][...]]
    metrics = {
        "accuracy": float(np.mean(pred.astype(str) == test.labels().astype(str))),
        "site_wins": np.bincount(decision[SITE][...], minlength=len(model_paths)).tolist(),
    }
    if not cfg.evaluate.membership:
        return metrics, None, None
    d_test = decision[MIN_DISTANCE][...]
    seed = cfg.data.split_seed  # public, as in the centralised run (the DP seed is secret)
    rows = training_row_subset(train.n_samples, cfg.evaluate.max_train_rows, random_state=seed)
    d_train = federated_predict(
        model_paths, train.X()[rows], train.classes, "train", client, pin=cfg.federation.pin_sites
    ).min_distance.compute()
    mia = membership_inference_from_distances(d_train, d_test, random_state=seed)
    attack = membership_attack_from_distances(d_train, d_test)
    metrics.update(
        mis=mia.mis, mis_norm=mia.mis_norm, median_distance=mia.median_distance,
        n_train_used=mia.n_train_used, n_infinite=mia.n_infinite,
        attack_auc=attack.auc, attack_advantage=attack.advantage,
        attack_tpr_at_1pct_fpr=attack.tpr_at_1pct_fpr,
        attack_tpr_at_0_1pct_fpr=attack.tpr_at_0_1pct_fpr,
    )
    return metrics, d_train, d_test


def run_federated_pipeline(
    cfg: FederatedPipelineConfig,
    client: Client | None,
    *,
    progress: bool = True,
    site_partitions: Sequence[np.ndarray | None] | None = None,
) -> dict:
    """Run a federated pipeline config on ``client``; returns the metrics of report.json.

    ``site_partitions`` : optional per-site (N_q,) within-class branch labels (rows in the
    order of the site store) that replace the dask-ml k-means (to compare with the in-memory
    :class:`~kahm_dask.federated.FederatedClassifier` given the same labels).
    """
    fed = cfg.federation
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    if site_partitions is not None and len(site_partitions) != fed.sites:
        raise ValueError(f"got {len(site_partitions)} site partitions for {fed.sites} sites.")
    if fed.pin_sites:
        check_site_resources(client, fed.sites)
    t0 = time.perf_counter()
    train, test = prepare_stores(cfg, out)
    labels = train.labels()
    sites = split_sites(labels, fed.sites, fed.split, classes_per_site=fed.classes_per_site,
                        alpha=fed.alpha, random_state=fed.split_seed)
    record = _split_record(fed, labels, sites)
    stores = write_site_stores(train, sites, out / "sites", record, pin=fed.pin_sites)
    t_ingest = time.perf_counter() - t0

    base = settings_from_config(cfg)
    summaries, site_seconds = [], []
    t1 = time.perf_counter()
    for q, store in enumerate(stores):
        ts = time.perf_counter()
        seed = None if cfg.seed is None else site_seed(cfg.seed, q)
        settings = dataclasses.replace(base, seed=seed)
        part = None if site_partitions is None else site_partitions[q]
        summaries.append(train_site(q, store, site_dir(out / "sites", q), settings, client,
                                    partition=part, pin=fed.pin_sites, progress=progress))
        site_seconds.append(round(time.perf_counter() - ts, 3))
        log.info("site %d: %d rows, %d clusters", q, store.n_samples, summaries[-1]["n_clusters"])
    fit_s = time.perf_counter() - t1

    model_paths = [site_dir(out / "sites", q) / "model.zarr" for q in range(fed.sites)]
    t2 = time.perf_counter()
    decision = federated_predict(model_paths, test.X(), train.classes, "test", client,
                                 pin=fed.pin_sites)
    arrays = {LABEL: decision.label, MIN_DISTANCE: decision.min_distance, SITE: decision.site}
    group = _store_arrays(arrays, out / "predictions.zarr", client)
    group.attrs["classes"] = list(train.classes)
    predict_s = time.perf_counter() - t2
    metrics, d_train, d_test = _evaluate(cfg, model_paths, train, test, group, client)

    metrics = {
        "name": cfg.name,
        **metrics,
        "fit_seconds": round(fit_s, 3),
        "predict_seconds": round(predict_s, 3),
        "ingest_seconds": round(t_ingest, 3),
        "n_train": train.n_samples,
        "n_test": test.n_samples,
        "n_features": train.n_features,
        "n_sites": fed.sites,
        "split": fed.split,
        "classes_per_site": fed.classes_per_site,
        "alpha": fed.alpha,
        "split_seed": fed.split_seed,
        "pin_sites": fed.pin_sites,
        "label_heterogeneity": record["label_heterogeneity"],
        "site_sizes": record["site_sizes"],
        "site_classes": record["site_classes"],
        "site_fit_seconds": site_seconds,
        "n_clusters": sum(s["n_clusters"] for s in summaries),
        "n_clusters_resumed": sum(s["n_resumed"] for s in summaries),
        **settings_fields(cfg, client),
    }
    write_report(out, metrics, plots=cfg.report.plots, d_train=d_train, d_test=d_test)
    return metrics
