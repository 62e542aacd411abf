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
(:mod:`kahm_dask.storage.location`); the tasks get the URL and the options. A remote model
store gets its completion marker when every cluster is written
(:func:`~kahm_dask.pipeline.stores.model.mark_model_complete`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import dask
import dask.array as da
import numpy as np
import zarr

from kahm_dask._random import child_seed_sequence
from kahm_dask._validation import check_class_sizes, check_n_components
from kahm_dask._version import __version__
from kahm_dask.classifier import PARTITION_STREAM
from kahm_dask.partition import KMEANS_DIMS
from kahm_dask.pipeline.cluster import compute
from kahm_dask.pipeline.cluster.progress import Progress, as_progress
from kahm_dask.pipeline.data import store_bounds
from kahm_dask.pipeline.layout import class_layout, grouped_layout, write_grouped
from kahm_dask.pipeline.partition import partition_classes
from kahm_dask.pipeline.stores.dataset import DatasetStore, StoreError, is_complete, mark_complete
from kahm_dask.pipeline.stores.model import cluster_done, mark_model_complete, write_manifest
from kahm_dask.pipeline.tasks import GROUPED_X, GROUPED_X_NOISY, train_cluster
from kahm_dask.privacy.bounds import (
    BOUNDS_PRIVATE,
    BOUNDS_PUBLIC,
    FeatureBounds,
    ResolvedBounds,
    Scaling,
    clipped_share,
    public_bounds,
    warn_if_clipped,
)
from kahm_dask.privacy.fingerprint import DataFingerprint
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import NoiseSource, as_noise_source
from kahm_dask.privacy.release import AUTO_LEDGER, Release, begin_release
from kahm_dask.recipe import TrainParams
from kahm_dask.storage.atomic import replace_directory
from kahm_dask.storage.location import (
    COMPLETE_FILE,
    Location,
    LocationLike,
    as_location,
    committed_directory,
    copy_tree,
    is_committed,
)
from kahm_dask.storage.locks import exclusive
from kahm_dask.storage.private import make_private, private_directory

log = logging.getLogger("kahm_dask")

__all__ = [
    "TrainSettings",
    "StoredNoiseError",
    "noisy_array",
    "release_bounds",
    "check_training_targets",
    "train_pipeline",
    "NOISY",
    "SEED_FILE",
    "STAGED_MODEL",
]

#: The work store's noisy rows (written once per release, with a completion marker).
NOISY = "X_noisy"
#: The release being drawn (its id, the rows' fingerprint): removed once ``X_noisy`` is complete.
PENDING_FILE = "X_noisy.pending.json"
#: The run's k-means seed when none is given (public; kept so that a resume repeats it).
SEED_FILE = "kmeans_seed.json"
#: The model store while it is trained, in the work store (moved to the model path when complete).
STAGED_MODEL = "model.zarr"


@dataclass(frozen=True)
class TrainSettings:
    """Run-level settings on top of the per-task :class:`TrainParams`.

    ``seed`` seeds the k-means steps only (not private; None: drawn once per work store and
    kept there). ``bounds`` = ``(lower, upper)``, the bounds of the features the DP release
    clips to (scalars or (p,) arrays, broadcast to the store's features at release time; a
    :class:`~kahm_dask.privacy.bounds.FeatureBounds` carries its provenance and scaling), with
    ``bounds_source`` (:data:`~kahm_dask.privacy.bounds.BOUNDS_PUBLIC`, the
    default when bounds are given, or ``BOUNDS_PRIVATE``). Without bounds a DP run uses the
    store's public ``feature_range`` attribute, else each feature's min/max of the store
    (private: warns). ``d`` None = the bound width. ``ledger`` and ``budget``: the data set's
    privacy ledger (:func:`~kahm_dask.privacy.release.resolve_ledger`: ``"auto"``, a ledger
    directory, a ``PrivacyLedger`` or None) and a cap on its budget.
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
    ledger: Any = field(default=AUTO_LEDGER, compare=False)
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


def release_bounds(settings: TrainSettings, store: DatasetStore) -> ResolvedBounds:
    """The bounds of a DP release from ``store``: the settings' bounds, else the store's public
    ``feature_range``, else each feature's private min/max (warns)."""
    p = store.n_features
    bounds = settings.bounds
    if bounds is not None:
        lower, upper = public_bounds(tuple(bounds), p)
        if isinstance(bounds, FeatureBounds):
            return ResolvedBounds(lower, upper, settings.bounds_source or bounds.source, bounds.scaling)
        return ResolvedBounds(lower, upper, settings.bounds_source or BOUNDS_PUBLIC)
    fr = store.attrs.get("feature_range")
    if fr:
        scaling = store.attrs.get("scaling")
        scaling = None if not scaling else Scaling(scaling["kind"], scaling["raw_lower"], scaling["raw_upper"])
        return ResolvedBounds(*public_bounds((fr["min"], fr["max"]), p), BOUNDS_PUBLIC, scaling)
    return ResolvedBounds(*store_bounds(store), BOUNDS_PRIVATE)


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


def _noise_marker(mechanism: GridLaplace, X: da.Array, settings: TrainSettings) -> dict:
    """What a stored release of X must match to be continued: mechanism, shape, dtype, seed."""
    return {
        "mechanism": json.loads(json.dumps(mechanism.describe())),
        "shape": list(X.shape),
        "dtype": str(X.dtype),
        "insecure_noise_seed": settings.insecure_noise_seed,
    }


class StoredNoiseError(ValueError):
    """A work store holds noisy rows drawn for other rows than the data store's."""


def _what_changed(stored: dict, data: DataFingerprint, shape: list[int]) -> str:
    """In words, how the rows a stored release was drawn for differ from the current ones."""
    if stored.get("data_rows") == data.rows:
        return "the same rows in another order"
    if stored.get("shape") is not None and list(stored["shape"]) != shape:
        then = " x ".join(map(str, stored["shape"]))
        return f"other rows ({then} when the noise was drawn, {' x '.join(map(str, shape))} now)"
    if stored.get("data") is None:
        return "rows it cannot identify (the noise was stored by an older kahm-dask, without a fingerprint)"
    return "other rows of the same shape (at least one entry differs)"


def _stored_release(
    mechanism: GridLaplace, X: da.Array, settings: TrainSettings, data: DataFingerprint, work_path: Location,
    trained: tuple[Location, ...],
) -> str | None:
    """The release id of stored noisy rows of ``work_path`` that this run continues: complete
    ones of the same release (reused: not drawn, not charged again) or the pending draw of an
    interrupted run (drawn again under the id it was charged with); None for a new release.

    Stored noise is bound to the rows it was drawn for (their ``order`` fingerprint): on other
    rows it refuses, saying what changed, before anything is spent. A new release is refused
    too while a model store in ``trained`` has clusters fitted on the old noise.
    """
    path = work_path / NOISY
    marker = _noise_marker(mechanism, X, settings)
    try:
        done = is_complete(path)
    except StoreError:
        done = None
    stored = done if done is not None and done.get("noise_id") else _read_pending(work_path)
    if stored is not None:
        if stored.get("data") != data.order:
            raise StoredNoiseError(
                f"the work store {work_path} holds the noisy rows of release {stored.get('noise_id')}, drawn for "
                f"{_what_changed(stored, data, list(X.shape))} than the data store's. They cannot be used for these "
                f"rows. To make a new release of these rows, use a new work store (--work DIR, or delete {work_path}); "
                "the ledger keeps the old release."
            )
        if {k: stored.get(k) for k in marker} == marker:
            return str(stored["noise_id"])
    for model_path in trained:
        _refuse_new_noise_for_trained_store(model_path, work_path)
    return None


def _read_pending(work_path: Location) -> dict | None:
    try:
        return (work_path / PENDING_FILE).read_json()
    except (FileNotFoundError, ValueError):
        return None


def _draw_noisy_rows(
    X: da.Array, release: Release, settings: TrainSettings, data: DataFingerprint, work_path: Location
) -> da.Array:
    """The release's noisy rows, drawn and stored (in X's dtype) unless a complete copy of this
    release is stored already; the pending marker names the release while it is drawn."""
    path = work_path / NOISY
    if release.reused and is_complete(path) is not None:
        log.info("noise: reusing the stored noisy rows (release %s)", release.release_id)
        return _read_zarr(path)
    binding = {**_noise_marker(release.mechanism, X, settings), "noise_id": release.release_id,
               "data": data.order, "data_rows": data.rows}
    (work_path / PENDING_FILE).write_json(binding)
    path.remove()  # incomplete or of another release: never reused
    source = as_noise_source(settings.insecure_noise_seed)
    url, storage_options = path.dask_target()
    noisy_array(X, release.mechanism, source, X.dtype).to_zarr(url, storage_options=storage_options, overwrite=True,
                                                               zarr_format=3)
    mark_complete(path, binding)
    (work_path / PENDING_FILE).remove()
    return _read_zarr(path)


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


def check_training_targets(model_path: Location, work_path: Location) -> None:
    """Refuse, before anything is drawn or written, a model path or work path that a training run
    could not use: a plain file or a folder of something else, or a local folder that cannot be
    written. (Finding it after the release would spend privacy on a run that fails.)"""
    for where, what, check in ((model_path, "model store", _is_model_store), (work_path, "work store", _is_work_store)):
        if where.exists() and not check(where):
            raise FileExistsError(
                f"{where} exists and is not a kahm-dask {what}; choose another path or delete it yourself."
            )
        if where.is_local:
            parent = next(p for p in (where.path, *where.path.parents) if p.exists())
            if not os.access(parent, os.W_OK | os.X_OK):
                raise PermissionError(f"cannot write the {what} {where}: {parent} is not writable.")


def _is_model_store(where: Location) -> bool:
    if where.is_local and not where.path.is_dir():
        return False
    return (where / "zarr.json").exists() or not where.children()


#: What a work store may hold (besides hidden temporary siblings).
WORK_ENTRIES = frozenset({NOISY, "X_noisy_by_class", "X_by_class", GROUPED_X, GROUPED_X_NOISY, SEED_FILE,
                          "settings.json", PENDING_FILE, STAGED_MODEL})


def _is_work_store(where: Location) -> bool:
    if where.is_local and not where.path.is_dir():
        return False
    return all(name in WORK_ENTRIES or name.startswith(".") for name in where.children())


def train_pipeline(
    store: DatasetStore,
    model_path: LocationLike,
    work_path: LocationLike,
    settings: TrainSettings,
    client=None,
    *,
    partition: np.ndarray | None = None,
    partition_public: bool = False,
    progress: Progress | bool = False,
    storage_options: Mapping[str, Any] | None = None,
    manifest_extra: Mapping[str, Any] | Callable[[int], Mapping[str, Any]] | None = None,
) -> dict:
    """Train every cluster model of ``store`` into ``model_path``; returns a summary dict.

    ``model_path`` and ``work_path`` are local paths or URLs, with fsspec ``storage_options``.
    Both are checked before the release (:func:`check_training_targets`); the work store is
    locked for the run (a second concurrent run on it is refused), created 0700, and holds the
    model while it is trained (``<work>/model.zarr``), which is moved to ``model_path`` only
    when every cluster is written: an interrupted run leaves no partial model there, and a rerun
    resumes the staged one. ``partition`` : optional (N,) within-class cluster labels that
    replace the dask-ml k-means (to compare with the in-memory classifier given the same labels);
    a DP run treats them as computed from the private rows unless ``partition_public``.
    ``progress``: a :class:`~kahm_dask.pipeline.cluster.progress.Progress` (True: on the console).
    ``manifest_extra``: more manifest keys (the estimator's parameters), or a function of the
    run's k-means seed giving them; written before the model is committed.
    """
    check_class_sizes(store.class_counts)
    check_n_components(settings.params.n_components, store.n_features, stacklevel=2)
    model_path, work_path = as_location(model_path, storage_options), as_location(work_path, storage_options)
    check_training_targets(model_path, work_path)
    if work_path.is_local:
        private_directory(work_path.path)
    with exclusive(work_path.path if work_path.is_local else None, "the work store"):
        summary = _train(store, model_path, work_path, settings, client, partition, partition_public,
                         as_progress(progress), manifest_extra)
    if work_path.is_local:
        make_private(work_path.path)
    if not settings.params.private and model_path.is_local:
        make_private(model_path.path)  # a non-private model holds private rows: owner only
    return summary


def _train(
    store: DatasetStore, model_path: Location, work_path: Location, settings: TrainSettings, client,
    partition: np.ndarray | None, partition_public: bool, progress: Progress,
    manifest_extra: Mapping[str, Any] | Callable[[int], Mapping[str, Any]] | None,
) -> dict:
    t0 = time.perf_counter()
    params = settings.params
    staged = work_path / STAGED_MODEL
    seed = _kmeans_seed(settings.seed, work_path)
    extra = dict((manifest_extra(seed) if callable(manifest_extra) else manifest_extra) or {})
    root = np.random.SeedSequence(seed)
    X = store.X()  # stored dtype (float32 halves memory and I/O); tasks compute in float64
    y = store.y()
    chunk_rows = X.chunks[0][0]
    stages: dict[str, float] = {}

    X_noisy, privacy, statement = None, None, None
    if params.private:
        with progress.stage(f"release (DP noise, ε = {params.epsilon:g} per entry)"):
            X_noisy, release = _release_stage(store, X, settings, work_path, (staged, model_path), model_path,
                                              caller_partition=partition is not None and not partition_public)
        statement = release.statement
        ledger = release.ledger
        privacy = {
            "release_id": release.release_id,
            "noise_reused": release.reused,
            "statement": statement.to_dict(),
            "ledger": None if ledger is None else ledger.summary(),
            "ledger_path": None if ledger is None or ledger.path is None else str(ledger.path),
        }
    stages["noise"] = time.perf_counter() - t0

    layout = class_layout(y)
    sources = {"X_noisy": X_noisy}
    if settings.needs_private_rows:
        sources["X"] = X
    with progress.stage("copy rows by class"):
        by_class = {
            name: write_grouped(source, layout.groups, work_path / f"{name}_by_class", chunk_rows)
            for name, source in sources.items() if source is not None
        }
    stages["class_grouping"] = time.perf_counter() - t0 - sum(stages.values())
    with progress.stage("partition (k-means per class)"):
        labels = _labels(partition, by_class, layout, params, settings, root, client, y)
    stages["partition"] = time.perf_counter() - t0 - sum(stages.values())
    log.info("partition: %d clusters in %.1f s", len(np.unique(np.c_[y, labels], axis=0)), stages["partition"])
    groups, table = grouped_layout(y, labels)
    position = layout.position  # the cluster groups as rows of the class-grouped copies
    groups = [position[g] for g in groups]
    with progress.stage("copy rows by cluster"):
        for name, out in (("X", GROUPED_X), ("X_noisy", GROUPED_X_NOISY)):
            if name in by_class:
                write_grouped(by_class[name], groups, work_path / out, chunk_rows)
    t_prep = time.perf_counter() - t0
    stages["grouping"] = t_prep - sum(stages.values())

    current = {
        "params": params.to_dict(),
        "seed": seed,
        "mechanism": None if statement is None else statement.mechanism,
        "bounds_source": None if statement is None else statement.bounds_source,
        "noise_id": None if privacy is None else privacy["release_id"],
        "block_size": settings.block_size,
        "s_rule": settings.s_rule,
        "min_cluster_size": settings.min_cluster_size,
        "cluster_on": settings.cluster_on,
        "classes": list(store.classes),
        "n_features": store.n_features,
        "clusters": [list(row) for row in table],
    }
    finished = _check_same_settings((staged, model_path), work_path, current)
    if finished:  # a rerun of a complete run: the committed model store is this run's
        infos = [{**_cluster_info(model_path, c, s), "seconds": None, "resumed": True} for c, s, _, _ in table]
        progress.note(f"  train: all {len(table)} clusters already in {model_path}")
    else:
        write_manifest(staged, _manifest(store, params, settings, seed, privacy, table, extra))
        if client is not None:  # the shuffles leave freed memory in the workers' malloc arenas
            client.run(_trim_memory)
        tasks = [
            dask.delayed(train_cluster, pure=False)(work_path, staged, c, s, a, b, params)
            for c, s, a, b in table
        ]
        infos = compute(tasks, client, progress=progress, label=f"train {len(table)} clusters")
        _commit_model(staged, model_path)
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


def _release_stage(
    store: DatasetStore, X: da.Array, settings: TrainSettings, work_path: Location, trained: tuple[Location, ...],
    model_path: Location, *, caller_partition: bool,
) -> tuple[da.Array, Release]:
    """The run's DP release (:func:`~kahm_dask.privacy.release.begin_release`: bounds, plan, the
    data set's ledger, spent before any noise is drawn) and its noisy rows, stored or drawn."""
    params = settings.params
    bounds = release_bounds(settings, store)
    fr = store.attrs.get("feature_range")
    recorded = fr and np.array_equal(fr["min"], bounds.lower) and np.array_equal(fr["max"], bounds.upper)
    if bounds.source == BOUNDS_PUBLIC and not recorded:
        # bounds the store does not record (it holds rows clipped to its own): count, owner-side
        share = float(dask.compute(clipped_share(X, bounds.lower, bounds.upper))[0])
        warn_if_clipped(share, bounds.lower, bounds.upper, stacklevel=4)
    data = store.fingerprint()
    release = begin_release(
        params.epsilon, bounds.lower, bounds.upper, bounds.source, scaling=bounds.scaling,
        ledger=settings.ledger, data=data, budget=settings.budget,
        what=f"noisy rows ({store.n_samples} x {store.n_features}, unit: one entry) of {store.location}, from "
             f"which the {params.dp_data} DP rows of {model_path} are built",
        delta=settings.delta, d=settings.d, dp_data=params.dp_data, r_source=params.r_source,
        cluster_on=settings.cluster_on, caller_partition=caller_partition,
        insecure_noise=settings.insecure_noise_seed is not None,
        stored=lambda mechanism: _stored_release(mechanism, X, settings, data, work_path, trained),
        details={"data_store": str(store.location), "model_store": str(model_path), "work_store": str(work_path)},
        stacklevel=4,
    )
    return _draw_noisy_rows(X, release, settings, data, work_path), release


def _labels(partition, by_class, layout, params, settings, root, client, y) -> np.ndarray:
    """(N,) within-class cluster labels: the caller's, or k-means per class on the class copy."""
    if partition is not None:
        return np.asarray(partition, dtype=np.int64)
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
    return labels


def _manifest(store, params, settings, seed, privacy, table, extra: dict) -> dict:
    return {
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
        **extra,
    }


def _cluster_info(model_path: Location, c: int, s: int) -> dict:
    info = cluster_done(model_path, c, s)
    if info is None:
        raise FileNotFoundError(f"cluster c{c}_s{s} of the model store {model_path} is missing; delete the "
                                "model store and rerun.")
    return info


def _commit_model(staged: Location, model_path: Location) -> None:
    """Mark the staged model store complete and put it at ``model_path`` (replacing an older
    model store there): renamed when both are local on one file system, else copied with the
    completion marker last (:func:`~kahm_dask.storage.location.committed_directory`)."""
    mark_model_complete(staged)
    if staged.is_local and model_path.is_local:
        model_path.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            replace_directory(staged.path, model_path.path)
            return
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
    with committed_directory(model_path) as tmp:
        copy_tree(staged, tmp)
        (tmp / COMPLETE_FILE).write_json((staged / COMPLETE_FILE).read_json())
    staged.remove()


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


def _check_same_settings(models: tuple[Location, Location], work_path: Location, current: dict) -> bool:
    """Refuse to resume into, or replace, a model store trained with other settings; returns
    True when the committed model store (``models[1]``) is complete with these settings.

    The run's settings (with the id of the release its clusters were trained on) are kept in
    ``<work>/settings.json``. The staged model store (``models[0]``) with clusters of other
    settings would mix two models; a committed one of other settings is not replaced silently.
    """
    path = work_path / "settings.json"
    current = json.loads(json.dumps(current))
    stored = path.read_json() if path.exists() else None
    staged, final = models
    for model_path in (staged, final):
        if (model_path / "clusters").children() and stored != current:
            keys = sorted(k for k in current if stored is None or stored.get(k) != current[k])
            raise ValueError(
                f"model store {model_path} was trained with other settings ({', '.join(keys)}); "
                "delete it or choose another output directory."
            )
    path.write_json(current)
    return not (staged / "clusters").children() and stored == current and is_committed(final) and \
        all(cluster_done(final, c, s) is not None for c, s, _, _ in current["clusters"])


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
