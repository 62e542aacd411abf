"""Build and run the training graph (docs/design.md explains the cuts).

Stages, all on Zarr-backed dask arrays (the data set is never loaded whole):

1. The DP release (:mod:`~kahm_dask.pipeline.training.release`): bounds, the rows' ledger
   (spent before any noise is drawn), the noisy rows drawn blockwise and stored once per release in
   the work store, bound to the rows they were drawn for.
2. A class-grouped copy of X_noisy (and of X where a setting reads the private rows)
   (:mod:`~kahm_dask.pipeline.training.layout`), so each class is one contiguous slice.
3. Per-class k-means (``child(root, 1, c)`` of the public ``seed``) on the noisy rows (or, with
   ``cluster_on="original"``, which leaks, the private ones): in one task with the estimator's
   own k-means when the class fits ``persist_fraction`` of a worker's memory, else out
   of core (k-means|| centres, then dask-ml's Lloyd iterations), the class held in worker
   memory while it fits that fraction of the workers' memory
   (:func:`~kahm_dask.pipeline.training.partition.partition_classes`).
4. A cluster-grouped copy, built from the class-grouped one: rows ordered by (class, cluster),
   original order within a cluster, so each task reads one contiguous slice.

   Rows that fit the workers' memory skip both copies: stages 2–4 run there, one task per row
   chunk and one per class, with the same rows, the same k-means and the same models
   (:mod:`~kahm_dask.pipeline.training.in_memory`, when
   :func:`~kahm_dask.pipeline.training.in_memory.fits_in_memory`; the summary's ``rows_held``
   names the route).
5. One task per (class, cluster) (:func:`~kahm_dask.pipeline.training.tasks.train_cluster`) into the
   model staged in the work store; finished clusters are skipped on a rerun (resume), and the model
   is committed to the model path when every cluster is written
   (:mod:`~kahm_dask.pipeline.training.work`).

The work store holds private data (X copies, cluster labels, the noisy rows before fabrication):
it lives on the data owner's side; the model store holds only DP rows and models fitted on them,
and nothing else computed from private rows. Both may be local paths or URLs (``s3://``, …) with
fsspec ``storage_options`` (:mod:`kahm_dask.storage.location`); the tasks get the URL and the
options.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import dask
import dask.array as da
import numpy as np

from kahm_dask._random import child_seed_sequence
from kahm_dask._validation import check_class_sizes, check_n_components
from kahm_dask.classifier import PARTITION_STREAM
from kahm_dask.pipeline.cluster import compute
from kahm_dask.pipeline.cluster.plugins import release_free_memory
from kahm_dask.pipeline.cluster.progress import Progress, as_progress
from kahm_dask.pipeline.stores.dataset import DatasetStore
from kahm_dask.pipeline.stores.held import HeldRows
from kahm_dask.pipeline.stores.manifest import build_manifest, jsonable, write_manifest
from kahm_dask.pipeline.training.in_memory import fits_in_memory, partition_in_memory
from kahm_dask.pipeline.training.layout import ClassLayout, class_layout, grouped_layout, write_grouped
from kahm_dask.pipeline.training.partition import partition_classes
from kahm_dask.pipeline.training.release import release_stage
from kahm_dask.pipeline.training.settings import TrainSettings
from kahm_dask.pipeline.training.tasks import GROUPED_X, GROUPED_X_NOISY, train_cluster, train_cluster_rows
from kahm_dask.pipeline.training.work import (
    STAGED_MODEL,
    check_same_settings,
    check_training_targets,
    cluster_info,
    commit_model,
    kmeans_seed,
)
from kahm_dask.storage.location import (
    Location,
    LocationLike,
    as_location,
)
from kahm_dask.storage.locks import exclusive
from kahm_dask.storage.private import make_private, private_directory

log = logging.getLogger("kahm_dask")

__all__ = ["train_pipeline", "rows_held_in_memory", "trained_on", "TrainingRows"]

#: What the training run reads its rows from: a dataset store, or (a non-private fit whose rows
#: fit the workers' memory) rows held there (:class:`~kahm_dask.pipeline.stores.held.HeldRows`).
TrainingRows = DatasetStore | HeldRows


def train_pipeline(
    store: TrainingRows,
    model_path: LocationLike,
    work_path: LocationLike,
    settings: TrainSettings,
    client=None,
    *,
    partition: np.ndarray | None = None,
    partition_public: bool = False,
    progress: Progress | bool = False,
    storage_options: Mapping[str, Any] | None = None,
    manifest_extra: Mapping[str, Any] | None = None,
) -> dict:
    """Train every cluster model of ``store`` into ``model_path``; returns a summary dict.

    ``store``: a dataset store, or for a non-private run rows held in worker memory
    (:class:`~kahm_dask.pipeline.stores.held.HeldRows`; a DP run needs the store, whose rows
    its release verifies, fingerprints and remembers).

    ``model_path`` and ``work_path`` are local paths or URLs, with fsspec ``storage_options``.
    Both are checked before the release (:func:`check_training_targets`), and so are the classes
    (two or more, outside a federated site's fit) and, for a DP run, every row of ``store``
    (:meth:`~kahm_dask.pipeline.stores.dataset.DatasetStore.verified_fingerprint`); the work store is
    locked for the run (a second concurrent run on it is refused), created 0700, and holds the
    model while it is trained (``<work>/model.zarr``), which is moved to ``model_path`` only
    when every cluster is written: an interrupted run leaves no partial model there, and a rerun
    resumes the staged one. ``partition`` : optional (N,) within-class cluster labels that
    replace the dask-ml k-means (to compare with the in-memory classifier given the same labels);
    a DP run treats them as computed from the private rows unless ``partition_public``.
    ``progress``: a :class:`~kahm_dask.pipeline.cluster.progress.Progress` (True: on the console).
    ``manifest_extra``: more manifest keys (the estimator's own parameters), written before the
    model is committed.
    """
    check_class_sizes(store.class_counts)
    check_n_components(settings.params.n_components, store.n_features, stacklevel=2)
    settings = settings.for_features(store.n_features)
    model_path, work_path = as_location(model_path, storage_options), as_location(work_path, storage_options)
    check_training_targets(model_path, work_path)
    if settings.params.private:
        if not isinstance(store, DatasetStore):
            raise TypeError("a DP training run reads its rows from a dataset store (write_dataset or ingest).")
        store.verified_fingerprint()  # every row read now: a damaged chunk fails before the spend
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
    store: TrainingRows, model_path: Location, work_path: Location, settings: TrainSettings, client,
    partition: np.ndarray | None, partition_public: bool, progress: Progress,
    manifest_extra: Mapping[str, Any] | None,
) -> dict:
    t0 = time.perf_counter()
    params = settings.params
    staged = work_path / STAGED_MODEL
    seed = kmeans_seed(settings.seed, work_path)
    extra = dict(manifest_extra or {})
    root = np.random.SeedSequence(seed)
    X = store.X()  # stored dtype (float32 halves memory and I/O); tasks compute in float64
    y = store.y()
    chunk_rows = X.chunks[0][0]
    stages: dict[str, float] = {}

    X_noisy, privacy, statement = None, None, None
    if params.private:
        with progress.stage(f"release (DP noise, ε = {params.epsilon:g} per entry)"):
            X_noisy, release = release_stage(store, X, settings, work_path, (staged, model_path), model_path,
                                              caller_partition=partition is not None and not partition_public)
        statement = release.statement
        ledger = release.ledger
        privacy = {
            "release_id": release.release_id,
            "noise_reused": release.reused,
            "statement": statement.to_dict(),
            "ledger": None if ledger is None else ledger.summary(),
            "ledger_path": None if ledger is None or ledger.file is None else str(ledger.file),
        }
    stages["noise"] = time.perf_counter() - t0

    layout = class_layout(y)
    sources = {"X_noisy": X_noisy}
    if settings.needs_private_rows:
        sources["X"] = X
    sources = {name: source for name, source in sources.items() if source is not None}
    cluster_on = "X_noisy" if (params.private and settings.cluster_on == "noisy") else "X"
    in_memory = rows_held_in_memory(sources, layout, settings, client)
    if in_memory:
        with progress.stage("partition in worker memory (rows by class, k-means per class)"):
            labels, held = partition_in_memory(
                sources, y, layout, cluster_on, n_components=params.n_components, block_size=settings.block_size,
                s_rule=settings.s_rule, min_cluster_size=settings.min_cluster_size,
                seed=child_seed_sequence(root, PARTITION_STREAM), n_init=settings.n_init,
                kmeans_dims=settings.kmeans_dims, max_cluster_rows=settings.max_cluster_rows,
                partition=None if partition is None else np.asarray(partition, dtype=np.int64), client=client,
            )
        stages["partition_in_memory"] = time.perf_counter() - t0 - sum(stages.values())
    else:
        with progress.stage("copy rows by class"):
            by_class = {name: write_grouped(source, layout.groups, work_path / f"{name}_by_class", chunk_rows)
                        for name, source in sources.items()}
        stages["class_grouping"] = time.perf_counter() - t0 - sum(stages.values())
        with progress.stage("partition (k-means per class)"):
            labels = _labels(partition, by_class[cluster_on], layout, params, settings, root, client)
        stages["partition"] = time.perf_counter() - t0 - sum(stages.values())
    log.info("partition: %d clusters", len(np.unique(np.c_[y, labels], axis=0)))
    groups, table = grouped_layout(y, labels)
    if not in_memory:
        position = layout.position  # the cluster groups as rows of the class-grouped copies
        with progress.stage("copy rows by cluster"):
            for name, out in (("X", GROUPED_X), ("X_noisy", GROUPED_X_NOISY)):
                if name in by_class:
                    write_grouped(by_class[name], [position[g] for g in groups], work_path / out, chunk_rows)
        stages["grouping"] = time.perf_counter() - t0 - sum(stages.values())
    t_prep = time.perf_counter() - t0

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
    finished = check_same_settings((staged, model_path), work_path, current)
    if finished:  # a rerun of a complete run: the committed model store is this run's
        infos = [{**cluster_info(model_path, c, s), "seconds": None, "resumed": True, "worker": None}
                 for c, s, _, _ in table]
        progress.note(f"  train: all {len(table)} clusters already in {model_path}")
    else:
        release = None if privacy is None else {"release_id": privacy["release_id"], "statement": privacy["statement"]}
        parameters = jsonable({**settings.to_params(), "random_state": seed})
        clusters = [{"class": c, "cluster": s, "n_rows": b - a} for c, s, a, b in table]
        write_manifest(staged, build_manifest(list(store.classes), store.n_features, parameters, release, clusters,
                                              extra))
        if client is not None:  # the copies and k-means leave freed memory in the workers' malloc arenas
            client.run(release_free_memory)
        tasks = []
        for c, s, a, b in table:
            # largest first (the longest-processing-time rule): the workers' last tasks are the
            # small ones, so the one that finishes early idles for less
            with dask.annotate(priority=b - a):
                tasks.append(
                    dask.delayed(train_cluster_rows, pure=False)(held[c, s], staged, c, s, params, model_path)
                    if in_memory else
                    dask.delayed(train_cluster, pure=False)(work_path, staged, c, s, a, b, params, model_path)
                )
        infos = compute(tasks, client, progress=progress, label=f"train {len(table)} clusters")
        commit_model(staged, model_path)
    return {
        "n_clusters": len(table),
        "rows_held": "worker memory" if in_memory else "work store copies",
        "n_resumed": sum(i["resumed"] for i in infos),
        "seed": seed,
        "prepare_seconds": round(t_prep, 3),
        "stage_seconds": {k: round(v, 3) for k, v in stages.items()},
        "train_seconds": round(time.perf_counter() - t0 - t_prep, 3),
        "privacy": privacy,
        "privacy_statement_markdown": None if statement is None else statement.to_markdown(),
        "clusters": infos,
    }


def trained_on(summary: Mapping[str, Any]) -> dict[tuple[int, int], str | None]:
    """(class code, cluster) → the address of the worker that trained that cluster model in the
    run of ``summary`` (:func:`train_pipeline`'s), where the model stays in its cache (None for a
    cluster resumed from an earlier run, or trained outside a worker): the prediction's homes."""
    return {(i["class"], i["cluster"]): i["worker"] for i in summary["clusters"]}


def rows_held_in_memory(sources: Mapping[str, da.Array], layout: ClassLayout, settings: TrainSettings,
                        client) -> bool:
    """Whether the run's stages 2–4 hold the rows of ``sources`` (name → (N, p) dask array, by
    class ``layout``) in worker memory (:func:`~kahm_dask.pipeline.training.in_memory.fits_in_memory`
    with ``settings.persist_fraction`` of the workers' memory, :func:`_memory_share`)."""
    return fits_in_memory(sources, layout, task_bytes=_memory_share(settings.persist_fraction, client, min),
                          persist_bytes=_memory_share(settings.persist_fraction, client))


def _labels(partition, rows: da.Array, layout, params, settings, root, client) -> np.ndarray:
    """(N,) within-class cluster labels: the caller's, or k-means per class on the class copy
    ``rows`` of the rows the k-means reads."""
    if partition is not None:
        return np.asarray(partition, dtype=np.int64)
    labels = np.empty(layout.order.size, dtype=np.int64)
    labels[layout.order] = partition_classes(
        rows,
        layout.bounds,
        n_components=params.n_components,
        block_size=settings.block_size,
        s_rule=settings.s_rule,
        min_cluster_size=settings.min_cluster_size,
        seed=child_seed_sequence(root, PARTITION_STREAM),
        n_init=settings.n_init,
        kmeans_dims=settings.kmeans_dims,
        task_bytes=_memory_share(settings.persist_fraction, client, min),
        oversampling_factor=settings.oversampling_factor,
        init_max_iter=settings.init_max_iter,
        max_iter=settings.kmeans_max_iter,
        max_cluster_rows=settings.max_cluster_rows,
        persist_bytes=_memory_share(settings.persist_fraction, client),
    )
    return labels


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
