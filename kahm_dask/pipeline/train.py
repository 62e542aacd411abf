"""Build and run the training graph (ARCHITECTURE.md "Data flow of one training run").

Stages, all on Zarr-backed dask arrays (the data set is never loaded whole):

1. DP noise (Algorithm 1) blockwise, with the noise of global row block b drawn from
   ``child(root, 0, b)`` — bit-identical to the in-memory :class:`KAHMClassifier`;
   written to the work store (``X_noisy``, DP data).
2. A class-grouped copy of X (and X_noisy) (:mod:`~kahm_dask.pipeline.layout`), so each
   class is one contiguous slice.
3. Per-class k-means (k-means|| centres, then dask-ml's Lloyd iterations; ``child(root, 1, c)``)
   on the original or the noisy rows of the class-grouped copy, a class held in worker memory
   while it fits ``kmeans_persist_fraction`` of the workers' memory.
4. A cluster-grouped copy of X (and X_noisy), built from the class-grouped one: rows ordered
   by (class, cluster), original order within a cluster, so each task reads one contiguous
   slice.
5. One task per (class, cluster) (:func:`~kahm_dask.pipeline.tasks.train_cluster`); finished
   clusters are skipped on a rerun (resume).

The work store holds private data (X copy, cluster labels): it lives next to the data store,
on the data owner's side; the model store holds only DP rows and models fitted on them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import zarr

from kahm_dask import __version__
from kahm_dask._random import child_seed_sequence
from kahm_dask._validation import check_class_sizes, check_n_components
from kahm_dask.classifier import MODEL_STREAM, NOISE_STREAM, PARTITION_STREAM
from kahm_dask.pipeline.layout import class_layout, grouped_layout, write_grouped
from kahm_dask.pipeline.modelstore import write_manifest
from kahm_dask.pipeline.partition import partition_classes
from kahm_dask.pipeline.store import DatasetStore
from kahm_dask.pipeline.tasks import GROUPED_X, GROUPED_X_NOISY, TrainParams, train_cluster
from kahm_dask.privacy.noise import add_blocked_optimal_noise

log = logging.getLogger("kahm_dask")

__all__ = ["TrainSettings", "resolve_seed", "noisy_array", "train_pipeline"]


@dataclass(frozen=True)
class TrainSettings:
    """Run-level settings on top of the per-task :class:`TrainParams`."""

    params: TrainParams
    seed: int | None = None
    delta: float = 1e-5
    d: float = 1.0
    block_size: int = 1000
    s_rule: str = "round"
    min_cluster_size: int | None = None
    cluster_on: str = "original"
    oversampling_factor: float | None = None
    init_max_iter: int = 5
    kmeans_max_iter: int = 100
    kmeans_persist_fraction: float = 0.25


def resolve_seed(seed: int | None, work_path: Path) -> int:
    """The run's root seed: ``seed`` if given, else entropy drawn once and kept in
    ``<work>/secret_seed.json`` (the private side), so a resumed run reuses it.

    The seed is a secret for DP runs: with it, anyone holding the DP rows could regenerate
    the noise and subtract it. It is never written to the model store or the reports.
    """
    if seed is not None:
        return int(seed)
    path = work_path / "secret_seed.json"
    if path.exists():
        return int(json.loads(path.read_text())["entropy"])
    entropy = int(np.random.SeedSequence().entropy)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"entropy": entropy}))
    os.replace(tmp, path)
    return entropy


def noisy_array(X: da.Array, epsilon: float, delta: float, d: float, seed: np.random.SeedSequence) -> da.Array:
    """``X + V`` blockwise (Algorithm 1); row r's noise depends only on (seed, r)."""

    def block(x: np.ndarray, block_info=None) -> np.ndarray:
        start = block_info[0]["array-location"][0][0]
        return add_blocked_optimal_noise(x, epsilon, delta, d, seed, row_offset=start)

    return X.astype(np.float64).map_blocks(block, dtype=np.float64, meta=np.empty((0, 0)))


