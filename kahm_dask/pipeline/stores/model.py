"""The model store: one Zarr group per (class, cluster) DeepKAHM, written atomically.

Layout (zarr v3, on the local filesystem or at a URL fsspec reaches, with ``storage_options``:
:mod:`kahm_dask.storage.location`)::

    <model>.zarr/
      zarr.json                      attributes "kahm_dask_model": the manifest
                                     (:mod:`kahm_dask.pipeline.stores.manifest`)
      clusters/c{c}_s{s}/            one trained cluster (a complete group or absent)
        zarr.json                    attributes: deep-KAHM meta, layer scalars, cluster info
                                     (class, cluster, n_rows, layer_dims, and the smoother
                                     passes unless they depend on private rows; no timing)
        layer{k}/{mean,components,explained_variance,codes,beta,kernel_eigenvalues}
                                     (zstd level 1, chunks of whole rows up to 8 MiB:
                                     kahm_dask.storage.codecs)
        dp_rows                      (N_cs, p) DP rows the model was fitted on, noisy or
                                     fabricated (DP runs only; "fabricated" in stores
                                     written before it was renamed, still read)

A cluster group is written with its completion marker under a temporary name and renamed
into place in one step, so a reader never sees half a cluster, a complete cluster is never
replaced, and a rerun skips finished ones (resume). Object stores have no rename: there a
cluster is written in its final place with its marker ``_COMPLETE.json`` last (a reader treats a
cluster without it as absent), and a remote model store is complete only with its own top-level
``_COMPLETE.json``, written last (:func:`mark_model_complete`; ``read_manifest`` refuses a
remote store without it).
In a DP run only DP data (fabricated or noisy rows), models fitted on them and public settings
are written here: nothing else computed from private rows.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from json import JSONDecodeError
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.api import asynchronous as zarr_async
from zarr.core.sync import sync  # Zarr's own bridge from synchronous code to its event loop

from kahm_dask.deep import DeepKAHM
from kahm_dask.pipeline.cluster.plugins import current_worker, is_small_worker
from kahm_dask.storage.atomic import sibling_path
from kahm_dask.storage.codecs import ARRAY_CODECS, model_chunks
from kahm_dask.storage.location import COMPLETE_FILE, Location, LocationLike, as_location

__all__ = [
    "cluster_name",
    "cluster_dir",
    "cluster_location",
    "save_cluster",
    "load_cluster",
    "cached_cluster",
    "cached_centre",
    "model_cache_bytes",
    "remember_trained_cluster",
    "cluster_centre",
    "cluster_done",
    "mark_model_complete",
    "DP_ROWS",
    "dp_rows_array",
]

_COMPLETE = COMPLETE_FILE
Options = Mapping[str, Any] | None

#: The array of a cluster group holding the DP rows its model was fitted on.
DP_ROWS = "dp_rows"

#: Its name in model stores written before the noisy rows became the default DP rows.
_LEGACY_DP_ROWS = "fabricated"


def dp_rows_array(group: zarr.Group) -> zarr.Array | None:
    """The DP rows array of the cluster group ``group`` (either name), or None in a
    non-private model store."""
    for name in (DP_ROWS, _LEGACY_DP_ROWS):
        if name in group:
            return group[name]
    return None


def cluster_name(c: int, s: int) -> str:
    return f"c{c}_s{s}"


def cluster_dir(model_path: str | Path, c: int, s: int) -> Path:
    """The local directory of cluster (c, s) of the model store at the local ``model_path``."""
    return Path(model_path) / "clusters" / cluster_name(c, s)


def cluster_location(model_path: LocationLike, c: int, s: int, storage_options: Options = None) -> Location:
    """Where cluster (c, s) of the model store at ``model_path`` (a path or URL) is."""
    return as_location(model_path, storage_options) / f"clusters/{cluster_name(c, s)}"


def cluster_done(model_path: LocationLike, c: int, s: int, storage_options: Options = None) -> dict | None:
    """The task info of a finished cluster, or None if it is absent or incomplete.

    An unreadable marker (a file damaged outside this library) counts as incomplete, so a
    rerun retrains that cluster instead of failing.
    """
    return _read_marker(cluster_location(model_path, c, s, storage_options))


def _read_marker(directory: LocationLike) -> dict | None:
    try:
        info = (as_location(directory) / _COMPLETE).read_json()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, JSONDecodeError, UnicodeDecodeError):
        return None
    return info if isinstance(info, dict) else None


def save_cluster(
    model_path: LocationLike,
    c: int,
    s: int,
    model: DeepKAHM,
    info: dict,
    dp_rows: np.ndarray | None = None,
    *,
    storage_options: Options = None,
) -> Path | str:
    """Write one cluster's model (and DP rows) atomically; returns the cluster directory (its
    URL for a remote model store).

    The group *and its completion marker* are written under a temporary name, then the
    directory is renamed into place: a reader sees no cluster or a complete one, never a
    partial one. If the cluster is already complete (another execution of this pure task
    won, e.g. a task re-run after its worker was presumed dead), the new copy is discarded:
    a complete cluster is never deleted or replaced. On an object store (no rename) the group
    is written in place and the marker last; a failed write is deleted unless another
    execution completed the cluster.
    """
    final = cluster_location(model_path, c, s, storage_options)
    if _read_marker(final) is not None:
        return final.public()
    if not final.is_local:
        try:
            _write_cluster(final, model, info, dp_rows)
        except BaseException:
            if _read_marker(final) is None:
                final.remove()
            raise
        return final.url
    final.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = sibling_path(final.path, "tmp")
    try:
        _write_cluster(as_location(tmp), model, info, dp_rows)
        _commit(tmp, final.path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final.path


def _write_cluster(where: Location, model: DeepKAHM, info: dict, dp_rows: np.ndarray | None) -> None:
    """Write the cluster group (layers, DP rows, attributes) at ``where``, then its marker."""
    layer_states, meta = model.to_state()
    sync(_write_group(where.zarr_store(), layer_states, meta, info, dp_rows))
    (where / _COMPLETE).write_json(info)


async def _write_group(store, layer_states: list, meta: dict, info: dict, dp_rows: np.ndarray | None) -> None:
    """The group's arrays, written concurrently (written one after another, each small array
    took about 4 ms, most of it waiting on its files), then its attributes in one metadata
    write (one per attribute before)."""
    group = await zarr_async.open_group(store, mode="a", zarr_format=3)
    layers = [await group.require_group(f"layer{k}") for k in range(len(layer_states))]
    writes = [
        layer.create_array(name, data=np.ascontiguousarray(arr), chunks=model_chunks(arr), overwrite=True,
                           **ARRAY_CODECS)
        for layer, (arrays, _) in zip(layers, layer_states, strict=True) for name, arr in arrays.items()
    ]
    if dp_rows is not None:
        writes.append(group.create_array(DP_ROWS, data=np.ascontiguousarray(dp_rows), overwrite=True, **ARRAY_CODECS))
    await _all(writes)
    await group.update_attributes({"deep": meta, "layers": [sc for _, sc in layer_states], "info": info})


def _commit(tmp: Path, final: Path, attempts: int = 5) -> None:
    """Rename the complete directory ``tmp`` to ``final`` unless a complete ``final`` exists.

    ``rename`` of a directory onto a non-empty one fails atomically. An incomplete ``final``
    (left by a writer killed between its rename and its marker) is moved
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


