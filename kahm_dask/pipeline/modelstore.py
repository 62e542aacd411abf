"""The model store: one Zarr group per (class, cluster) DeepKAHM, written atomically.

Layout (zarr v3, local filesystem)::

    <model>.zarr/
      zarr.json                      attributes "kahm_dask_model": manifest (params, the public
                                     k-means seed, versions, classes, cluster table, and for
                                     a DP run the release id and the privacy statement)
      clusters/c{c}_s{s}/            one trained cluster (a complete group or absent)
        zarr.json                    attributes: deep-KAHM meta, layer scalars, cluster info
                                     (class, cluster, n_rows, layer_dims, and the smoother
                                     passes unless they depend on private rows; no timing)
        layer{k}/{mean,components,explained_variance,codes,beta,kernel_eigenvalues}
        fabricated                   (N_cs, p) DP rows the model was fitted on (DP runs only)

A cluster group is written with its completion marker under a temporary name and renamed
into place in one step, so a reader never sees half a cluster, a complete cluster is never
replaced, and a rerun skips finished ones (resume).
In a DP run only DP data (fabricated or noisy rows), models fitted on them and public settings
are written here: nothing else computed from private rows.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np
import zarr

from kahm_dask._atomic import sibling_path
from kahm_dask.deep import DeepKAHM

__all__ = [
    "cluster_name",
    "cluster_dir",
    "save_cluster",
    "load_cluster",
    "cached_cluster",
    "cluster_centre",
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
    """The task info of a finished cluster, or None if it is absent or incomplete.

    An unreadable marker (a file damaged outside this library) counts as incomplete, so a
    rerun retrains that cluster instead of failing.
    """
    return _read_marker(cluster_dir(model_path, c, s))


def _read_marker(directory: Path) -> dict | None:
    try:
        info = json.loads((directory / _COMPLETE).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return info if isinstance(info, dict) else None


def save_cluster(
    model_path: str | Path, c: int, s: int, model: DeepKAHM, info: dict, dp_rows: np.ndarray | None = None
) -> Path:
    """Write one cluster's model (and DP rows) atomically; returns the cluster directory.

    The group *and its completion marker* are written under a temporary name, then the
    directory is renamed into place: a reader sees no cluster or a complete one, never a
    partial one. If the cluster is already complete (another execution of this pure task
    won, e.g. a task re-run after its worker was presumed dead), the new copy is discarded:
    a complete cluster is never deleted or replaced.
    """
    final = cluster_dir(model_path, c, s)
    if cluster_done(model_path, c, s) is not None:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = sibling_path(final, "tmp")
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
        (tmp / _COMPLETE).write_text(json.dumps(info))
        _commit(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _commit(tmp: Path, final: Path, attempts: int = 5) -> None:
    """Rename the complete directory ``tmp`` to ``final`` unless a complete ``final`` exists.

    ``rename`` of a directory onto a non-empty one fails atomically. An incomplete ``final``
    (left by a writer of an older version killed between its rename and its marker) is moved
    aside first; a complete one means another execution already committed the same result.
    """
    for _ in range(attempts):
        try:
            os.rename(tmp, final)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        if _read_marker(final) is not None:
            return
        trash = sibling_path(final, "old")
        try:
            os.rename(final, trash)
        except FileNotFoundError:
            continue
        shutil.rmtree(trash, ignore_errors=True)
    raise OSError(f"could not commit cluster {final}: other writers kept replacing it.")


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


def cluster_centre(path: str | Path) -> np.ndarray:
    """The routing centre (p,) of a stored cluster: the mean of its training rows (the first
    layer's ``mean_``; every layer models the same rows), read without loading the model."""
    return zarr.open_array(Path(path) / "layer0" / "mean", mode="r")[...]


def cached_cluster(path: str) -> DeepKAHM:
    """Per-process cache of loaded cluster models (prediction reads each many times).

    Keyed by the path *and* the identity of its completion marker (inode, mtime, size), so
    a long-lived worker reloads a cluster that was retrained at the same path.
    """
    try:
        st = (Path(path) / _COMPLETE).stat()
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"cluster model {path} is missing or incomplete.") from None
    key = (str(path), st.st_ino, st.st_mtime_ns, st.st_size)
    with _CACHE_LOCK:
        model = _CACHE.get(key)
        if model is not None:
            _CACHE.move_to_end(key)
            return model
    model = load_cluster(path)
    with _CACHE_LOCK:
        _CACHE[key] = model
        while len(_CACHE) > 1 and sum(_model_bytes(m) for m in _CACHE.values()) > MODEL_CACHE_BYTES:
            _CACHE.popitem(last=False)
    return model


#: Byte budget of the per-process model cache. A cluster model holds N_b × (p + 1) floats per
#: distinct layer (33 MB for N_b = 1000, p = 4096), so a count-based cache can exhaust a worker.
MODEL_CACHE_BYTES = int(os.environ.get("KAHM_DASK_MODEL_CACHE_MB", "128")) * 2**20
_CACHE: OrderedDict = OrderedDict()
_CACHE_LOCK = threading.Lock()


def _model_bytes(model: DeepKAHM) -> int:
    layers = {id(layer): layer for layer in model.layers_}.values()
    return sum(layer.beta_.nbytes + layer.codes_.nbytes + layer.components_.nbytes for layer in layers)


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
