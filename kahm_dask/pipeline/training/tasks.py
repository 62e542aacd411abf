"""The per-cluster training task: a pure function of its inputs.

``train_cluster`` reads one cluster's rows (a contiguous slice of the cluster-grouped copy):
the noisy rows, and the private rows only where the recipe reads them (the paper's private
stopping threshold, ``r_source="private"``, which leaks and warns; or a non-private run);
``train_cluster_rows`` takes the same rows from worker memory
(:mod:`~kahm_dask.pipeline.training.in_memory`). Either applies the core's per-cluster recipe
(:meth:`TrainParams.fit_cluster
<kahm_dask.recipe.TrainParams.fit_cluster>`: DP rows, then a DeepKAHM on them only,
docs/algorithm.md#pipeline) and writes model + DP rows atomically. The model store's cluster
metadata holds only what is public or DP: no timing, and no number of smoother passes when it
depends on private rows. The task returns a small dict of metadata (its timing included, for the
owner's report): private rows never travel back to the client. BLAS runs single-threaded
inside the task (one BLAS thread per Dask thread).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np
import zarr
from threadpoolctl import threadpool_limits

from kahm_dask._validation import as_float_rows
from kahm_dask.pipeline.cluster.plugins import current_worker
from kahm_dask.pipeline.stores.model import cluster_done, cluster_location, remember_trained_cluster, save_cluster
from kahm_dask.recipe import TrainParams
from kahm_dask.storage.location import LocationLike, as_location

__all__ = ["train_cluster", "train_cluster_rows", "GROUPED_X", "GROUPED_X_NOISY"]

GROUPED_X = "grouped_X"
GROUPED_X_NOISY = "grouped_X_noisy"


def _read_slice(work_path: LocationLike, name: str, start: int, stop: int) -> np.ndarray:
    arr = zarr.open_array((as_location(work_path) / name).zarr_store(read_only=True), mode="r")
    return as_float_rows(arr[start:stop])  # the stored dtype sets the weights' (weights_dtype)


def train_cluster(
    work_path: LocationLike, model_path: LocationLike, c: int, s: int, start: int, stop: int, params: TrainParams,
    served: LocationLike | None = None,
) -> dict:
    """Train cluster (class code c, cluster s) from grouped rows [start, stop); see module doc.

    ``work_path`` and ``model_path`` are local paths or :class:`~kahm_dask.storage.location.Location`
    objects (a URL with its storage options, opened by the task).

    Returns ``{"class": c, "cluster": s, "n_rows", "passes", "layer_dims", "seconds",
    "resumed", "worker"}`` ("passes" absent with ``r_source="private"``; "seconds" None when
    resumed; "worker" the address of the Dask worker that ran the task, None outside a worker).
    Only the first five are written to the model store. A cluster already complete in the model
    store is skipped (resume). ``served``: where ``model_path`` (the staged store) will be
    committed; the trained model then stays in this worker's model cache under that path
    (:func:`~kahm_dask.pipeline.stores.model.remember_trained_cluster`).
    """
    def read() -> dict[str, np.ndarray]:
        names = {"X_noisy": GROUPED_X_NOISY, "X": GROUPED_X}
        return {name: _read_slice(work_path, names[name], start, stop) for name in _sources(params)}

    return _train(read, model_path, c, s, params, served)


def train_cluster_rows(rows: Mapping[str, np.ndarray], model_path: LocationLike, c: int, s: int,
                       params: TrainParams, served: LocationLike | None = None) -> dict:
    """:func:`train_cluster` on rows held in memory: ``rows`` maps ``"X_noisy"`` (DP runs) and
    ``"X"`` (where the recipe reads private rows) to the cluster's (N_cs, p) rows
    (:mod:`~kahm_dask.pipeline.training.in_memory`); returns the same dict."""
    return _train(lambda: {name: as_float_rows(rows[name]) for name in _sources(params)},
                  model_path, c, s, params, served)


def _sources(params: TrainParams) -> tuple[str, ...]:
    """The row sources a cluster's fit reads: its DP rows' (the noisy rows; the private rows of a
    non-private run), and the private rows where the recipe reads them."""
    fitted = _fitted(params)
    return (fitted, "X") if params.reads_private_rows and fitted != "X" else (fitted,)


def _fitted(params: TrainParams) -> str:
    return "X_noisy" if params.private else "X"


def _train(read: Callable[[], dict[str, np.ndarray]], model_path: LocationLike, c: int, s: int,
           params: TrainParams, served: LocationLike | None) -> dict:
    done = cluster_done(model_path, c, s)
    if done is not None:
        return {**done, "seconds": None, "resumed": True, "worker": None}
    t0 = time.perf_counter()
    with threadpool_limits(limits=1, user_api="blas"):
        rows = read()
        fit = params.fit_cluster(rows[_fitted(params)], rows["X"] if params.reads_private_rows else None)
    info = {
        "class": c, "cluster": s, "n_rows": len(rows[_fitted(params)]), "passes": fit.n_passes,
        "layer_dims": fit.model.layer_dims_,
    }
    if params.private and params.r_source == "private":
        del info["passes"]  # stops at the private rows' modelling error: not DP
    written = save_cluster(model_path, c, s, fit.model, info, fit.dp_rows)
    if served is not None:
        remember_trained_cluster(fit.model, written, cluster_location(served, c, s))
    return {**info, "seconds": round(time.perf_counter() - t0, 4), "resumed": False,
            "worker": None if (worker := current_worker()) is None else worker.address}