def load_cluster(path: LocationLike, storage_options: Options = None) -> DeepKAHM:
    """Read a cluster's DeepKAHM from its directory or URL (must be complete)."""
    path = as_location(path, storage_options)
    if not (path / _COMPLETE).exists():
        raise FileNotFoundError(f"cluster model {path} is missing or incomplete.")
    states, meta = sync(_read_group(path.zarr_store(read_only=True)))
    return DeepKAHM.from_state(states, meta)


async def _read_group(store) -> tuple[list, dict]:
    """The layer states and the deep-KAHM meta of a cluster group, its arrays read concurrently."""
    group = await zarr_async.open_group(store, mode="r", zarr_format=3)
    attrs = group.attrs

    async def read_layer(k: int) -> dict[str, np.ndarray]:
        layer = await group.getitem(f"layer{k}")
        names = [name async for name in layer.array_keys()]
        arrays = await _all([_read_array(layer, name) for name in names])
        return dict(zip(names, arrays, strict=True))

    layers = await _all([read_layer(k) for k in range(len(attrs["layers"]))])
    return list(zip(layers, attrs["layers"], strict=True)), attrs["deep"]


async def _all(aws: list) -> list:
    """The results of the awaitables ``aws``, run concurrently; if any fails, its error is raised
    once *all* have ended (none still writes into a directory the caller then deletes)."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


async def _read_array(group, name: str) -> np.ndarray:
    array = await group.getitem(name)
    return await array.getitem(...)


def cluster_centre(path: LocationLike, storage_options: Options = None) -> np.ndarray:
    """The routing centre (p,) of a stored cluster: the mean of its training rows (the first
    layer's ``mean_``; every layer models the same rows), read without loading the model."""
    mean = as_location(path, storage_options) / "layer0/mean"
    return zarr.open_array(mean.zarr_store(read_only=True), mode="r", zarr_format=3)[...]


def _cache_key(path: Location) -> tuple:
    """The cache key of a stored cluster: its path *and* the identity of its completion marker
    (local: inode, mtime, size; remote: size and ETag or modification time), so a long-lived
    worker reloads a cluster that was retrained at the same path."""
    try:
        stamp = (path / _COMPLETE).stamp()
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"cluster model {path} is missing or incomplete.") from None
    return (str(path), *stamp)


