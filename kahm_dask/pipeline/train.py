"""Build and run the training graph (docs/design.md explains the cuts).

Stages, all on Zarr-backed dask arrays (the data set is never loaded whole):

1. DP release blockwise (:class:`~kahm_dask.privacy.noise.GridLaplace`: clip to the public
   bounds, exact discrete Laplace noise on a public grid, noise from the operating system's
   secure generator), written once to the work store (``X_noisy``, in the stored dtype) with a
   completion marker and a random ``noise_id``. A rerun reuses a complete ``X_noisy`` (the
   noise is never drawn twice for one run); an incomplete one is rewritten with fresh noise and
   a new id. Each release is recorded once in the privacy ledger beside the data store
   (:func:`~kahm_dask.privacy.ledger.ledger_path`), which refuses a release beyond its budget
   before any noise is drawn.
2. A class-grouped copy of X_noisy (and of X where a setting reads the private rows)
   (:mod:`~kahm_dask.pipeline.layout`), so each class is one contiguous slice.
3. Per-class k-means (``child(root, 1, c)`` of the public ``seed``) on the noisy rows (or, with
   ``cluster_on="original"``, which leaks, the private ones): in one task with the estimator's
   own k-means when the class fits ``kmeans_persist_fraction`` of a worker's memory, else out
   of core (k-means|| centres, then dask-ml's Lloyd iterations), the class held in worker
   memory while it fits that fraction of the workers' memory
   (:func:`~kahm_dask.pipeline.partition.partition_classes`).
4. A cluster-grouped copy, built from the class-grouped one: rows ordered by (class, cluster),
   original order within a cluster, so each task reads one contiguous slice.
5. One task per (class, cluster) (:func:`~kahm_dask.pipeline.tasks.train_cluster`); finished
   clusters are skipped on a rerun (resume).

The work store holds private data (X copies, cluster labels, the noisy rows before
fabrication): it lives with the data store, on the data owner's side; the model store holds
only DP rows and models fitted on them, and nothing else computed from private rows.

Both may be local paths or URLs (``s3://``, …) with fsspec ``storage_options``
(:mod:`kahm_dask.pipeline.location`); the tasks get the URL and the options. A remote model
store gets its completion marker when every cluster is written
(:func:`~kahm_dask.pipeline.modelstore.mark_model_complete`).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import dask
import dask.array as da
import numpy as np
import zarr

from kahm_dask import __version__
from kahm_dask._random import child_seed_sequence
from kahm_dask._validation import check_class_sizes, check_n_components
from kahm_dask.classifier import PARTITION_STREAM
from kahm_dask.partition import KMEANS_DIMS
from kahm_dask.pipeline.cluster import compute
from kahm_dask.pipeline.data import store_bounds
from kahm_dask.pipeline.layout import class_layout, grouped_layout, write_grouped
from kahm_dask.pipeline.location import COMPLETE_FILE, Location, LocationLike, as_location
from kahm_dask.pipeline.modelstore import mark_model_complete, write_manifest
from kahm_dask.pipeline.partition import partition_classes
from kahm_dask.pipeline.store import DatasetStore, StoreError, is_complete, mark_complete
from kahm_dask.pipeline.tasks import GROUPED_X, GROUPED_X_NOISY, train_cluster
from kahm_dask.privacy.bounds import BOUNDS_PRIVATE, BOUNDS_PUBLIC, public_bounds
from kahm_dask.privacy.ledger import PrivacyLedger, ledger_path
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import NoiseSource, as_noise_source
from kahm_dask.privacy.statement import plan_release
from kahm_dask.recipe import TrainParams

log = logging.getLogger("kahm_dask")

__all__ = ["TrainSettings", "noisy_array", "release_bounds", "train_pipeline", "NOISY", "SEED_FILE"]

#: The work store's noisy rows (written once per run, with a completion marker).
NOISY = "X_noisy"
#: The run's k-means seed when none is given (public; kept so that a resume repeats it).
SEED_FILE = "kmeans_seed.json"


@dataclass(frozen=True)
class TrainSettings:
    """Run-level settings on top of the per-task :class:`TrainParams`.

    ``seed`` seeds the k-means steps only (not private; None: drawn once per work store and
    kept there). ``bounds`` = ``(lower, upper)``, the bounds of the features the DP release
    clips to (scalars or (p,) arrays, broadcast to the store's features at release time), with
    ``bounds_source`` (:data:`~kahm_dask.privacy.bounds.BOUNDS_PUBLIC`, the
    default when bounds are given, or ``BOUNDS_PRIVATE``). Without bounds a DP run uses the
    store's public ``feature_range`` attribute, else each feature's min/max of the store
    (private: warns). ``d`` None = the bound width. ``budget`` = (ε, δ) of the privacy ledger.
    ``insecure_noise_seed``: tests only, fixes the noise and voids the guarantee.
    """

    params: TrainParams
    seed: int | None = None
    delta: float = 0.0
    d: float | None = None
    bounds: tuple | None = field(default=None, compare=False)
    bounds_source: str | None = None
    block_size: int = 1000
    s_rule: str = "round"
    min_cluster_size: int | None = None
    cluster_on: str = "noisy"
    n_init: int = 1
    kmeans_dims: int | None = KMEANS_DIMS
    oversampling_factor: float | None = None
    init_max_iter: int = 5
    kmeans_max_iter: int = 100
    max_cluster_rows: int | None = None
    kmeans_persist_fraction: float = 0.25
    budget: tuple[float, float] | None = None
    insecure_noise_seed: int | None = None

    @property
    def needs_private_rows(self) -> bool:
        """True when a stage after the noise reads the private rows (the k-means with
        ``cluster_on="original"``, the paper's private r, or a non-private run)."""
        p = self.params
        if not p.private:
            return True
        return self.cluster_on == "original" or (p.dp_data == "fabricated" and p.r_source == "private")


def _kmeans_seed(seed: int | None, work_path: LocationLike) -> int:
    """The run's k-means seed: ``seed``, else one drawn at the first run and kept in the work
    store (it seeds only k-means on DP or public rows; the noise never depends on it)."""
    if seed is not None:
        return int(seed)
    path = as_location(work_path) / SEED_FILE
    try:
        return int(path.read_json()["seed"])
    except (FileNotFoundError, KeyError, ValueError, TypeError):
        pass
    value = int(np.random.SeedSequence().entropy) % 2**63
    path.write_json({"seed": value, "note": "k-means seed; not secret"})
    return value


def release_bounds(settings: TrainSettings, store: DatasetStore) -> tuple[np.ndarray, np.ndarray, str]:
    """``(lower, upper, source)`` of a DP release from ``store``: the settings' bounds, else the
    store's public ``feature_range``, else each feature's private min/max (warns)."""
    p = store.n_features
    if settings.bounds is not None:
        lower, upper = public_bounds(settings.bounds, p)
        return lower, upper, settings.bounds_source or BOUNDS_PUBLIC
    fr = store.attrs.get("feature_range")
    if fr:
        return (*public_bounds((fr["min"], fr["max"]), p), BOUNDS_PUBLIC)
    return (*store_bounds(store), BOUNDS_PRIVATE)


def noisy_array(X: da.Array, mechanism: GridLaplace, source: NoiseSource, dtype=None) -> da.Array:
    """The DP release of X blockwise, in ``dtype`` (default: X's float dtype).

    Each block is released with its global row offset (a test-only seeded source then gives
    the same noise whatever the chunking); memory per block is the block in and out plus the
    mechanism's bounded working set (:data:`~kahm_dask.privacy.noise.ENTRIES_PER_STEP`).
    """
    dtype = np.dtype(dtype or (X.dtype if np.issubdtype(X.dtype, np.floating) else np.float64))
    X = X.rechunk({1: -1})

    def block(x: np.ndarray, block_info=None) -> np.ndarray:
        start = block_info[0]["array-location"][0][0]
        return mechanism.release(x, source, row_offset=start, dtype=dtype)

    return X.map_blocks(block, dtype=dtype, meta=np.empty((0, 0), dtype))


def _noisy_rows(
    X: da.Array,
    mechanism: GridLaplace,
    settings: TrainSettings,
    work_path: Location,
    model_path: Location,
    ledger: PrivacyLedger,
    details: dict,
) -> tuple[da.Array, str, bool]:
    """The run's noisy rows ``(X_noisy, noise_id, reused)``: the complete stored ones, or a
    fresh release (budget checked before any noise is drawn; recorded once in the ledger)."""
    path = work_path / NOISY
    marker = {
        "mechanism": json.loads(json.dumps(mechanism.describe())),
        "shape": list(X.shape),
        "dtype": str(X.dtype),
        "insecure_noise_seed": settings.insecure_noise_seed,
    }
    try:
        done = is_complete(path)
    except StoreError:
        done = None
    if done is not None and {k: done.get(k) for k in marker} == marker and done.get("noise_id"):
        noise_id = done["noise_id"]
        ledger.record(mechanism.epsilon, mechanism.delta, release_id=noise_id, **details)  # once
        log.info("noise: reusing the stored noisy rows (noise_id %s)", noise_id)
        return _read_zarr(path), noise_id, True
    _refuse_new_noise_for_trained_store(model_path, work_path)
    ledger.check(mechanism.epsilon, mechanism.delta)
    noise_id = uuid.uuid4().hex
    path.remove()  # incomplete or of other settings: never reused, rewritten with fresh noise
    source = as_noise_source(settings.insecure_noise_seed)
    url, storage_options = path.dask_target()
    noisy_array(X, mechanism, source, X.dtype).to_zarr(url, storage_options=storage_options, overwrite=True,
                                                       zarr_format=3)
    ledger.record(mechanism.epsilon, mechanism.delta, release_id=noise_id, **details)
    mark_complete(path, {**marker, "noise_id": noise_id})
    return _read_zarr(path), noise_id, False


def _read_zarr(path: Location) -> da.Array:
    """The Zarr array at ``path`` as a dask array."""
    url, storage_options = path.dask_target()
    return da.from_zarr(url, storage_options=storage_options)


def _refuse_new_noise_for_trained_store(model_path: Location, work_path: Location) -> None:
    """A model store with clusters was trained on the work store's noisy rows; new noise would
    mix clusters of two releases: refuse before drawing it."""
    if (model_path / "clusters").children():
        raise ValueError(
            f"model store {model_path} has clusters trained on noisy rows that are missing or "
            f"incomplete in {work_path / NOISY} (or were drawn with other settings); new noise "
            "cannot be mixed with them: delete the model store or choose another output directory."
        )


def train_pipeline(
    store: DatasetStore,
    model_path: LocationLike,
    work_path: LocationLike,
    settings: TrainSettings,
    client=None,
    *,
    partition: np.ndarray | None = None,
    progress: bool = True,
    storage_options: Mapping[str, Any] | None = None,
) -> dict:
    """Train every cluster model of ``store`` into ``model_path``; returns a summary dict.

    ``model_path`` and ``work_path`` are local paths or URLs, with fsspec ``storage_options``.
    ``partition`` : optional (N,) within-class cluster labels that replace the dask-ml
    k-means (used to compare with the in-memory classifier given the same labels).
    """
    check_class_sizes(store.class_counts)
    check_n_components(settings.params.n_components, store.n_features, stacklevel=2)
    t0 = time.perf_counter()
    params = settings.params
    model_path, work_path = as_location(model_path, storage_options), as_location(work_path, storage_options)
    if work_path.is_local:
        work_path.path.mkdir(parents=True, exist_ok=True)
    if not model_path.is_local:  # a remote store being (re)trained is incomplete until the end
        (model_path / COMPLETE_FILE).remove()
    seed = _kmeans_seed(settings.seed, work_path)
    root = np.random.SeedSequence(seed)
    X = store.X()  # stored dtype (float32 halves memory and I/O); tasks compute in float64
    y = store.y()
    chunk_rows = X.chunks[0][0]

    X_noisy, privacy, statement = None, None, None
    if params.private:
        lower, upper, bounds_source = release_bounds(settings, store)
        mechanism, statement = plan_release(
            params.epsilon,
            lower,
            upper,
            bounds_source,
            delta=settings.delta,
            d=settings.d,
            dp_data=params.dp_data,
            r_source=params.r_source,
            cluster_on=settings.cluster_on,
            insecure_noise=settings.insecure_noise_seed is not None,
        )
        description = mechanism.describe()
        ledger = PrivacyLedger(ledger_path(store.location), budget=settings.budget)
        details = {
            "what": f"noisy rows ({store.n_samples} x {store.n_features}, unit: one entry) of "
                    f"{store.location.name}, from which the model store's {params.dp_data} DP rows are built",
            "unit": "entry",
            "d": description["d"],
            "bounds": [description["lower"], description["upper"]],
            "bounds_source": bounds_source,
            "mechanism": description,
            "model_store": str(model_path),
        }
        X_noisy, noise_id, reused = _noisy_rows(X, mechanism, settings, work_path, model_path, ledger, details)
        privacy = {
            "release_id": noise_id,
            "noise_reused": reused,
            "statement": statement.to_dict(),
            "ledger": ledger.summary(),
            "ledger_path": str(ledger.path),
        }

    stages = {"noise": time.perf_counter() - t0}
    layout = class_layout(y)
    sources = {"X_noisy": X_noisy}
    if settings.needs_private_rows:
        sources["X"] = X
    by_class = {
        name: write_grouped(source, layout.groups, work_path / f"{name}_by_class", chunk_rows)
        for name, source in sources.items() if source is not None
    }
    stages["class_grouping"] = time.perf_counter() - t0 - sum(stages.values())
    if partition is None:
        cluster_on = "X_noisy" if (params.private and settings.cluster_on == "noisy") else "X"
        labels = np.empty(len(y), dtype=np.int64)
        labels[layout.order] = partition_classes(
            by_class[cluster_on],
            layout.bounds,
            n_components=params.n_components,
            block_size=settings.block_size,
            s_rule=settings.s_rule,
            min_cluster_size=settings.min_cluster_size,
            seed=child_seed_sequence(root, PARTITION_STREAM),
            n_init=settings.n_init,
            kmeans_dims=settings.kmeans_dims,
            task_bytes=_memory_share(settings.kmeans_persist_fraction, client, min),
            oversampling_factor=settings.oversampling_factor,
            init_max_iter=settings.init_max_iter,
            max_iter=settings.kmeans_max_iter,
            max_cluster_rows=settings.max_cluster_rows,
            persist_bytes=_memory_share(settings.kmeans_persist_fraction, client),
        )
    else:
        labels = np.asarray(partition, dtype=np.int64)
    stages["partition"] = time.perf_counter() - t0 - sum(stages.values())
    log.info("partition: %d clusters in %.1f s", len(np.unique(np.c_[y, labels], axis=0)), stages["partition"])
    groups, table = grouped_layout(y, labels)
    position = layout.position  # the cluster groups as rows of the class-grouped copies
    groups = [position[g] for g in groups]
    for name, out in (("X", GROUPED_X), ("X_noisy", GROUPED_X_NOISY)):
        if name in by_class:
            write_grouped(by_class[name], groups, work_path / out, chunk_rows)
    t_prep = time.perf_counter() - t0
    stages["grouping"] = t_prep - sum(stages.values())
    log.info("grouped copy written in %.1f s", stages["grouping"])

    mech = None if statement is None else statement.mechanism
    _check_same_settings(
        model_path,
        work_path,
        {
            "params": params.to_dict(),
            "seed": seed,
            "mechanism": mech,
            "bounds_source": None if statement is None else statement.bounds_source,
            "noise_id": None if privacy is None else privacy["release_id"],
            "block_size": settings.block_size,
            "s_rule": settings.s_rule,
            "min_cluster_size": settings.min_cluster_size,
            "cluster_on": settings.cluster_on,
            "classes": list(store.classes),
            "n_features": store.n_features,
            "clusters": [list(row) for row in table],
        },
    )
    write_manifest(
        model_path,
        {
            "format_version": 1,
            "kahm_dask_version": __version__,
            "classes": list(store.classes),
            "n_features": store.n_features,
            "params": params.to_dict(),
            "seed": seed,  # k-means only; the noise never depends on it
            "seed_streams": {"partition": [PARTITION_STREAM]},
            "block_size": settings.block_size,
            "cluster_on": settings.cluster_on if params.private else None,
            "privacy": None if privacy is None else {
                "release_id": privacy["release_id"],
                "statement": privacy["statement"],
            },
            "clusters": [{"class": c, "cluster": s, "n_rows": b - a} for c, s, a, b in table],
            "versions": _versions(),
        },
    )
    if client is not None:  # the shuffles leave freed memory in the workers' malloc arenas
        client.run(_trim_memory)
    tasks = [
        dask.delayed(train_cluster, pure=True)(work_path, model_path, c, s, a, b, params)
        for c, s, a, b in table
    ]
    infos = compute(tasks, client, progress=progress)
    mark_model_complete(model_path)
    return {
        "n_clusters": len(table),
        "n_resumed": sum(i["resumed"] for i in infos),
        "seed": seed,
        "prepare_seconds": round(t_prep, 3),
        "stage_seconds": {k: round(v, 3) for k, v in stages.items()},
        "train_seconds": round(time.perf_counter() - t0 - t_prep, 3),
        "privacy": privacy,
        "privacy_statement_markdown": None if statement is None else statement.to_markdown(),
        "clusters": infos,
    }


def _trim_memory() -> int:
    """Return freed heap memory of this (worker) process to the OS (glibc ``malloc_trim``;
    a no-op elsewhere), so the training tasks start from the worker's real baseline."""
    try:
        import ctypes

        return int(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return 0


def _memory_share(fraction: float, client, combine=sum) -> int:
    """``fraction`` of the workers' memory limits combined by ``combine`` (``sum``: the memory
    a class's rows may take while held for its k-means; ``min``: what one in-task k-means may
    use), or of the available memory without a client (threads)."""
    if fraction <= 0:
        return 0
    if client is not None:
        limits = [w.get("memory_limit") or 0 for w in client.scheduler_info()["workers"].values()]
        if limits and all(limits):
            return int(fraction * combine(limits))
    import psutil

    return int(fraction * psutil.virtual_memory().available)


def _check_same_settings(model_path: LocationLike, work_path: LocationLike, current: dict) -> None:
    """Refuse to resume into a model store trained with other settings.

    The run's settings (with the noise_id of the noisy rows the clusters were trained on) are
    stored in ``<work>/settings.json``. If the model store already has clusters and the stored settings
    are missing or differ, resuming would mix old clusters with new ones: raise instead.
    """
    path = as_location(work_path) / "settings.json"
    current = json.loads(json.dumps(current))
    if (as_location(model_path) / "clusters").children():
        stored = path.read_json() if path.exists() else None
        if stored != current:
            keys = sorted(k for k in current if stored is None or stored.get(k) != current[k])
            raise ValueError(
                f"model store {model_path} was trained with other settings ({', '.join(keys)}); "
                "delete it or choose another output directory."
            )
    path.write_json(current)


def _versions() -> dict[str, str]:
    import dask_ml
    import distributed
    import scipy
    import sklearn

    return {
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "scikit-learn": sklearn.__version__,
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "dask-ml": dask_ml.__version__,
        "zarr": zarr.__version__,
    }
