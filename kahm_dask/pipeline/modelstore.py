"""The model store: one Zarr group per (class, cluster) DeepKAHM, written atomically.

Layout (zarr v3, local filesystem)::

    <model>.zarr/
      zarr.json                      attributes "kahm_dask_model": manifest (params, seeds,
                                     versions, classes, cluster table)
      clusters/c{c}_s{s}/            one trained cluster (a complete group or absent)
        zarr.json                    attributes: deep-KAHM meta, layer scalars, task info
        layer{k}/{mean,components,explained_variance,codes,beta,kernel_eigenvalues}
        fabricated                   (N_cs, p) DP rows the model was fitted on (DP runs only)

A cluster group is written under a temporary name and renamed into place, then marked
complete, so a reader never sees half a cluster and a rerun skips finished ones (resume).
Only DP data (fabricated or noisy rows) and models fitted on them are ever written here.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from functools import lru_cache
from pathlib import Path

import numpy as np
import zarr

from kahm_dask.deep import DeepKAHM

__all__ = [
    "cluster_name",
    "cluster_dir",
    "save_cluster",
    "load_cluster",
    "cached_cluster",
    "cluster_done",
    "write_manifest",
    "read_manifest",
]

MANIFEST_KEY = "kahm_dask_model"
_COMPLETE = "_COMPLETE.json"


def cluster_name(c: int, s: int) -> str:
    return f"c{c}_s{s}"


def cluster_dir(model_path: str | Path, c: int, s: int) -> Path:
    return Path(model_path) / "clusters" / cluster_name(c, s)


def cluster_done(model_path: str | Path, c: int, s: int) -> dict | None:
    """The task info of a finished cluster, or None if it is absent or incomplete."""
    marker = cluster_dir(model_path, c, s) / _COMPLETE
    if not marker.exists():
        return None
    return json.loads(marker.read_text())


def save_cluster(
    model_path: str | Path, c: int, s: int, model: DeepKAHM, info: dict, dp_rows: np.ndarray | None = None
) -> Path:
    """Write one cluster's model (and DP rows) atomically; returns the cluster directory."""
    final = cluster_dir(model_path, c, s)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex}"
    try:
        layer_states, meta = model.to_state()
        group = zarr.open_group(tmp, mode="w", zarr_format=3)
        scalars = []
        for k, (arrays, sc) in enumerate(layer_states):
            layer = group.create_group(f"layer{k}")
            for name, arr in arrays.items():
                layer.create_array(name, data=np.ascontiguousarray(arr))
            scalars.append(sc)
        if dp_rows is not None:
            group.create_array("fabricated", data=np.ascontiguousarray(dp_rows))
        group.attrs.update({"deep": meta, "layers": scalars, "info": info})
        if final.exists():  # an incomplete leftover of an interrupted run
            shutil.rmtree(final)
        os.replace(tmp, final)
        marker_tmp = final / f".{_COMPLETE}.tmp"
        marker_tmp.write_text(json.dumps(info))
        os.replace(marker_tmp, final / _COMPLETE)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_cluster(path: str | Path) -> DeepKAHM:
    """Read a cluster's DeepKAHM from its directory (must be complete)."""
    path = Path(path)
    if not (path / _COMPLETE).exists():
        raise FileNotFoundError(f"cluster model {path} is missing or incomplete.")
    group = zarr.open_group(path, mode="r", zarr_format=3)
    attrs = group.attrs.asdict()
    states = []
    for k, scalars in enumerate(attrs["layers"]):
        layer = group[f"layer{k}"]
        arrays = {name: layer[name][...] for name in layer.array_keys()}
        states.append((arrays, scalars))
    return DeepKAHM.from_state(states, attrs["deep"])


@lru_cache(maxsize=16)
def cached_cluster(path: str) -> DeepKAHM:
    """Per-process cache of loaded cluster models (prediction reads each many times)."""
    return load_cluster(path)


def write_manifest(model_path: str | Path, manifest: dict) -> None:
    group = zarr.open_group(model_path, mode="a", zarr_format=3)
    group.attrs[MANIFEST_KEY] = manifest


def read_manifest(model_path: str | Path) -> dict:
    path = Path(model_path)
    if not (path / "zarr.json").exists():
        raise FileNotFoundError(f"no model store at {path} (run `kahm-dask train` first).")
    attrs = zarr.open_group(path, mode="r", zarr_format=3).attrs.asdict()
    if MANIFEST_KEY not in attrs:
        raise ValueError(f"{path} is not a kahm-dask model store (no manifest).")
    return attrs[MANIFEST_KEY]