def cached_cluster(path: LocationLike, storage_options: Options = None) -> DeepKAHM:
    """Per-process cache of loaded cluster models (prediction reads each many times), keyed by
    :func:`_cache_key` and held within :func:`model_cache_bytes` (least recently used out)."""
    path = as_location(path, storage_options)
    key = _cache_key(path)
    model = _recall(_CACHE, key)
    if model is None:
        model = load_cluster(path)
        _remember(_CACHE, key, model, _model_bytes, model_cache_bytes())
    return model


def remember_trained_cluster(model: DeepKAHM, written: LocationLike, served: LocationLike) -> None:
    """Put a cluster model this process has just written at ``written`` (a staged model store)
    in its model cache under the key it has once the store is committed at ``served``, so that a
    prediction on the worker that trained it loads nothing.

    The staged store becomes the committed one by a rename, which keeps the completion marker's
    inode, modification time and size (:func:`_cache_key`); elsewhere (a copy to another file
    system or an object store) the key would never match, and nothing is put; nor on a worker with
    a memory limit below :data:`~kahm_dask.pipeline.cluster.plugins.MIN_MEMORY_LIMIT`
    (:func:`~kahm_dask.pipeline.cluster.plugins.is_small_worker`), whose
    training tasks need that memory (the 1 GiB workers of the larger-than-memory run). The cached
    model is built from the state that was written, as :func:`load_cluster` builds it from the
    state read.
    """
    written, served = as_location(written), as_location(served)
    worker = current_worker()
    if not (written.is_local and served.is_local) or (worker is not None and is_small_worker(worker)):
        return
    layer_states, meta = model.to_state()
    states = [({name: np.ascontiguousarray(a) for name, a in arrays.items()}, sc) for arrays, sc in layer_states]
    key = (str(served), *(written / _COMPLETE).stamp())
    _remember(_CACHE, key, DeepKAHM.from_state(states, meta), _model_bytes, model_cache_bytes())