def train_pipeline(
    store: DatasetStore,
    model_path: str | Path,
    work_path: str | Path,
    settings: TrainSettings,
    client=None,
    *,
    partition: np.ndarray | None = None,
    progress: bool = True,
) -> dict:
    """Train every cluster model of ``store`` into ``model_path``; returns a summary dict.

    ``partition`` : optional (N,) within-class cluster labels that replace the dask-ml
    k-means (used to compare with the in-memory classifier given the same labels).
    """
    check_class_sizes(store.class_counts)
    check_n_components(settings.params.n_components, store.n_features, stacklevel=2)
    t0 = time.perf_counter()
    params = settings.params
    model_path, work_path = Path(model_path), Path(work_path)
    work_path.mkdir(parents=True, exist_ok=True)
    seed = resolve_seed(settings.seed, work_path)
    root = np.random.SeedSequence(seed)
    X = store.X()  # stored dtype (float32 halves memory and I/O); tasks compute in float64
    y = store.y()
    chunk_rows = X.chunks[0][0]

    X_noisy = None
    if params.private:
        noisy_path = work_path / "X_noisy"
        noisy_array(
            X, params.epsilon, settings.delta, settings.d, child_seed_sequence(root, NOISE_STREAM)
        ).to_zarr(str(noisy_path), overwrite=True, zarr_format=3)
        X_noisy = da.from_zarr(str(noisy_path))

    stages = {"noise": time.perf_counter() - t0}
    layout = class_layout(y)
    by_class = {
        name: write_grouped(source, layout.groups, work_path / f"{name}_by_class", chunk_rows)
        for name, source in (("X", X), ("X_noisy", X_noisy)) if source is not None
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
            oversampling_factor=settings.oversampling_factor,
            init_max_iter=settings.init_max_iter,
            max_iter=settings.kmeans_max_iter,
            persist_bytes=_persist_bytes(settings.kmeans_persist_fraction, client),
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

    _check_same_settings(
        model_path,
        work_path,
        {
            "params": params.to_dict(),
            "seed": seed,
            "delta": settings.delta,
            "d": settings.d,
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
            # a DP model store never records its noise seed (see resolve_seed)
            "seed": None if params.private else seed,
            "seed_streams": {"noise": [NOISE_STREAM], "partition": [PARTITION_STREAM], "model": [MODEL_STREAM]},
            "delta": settings.delta,
            "d": settings.d,
            "block_size": settings.block_size,
            "cluster_on": settings.cluster_on,
            "clusters": [{"class": c, "cluster": s, "n_rows": b - a} for c, s, a, b in table],
            "versions": _versions(),
        },
    )
    if client is not None:  # the shuffles leave freed memory in the workers' malloc arenas
        client.run(_trim_memory)
    tasks = [
        dask.delayed(train_cluster, pure=True)(str(work_path), str(model_path), c, s, a, b, params)
        for c, s, a, b in table
    ]
    infos = _run(tasks, client, progress)
    return {
        "n_clusters": len(table),
        "n_resumed": sum(i["resumed"] for i in infos),
        "prepare_seconds": round(t_prep, 3),
        "stage_seconds": {k: round(v, 3) for k, v in stages.items()},
        "train_seconds": round(time.perf_counter() - t0 - t_prep, 3),
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


def _persist_bytes(fraction: float, client) -> int:
    """The memory a class's rows may take while held for its k-means: ``fraction`` of the
    workers' total memory limit (with a client), or of the available memory (threads)."""
    if fraction <= 0:
        return 0
    if client is not None:
        limits = [w.get("memory_limit") or 0 for w in client.scheduler_info()["workers"].values()]
        if limits and all(limits):
            return int(fraction * sum(limits))
    import psutil

    return int(fraction * psutil.virtual_memory().available)


def _check_same_settings(model_path: Path, work_path: Path, current: dict) -> None:
    """Refuse to resume into a model store trained with other settings.

    The run's settings (with its seed, hence kept in the private work directory) are stored in
    ``<work>/settings.json``. If the model store already has clusters and the stored settings
    are missing or differ, resuming would mix old clusters with new ones: raise instead.
    """
    path = work_path / "settings.json"
    current = json.loads(json.dumps(current))
    clusters_dir = model_path / "clusters"
    has_clusters = clusters_dir.is_dir() and any(clusters_dir.iterdir())
    if has_clusters:
        stored = json.loads(path.read_text()) if path.exists() else None
        if stored != current:
            keys = sorted(k for k in current if stored is None or stored.get(k) != current[k])
            raise ValueError(
                f"model store {model_path} was trained with other settings ({', '.join(keys)}); "
                "delete it or choose another output directory."
            )
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(current))
    os.replace(tmp, path)


def _run(tasks: list, client, progress: bool) -> list[dict]:
    if client is None:
        return list(dask.compute(*tasks, scheduler="threads"))
    futures = client.compute(tasks, retries=2)
    if progress:
        from distributed import progress as dask_progress

        dask_progress(futures, notebook=False)
    return client.gather(futures)


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
