"""The per-cluster training task: a pure function of its inputs.

``train_cluster`` reads one cluster's rows (a contiguous slice of the cluster-grouped copy),
fabricates DP rows from the noisy rows (reading the private rows only for the paper's private
stopping threshold, ``r_source="private"``, which leaks and warns), fits the DeepKAHM on the DP
rows only, and writes model + DP rows atomically. The model store's cluster metadata holds only
what is public or DP: no timing, and no number of smoother passes when it depends on private
rows. The task returns a small dict of metadata (its timing included, for the owner's report):
private rows never travel back to the client. BLAS runs single-threaded inside the task (one
BLAS thread per Dask thread).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import zarr
from threadpoolctl import threadpool_limits

from kahm_dask.deep import DeepKAHM
from kahm_dask.pipeline.modelstore import cluster_done, save_cluster
from kahm_dask.privacy.fabrication import fabricate_subset

__all__ = ["TrainParams", "train_cluster", "GROUPED_X", "GROUPED_X_NOISY"]

GROUPED_X = "grouped_X"
GROUPED_X_NOISY = "grouped_X_noisy"


@dataclass(frozen=True)
class TrainParams:
    """Everything a cluster task needs besides its rows (small and picklable)."""

    n_components: int = 20
    n_layers: int = 5
    min_range: float | None = 1e-3
    epsilon: float | None = None
    dp_data: str = "fabricated"
    r_source: str = "passes"
    r_value: float | int | None = None
    max_passes: int = 100

    @property
    def private(self) -> bool:
        return self.epsilon is not None

    def to_dict(self) -> dict:
        return asdict(self)


def _read_slice(work_path: str, name: str, start: int, stop: int) -> np.ndarray:
    arr = zarr.open_array(str(Path(work_path) / name), mode="r")
    return np.asarray(arr[start:stop], dtype=np.float64)


def train_cluster(
    work_path: str, model_path: str, c: int, s: int, start: int, stop: int, params: TrainParams
) -> dict:
    """Train cluster (class code c, cluster s) from grouped rows [start, stop); see module doc.

    Returns ``{"class": c, "cluster": s, "n_rows", "passes", "layer_dims", "seconds",
    "resumed"}`` ("passes" absent with ``r_source="private"``; "seconds" None when resumed).
    Only the first five (less "seconds") are written to the model store. A cluster already
    complete in the model store is skipped (resume).
    """
    done = cluster_done(model_path, c, s)
    if done is not None:
        return {**done, "seconds": None, "resumed": True}
    t0 = time.perf_counter()
    with threadpool_limits(limits=1, user_api="blas"):
        dp_rows, passes = None, None
        if not params.private:
            data = _read_slice(work_path, GROUPED_X, start, stop)
        else:
            data = _read_slice(work_path, GROUPED_X_NOISY, start, stop)
            if params.dp_data == "fabricated":
                private = (
                    _read_slice(work_path, GROUPED_X, start, stop)
                    if params.r_source == "private"
                    else None
                )
                result = fabricate_subset(
                    private,
                    data,
                    params.n_components,
                    r_source=params.r_source,
                    r_value=params.r_value,
                    max_passes=params.max_passes,
                    min_range=params.min_range,
                )
                data, passes = result.data, result.n_passes
            dp_rows = data
        model = DeepKAHM(params.n_components, params.n_layers, min_range=params.min_range)
        model.fit(data)
    info = {"class": c, "cluster": s, "n_rows": stop - start, "passes": passes, "layer_dims": model.layer_dims_}
    if params.private and params.r_source == "private":
        del info["passes"]  # stops at the private rows' modelling error: not DP
    save_cluster(model_path, c, s, model, info, dp_rows)
    return {**info, "seconds": round(time.perf_counter() - t0, 4), "resumed": False}