def cached_centre(path: LocationLike, storage_options: Options = None) -> np.ndarray:
    """The routing centre (p,) of a stored cluster (:func:`cluster_centre`), kept per process
    and keyed like the models, so that a routed prediction reads each centre once per worker,
    not once per call: from the model cache when the model is there, else from the store.

    The centres take p floats per cluster (9 MB for 269 clusters of 4096 features) and are held
    within :data:`CENTRE_CACHE_SHARE` of :func:`model_cache_bytes`.
    """
    path = as_location(path, storage_options)
    key = _cache_key(path)
    centre = _recall(_CENTRES, key)
    if centre is None:
        with _CACHE_LOCK:
            model = _CACHE.get(key)
        centre = model.layers_[0].mean_ if model is not None else cluster_centre(path)
        _remember(_CENTRES, key, centre, _nbytes, CENTRE_CACHE_SHARE * model_cache_bytes())
    return centre


def _recall(cache: OrderedDict, key: tuple) -> Any:
    """The value ``cache`` holds for ``key``, now its most recently used (None if absent)."""
    with _CACHE_LOCK:
        value = cache.get(key)
        if value is not None:
            cache.move_to_end(key)
        return value


def _remember(cache: OrderedDict, key: tuple, value: Any, size: Callable[[Any], int], budget: float) -> None:
    """Put ``value`` in ``cache`` and drop the least recently used values while the cache holds
    more than ``budget`` bytes (``size`` of each value), keeping at least one."""
    with _CACHE_LOCK:
        cache[key] = value
        held = sum(size(v) for v in cache.values())
        while len(cache) > 1 and held > budget:
            held -= size(cache.popitem(last=False)[1])


def _nbytes(array: np.ndarray) -> int:
    return array.nbytes


#: Share of a Dask worker's memory limit given to its model cache. A cluster model holds
#: N_b × (p + 1) floats per distinct layer (33 MB for N_b = 1000, p = 4096), and the cache is
#: memory the worker cannot spill: an eighth leaves the rest to the task data below the
#: worker's 60 % spill threshold.
MODEL_CACHE_FRACTION = 1 / 8
#: The budget outside a Dask worker, or in a worker without a memory limit.
MODEL_CACHE_DEFAULT_BYTES = 128 * 2**20


def model_cache_bytes() -> int:
    """Byte budget of this process's model cache: ``KAHM_DASK_MODEL_CACHE_MB`` if set, else
    :data:`MODEL_CACHE_FRACTION` of the memory limit of the Dask worker running the caller, else
    :data:`MODEL_CACHE_DEFAULT_BYTES`."""
    env = os.environ.get("KAHM_DASK_MODEL_CACHE_MB")
    if env:
        return int(env) * 2**20
    worker = current_worker()
    limit = None if worker is None else worker.memory_manager.memory_limit
    return int(MODEL_CACHE_FRACTION * limit) if limit else MODEL_CACHE_DEFAULT_BYTES


#: Share of the model cache's budget that the routing centres may take besides it.
CENTRE_CACHE_SHARE = 1 / 8

_CACHE: OrderedDict = OrderedDict()
_CENTRES: OrderedDict = OrderedDict()
_CACHE_LOCK = threading.Lock()


def _model_bytes(model: DeepKAHM) -> int:
    layers = {id(layer): layer for layer in model.layers_}.values()
    return sum(layer.beta_.nbytes + layer.codes_.nbytes + layer.components_.nbytes for layer in layers)


def mark_model_complete(model_path: LocationLike, *, storage_options: Options = None) -> None:
    """Write the top-level completion marker of a model store (last, when every cluster is
    written). A remote store's readers require it; a local store is complete once it is moved
    to its final path, and the marker lets a staged copy be told from a finished one."""
    path = as_location(model_path, storage_options)
    (path / _COMPLETE).write_json({"complete": True, "time": datetime.now(UTC).isoformat()})
