"""Distributed prediction: per-cluster distances, a min over the clusters of each class, an
argmin over classes (the paper's Definitions 6–7; docs/algorithm.md#wide-kahm,
docs/algorithm.md#classifier) — a reduction, not a gather.

Test rows stay in Zarr (or the caller's dask array), chunked by rows. For every row chunk and
every home worker (:mod:`kahm_dask.pipeline.placement`), one task evaluates the cluster models
that worker is home to and gives an (m, C) block of per-class minima (:func:`_home_block`); a
blockwise minimum over the homes' blocks is the class distances, and ``argmin`` over classes runs
blockwise too. A routed class has one task per (row chunk, home of its clusters). Distances and
predictions are written back to Zarr.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np
import zarr
from threadpoolctl import threadpool_limits

from kahm_dask._validation import check_finite_rows
from kahm_dask.float32_bound import candidate_classes, certified_argmin, class_intervals
from kahm_dask.kahm import eval_dtype as check_eval_dtype
from kahm_dask.pipeline.cluster import compute
from kahm_dask.pipeline.cluster.progress import Progress
from kahm_dask.pipeline.placement import PlacedArray, as_placed, model_homes, placed, worker_addresses
from kahm_dask.pipeline.stores.manifest import read_manifest
from kahm_dask.pipeline.stores.model import cached_centre, cached_cluster, cluster_location
from kahm_dask.routing import routed_intervals, routed_minimum
from kahm_dask.storage.location import Location, LocationLike, as_location, committed_directory

__all__ = ["class_distance_array", "certified_code_array", "predict_to_store", "PREDICTIONS", "DISTANCES"]

PREDICTIONS = "predictions"
DISTANCES = "class_distances"


def _cluster_distances(x: np.ndarray, path: Location, eval_dtype: str) -> np.ndarray:
    """Γ (m,) of the rows ``x`` (m, p) under the cluster model at ``path`` (its cached copy).

    Evaluated in sub-blocks of query rows with all layers per sub-block while it is in cache,
    without keeping the layer images, so the temporaries stay O(sub-block · (N_b + p))
    whatever the Zarr chunk size; bit-identical to ``DeepKAHM._distance_rows`` in the same
    precision. The caller limits BLAS (once per task: a limit costs about 1 ms).
    """
    rows = np.ascontiguousarray(x, dtype=np.float64)
    return cached_cluster(path)._distance_rows(rows, dtype=eval_dtype)[0]


def _finite_block(x: np.ndarray, block_info=None) -> np.ndarray:
    """The block as float64, or ValueError naming the first NaN/inf (global row, column)."""
    offset = block_info[0]["array-location"][0][0] if block_info else 0
    return check_finite_rows(np.asarray(x, dtype=np.float64), "X", offset)


def _cluster_centres(paths: list[Location]) -> np.ndarray:
    """Routing centres (S, p) of the clusters at ``paths``, from this worker's cache (run in a
    task: the client never reads the model store)."""
    return np.stack([cached_centre(path) for path in paths])


def _routed_class_block(
    x: np.ndarray, paths: list[Location], n_probe: int, eval_dtype: str = "float64",
    here: tuple[int, ...] | None = None,
) -> np.ndarray:
    """``min`` over the ``n_probe`` clusters of nearest centre (of one class's clusters at
    ``paths``, their centres from :func:`_cluster_centres`) of Γ (m,) for the rows of ``x``
    (m, p): each cluster is evaluated on the rows that probe it (:func:`_cluster_distances` in
    ``eval_dtype``; the rule of :func:`~kahm_dask.routing.routed_minimum`, as in the estimator),
    and a cluster no row probes is not loaded. One task per (class, home, row chunk), so the
    graph grows with the workers, not with the clusters.

    ``here``: only the clusters of these indices are evaluated (those whose home is the worker
    this task is placed on, :mod:`kahm_dask.pipeline.placement`); a probe of another cluster
    counts as Γ = inf, and a row none of whose probes is here gets inf. The minimum over the
    tasks of a class's homes is the routed minimum of all its clusters, value for value.
    """
    def distance(s: int, rows: np.ndarray) -> np.ndarray:
        if here is not None and s not in here:
            return np.full(rows.shape[0], np.inf)
        return _cluster_distances(rows, paths[s], eval_dtype)

    with threadpool_limits(limits=1, user_api="blas"):
        return routed_minimum(x, _cluster_centres(paths), n_probe, distance)[0]


def _minimum_of(columns: list[da.Array]) -> da.Array:
    """The elementwise minimum of arrays of the same shape and chunks: one task per row chunk
    taking every array's block, so that no array's tasks are fused into it (they keep their
    homes, :mod:`kahm_dask.pipeline.placement`)."""
    if len(columns) == 1:
        return columns[0]
    return da.map_blocks(_elementwise_minimum, *columns, dtype=np.float64, meta=np.empty((0,) * columns[0].ndim))


def _elementwise_minimum(*blocks: np.ndarray) -> np.ndarray:
    return np.minimum.reduce(blocks)


def _home_block(x: np.ndarray, clusters: Sequence[tuple[int, Location]], n_classes: int,
                eval_dtype: str = "float64") -> np.ndarray:
    """(m, C) per-class minimum of Γ over the ``clusters`` (class index, path) that one worker is
    home to, for the rows of ``x`` (m, p); inf for a class with no cluster among them. One task
    per (row chunk, home): the minimum over the homes' blocks is the class distance."""
    out = np.full((x.shape[0], n_classes), np.inf)
    with threadpool_limits(limits=1, user_api="blas"):
        for c, path in clusters:
            np.minimum(out[:, c], _cluster_distances(x, path, eval_dtype), out=out[:, c])
    return out


def _with_columns(*blocks: np.ndarray, positions: tuple[int, ...], n_classes: int) -> np.ndarray:
    """(m, C) of the ``blocks``: first, optionally, the (m, C) block of the classes evaluated in
    full (:func:`_home_block`; without it every other column is inf), then the (m,) columns of the
    routed classes, put at their class indices ``positions``."""
    grouped = blocks[0] if blocks[0].ndim == 2 else None
    columns = blocks if grouped is None else blocks[1:]
    out = np.full((len(columns[0]), n_classes), np.inf) if grouped is None else grouped.copy()
    for column, c in zip(columns, positions, strict=True):
        out[:, c] = column
    return out


def class_distance_array(
    model_path: LocationLike,
    X: da.Array,
    *,
    n_probe: int | None = None,
    eval_dtype: str = "float64",
    storage_options: Mapping[str, Any] | None = None,
    workers: Sequence[str] | None = None,
    trained_on: Mapping[tuple[int, int], str | None] | None = None,
) -> PlacedArray:
    """Lazy (m, C) per-class distances ``min_s Γ_{D_{c,s}}`` for the rows of ``X`` (m, p).

    ``model_path`` is a path or a URL read with fsspec ``storage_options`` (the tasks get the
    URL and the options, and open the cluster models themselves). ``n_probe`` routes
    (docs/algorithm.md#routing): per class, each row is evaluated on the ``n_probe`` clusters
    whose centres are nearest to it and the minimum is over those; None or ``n_probe ≥`` a
    class's clusters evaluates all of them. ``eval_dtype``: the precision of the kernel blocks
    in the tasks, "float64" or "float32" (docs/algorithm.md#evaluation-precision); the
    distances are float64 either way.

    ``workers``: the addresses of the Dask workers that will compute the array. Each cluster
    model then has a home among them and its tasks prefer it, so each model is loaded by one
    worker and stays in its cache: the worker that trained it, where ``trained_on`` maps every
    (class code, cluster) to a worker among ``workers`` (the fit leaves the model in that
    worker's cache), else :func:`~kahm_dask.pipeline.placement.model_homes` (by rows). The
    clusters evaluated in full make one task per (row chunk, home) (:func:`_home_block`); a
    routed class one per (row chunk, home of its clusters); the homes' blocks are reduced by a
    minimum. None: one task per row chunk, placed by the scheduler. The values are the same
    either way. The result is a :class:`~kahm_dask.pipeline.placement.PlacedArray`: computed as
    built, so the homes hold also when the caller computes it.
    """
    check_eval_dtype(eval_dtype, "class_distance_array")
    X, plan = _placed_models(model_path, X, storage_options, workers, trained_on)
    n_classes, paths = plan.n_classes, plan.paths
    routed = plan.routed(n_probe)
    by_home = plan.by_home(set(paths) - set(routed))
    blocks = []
    for home, clusters in sorted(by_home.items(), key=lambda item: str(item[0])):
        with placed(home):
            blocks.append(X.map_blocks(_home_block, clusters, n_classes, eval_dtype, dtype=np.float64,
                                       chunks=(X.chunks[0], (n_classes,)), meta=np.empty((0, 0)), token="kahm-home"))
    grouped = _minimum_of(blocks) if blocks else None
    if not routed:
        return as_placed(grouped)
    columns = []
    for c in routed:
        parts = []
        for home, here in plan.homes_of(c):
            with placed(home):
                parts.append(X.map_blocks(_routed_class_block, paths[c], n_probe, eval_dtype, here,
                                          drop_axis=1, dtype=np.float64, meta=np.empty((0,)),
                                          token=f"kahm-routed-c{c}"))
        columns.append(_minimum_of(parts))
    pairs = ([grouped, "ij"] if grouped is not None else []) + [a for column in columns for a in (column, "i")]
    D = da.blockwise(_with_columns, "ij", *pairs, positions=tuple(routed), n_classes=n_classes, dtype=np.float64,
                     meta=np.empty((0, 0)), concatenate=True,
                     **({} if grouped is not None else {"new_axes": {"j": n_classes}}))
    return as_placed(D)


@dataclass(frozen=True)
class _Plan:
    """Where the cluster models of a model store are evaluated: ``paths[c]`` the locations of
    class code c's models, ``home_of[c]`` their home workers (None without workers)."""

    n_classes: int
    paths: dict[int, list[Location]]
    home_of: dict[int, list[str | None]]

    def by_home(self, classes: set[int]) -> dict[str | None, list[tuple[int, Location]]]:
        """(class code, location) of every model of ``classes``, by home."""
        out: dict[str | None, list[tuple[int, Location]]] = {}
        for c in sorted(classes):
            for path, home in zip(self.paths[c], self.home_of[c], strict=True):
                out.setdefault(home, []).append((c, path))
        return out

    def routed(self, n_probe: int | None) -> list[int]:
        """The class codes ``n_probe`` routes: those with more than ``n_probe`` clusters."""
        if n_probe is None:
            return []
        return [c for c, class_paths in sorted(self.paths.items()) if n_probe < len(class_paths)]

    def homes_of(self, c: int) -> list[tuple[str | None, tuple[int, ...] | None]]:
        """The homes of class code c's clusters (by name) and, for each, the indices of the
        clusters it is home to (None without workers: every cluster)."""
        return [(home, None if home is None else tuple(s for s, h in enumerate(self.home_of[c]) if h == home))
                for home in sorted(set(self.home_of[c]), key=str)]

    def home_models(self, n_probe: int | None) -> list[tuple[str | None, _HomeModels]]:
        """Every home (by name) and the models it evaluates, with ``n_probe`` routing."""
        routed = self.routed(n_probe)
        in_full = self.by_home(set(self.paths) - set(routed))
        routed_at: dict[str | None, list] = {}
        for c in routed:
            for home, here in self.homes_of(c):
                routed_at.setdefault(home, []).append((c, tuple(self.paths[c]), here))
        return [(home, _HomeModels(tuple(in_full.get(home, ())), tuple(routed_at.get(home, ()))))
                for home in sorted(set(in_full) | set(routed_at), key=str)]


@dataclass(frozen=True)
class _HomeModels:
    """The models one home evaluates: ``clusters`` (class code, location), each on every row,
    and per routed class c ``(c, the locations of all of c's clusters, the indices of those whose
    home this is (None: all))``, each on the rows that probe it (:func:`_routed_class_block`)."""

    clusters: tuple[tuple[int, Location], ...]
    routed: tuple[tuple[int, tuple[Location, ...], tuple[int, ...] | None], ...]


def _placed_models(model_path: LocationLike, X: da.Array, storage_options, workers,
                   trained_on) -> tuple[da.Array, _Plan]:
    """X (m, p) checked against the model store at ``model_path`` (one column chunk, every block
    checked finite) and the store's :class:`_Plan` (homes as in :func:`class_distance_array`)."""
    model_path = as_location(model_path, storage_options)
    manifest = read_manifest(model_path)
    if X.ndim != 2 or X.shape[1] != manifest["n_features"]:
        raise ValueError(
            f"X has shape {X.shape}; the model expects (m, {manifest['n_features']})."
        )
    X = X.rechunk({1: -1}).map_blocks(_finite_block, dtype=np.float64, meta=np.empty((0, 0)))
    entries = sorted(manifest["clusters"], key=lambda e: (e["class"], e["cluster"]))
    homes = _homes(entries, workers, trained_on)
    paths: dict[int, list[Location]] = {}
    home_of: dict[int, list[str | None]] = {}
    for entry, home in zip(entries, homes, strict=True):
        paths.setdefault(entry["class"], []).append(cluster_location(model_path, entry["class"], entry["cluster"]))
        home_of.setdefault(entry["class"], []).append(home)
    return X, _Plan(len(manifest["classes"]), paths, home_of)


def _home_intervals(x: np.ndarray, models: _HomeModels, n_classes: int, n_probe: int | None) -> np.ndarray:
    """(m, 2C) ``[lower | upper]``: per class, the minimum over the ``models`` of one home of
    ``Γ − b`` and ``Γ + b``, Γ the float32 distances of the rows of ``x`` (m, p) and b their proven
    bound (docs/algorithm.md#float32-error-bound), a routed class's clusters only on the rows that
    probe them (:func:`~kahm_dask.routing.routed_intervals`); +inf for a class with no model
    here. The minimum over the homes' blocks bounds the float64 class distances."""
    rows = np.ascontiguousarray(x, dtype=np.float64)
    out = np.full((x.shape[0], 2 * n_classes), np.inf)

    def bounded(path: Location, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        g, b = cached_cluster(path)._distances_with_bound(queries, "float32")
        return (g, *class_intervals(g, b))

    def class_intervals_here() -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        for c, path in models.clusters:
            yield c, *bounded(path, rows)[1:]
        for c, paths, here in models.routed:
            def interval(s: int, queries: np.ndarray, paths=paths, here=here):
                if here is not None and s not in here:  # another home's cluster
                    return (np.full(queries.shape[0], np.inf),) * 3
                return bounded(paths[s], queries)

            yield c, *routed_intervals(rows, _cluster_centres(list(paths)), n_probe, interval)[1:]

    with threadpool_limits(limits=1, user_api="blas"):
        for c, lower, upper in class_intervals_here():
            np.minimum(out[:, c], lower, out=out[:, c])
            np.minimum(out[:, n_classes + c], upper, out=out[:, n_classes + c])
    return out


def _home_block_again(x: np.ndarray, intervals: np.ndarray, models: _HomeModels, n_classes: int,
                      n_probe: int | None) -> np.ndarray:
    """(m, C) float64 distances, over the ``models`` of one home, of the rows the (m, 2C)
    ``intervals`` do not decide, each only under the classes that may still be its
    (:func:`~kahm_dask.float32_bound.candidate_classes`; a routed class over the clusters each row
    probes, as :func:`_routed_class_block`); +inf everywhere else (nothing evaluated when every
    row is decided)."""
    lower, upper = intervals[:, :n_classes], intervals[:, n_classes:]
    out = np.full((x.shape[0], n_classes), np.inf)
    again = np.flatnonzero(certified_argmin(lower, upper) < 0)
    if not again.size:
        return out
    candidates = candidate_classes(lower[again], upper[again])
    rows = np.ascontiguousarray(x, dtype=np.float64)
    with threadpool_limits(limits=1, user_api="blas"):
        for c, path in models.clusters:
            which = again[candidates[:, c]]
            if which.size:
                out[which, c] = np.minimum(out[which, c], _cluster_distances(rows[which], path, "float64"))
        for c, paths, here in models.routed:
            which = again[candidates[:, c]]
            if which.size:
                out[which, c] = np.minimum(out[which, c],
                                           _routed_class_block(rows[which], list(paths), n_probe, "float64", here))
    return out


def _resolved_codes(intervals: np.ndarray, distances: np.ndarray) -> np.ndarray:
    """(m,) class codes: those the (m, 2C) ``intervals`` decide, and for the other rows the argmin
    of their float64 ``distances`` (m, C) (+inf outside the candidate classes)."""
    n_classes = distances.shape[1]
    codes = certified_argmin(intervals[:, :n_classes], intervals[:, n_classes:])
    return np.where(codes >= 0, codes, np.argmin(distances, axis=1))


def certified_code_array(
    model_path: LocationLike,
    X: da.Array,
    *,
    storage_options: Mapping[str, Any] | None = None,
    workers: Sequence[str] | None = None,
    trained_on: Mapping[tuple[int, int], str | None] | None = None,
    n_probe: int | None = None,
) -> PlacedArray:
    """Lazy (m,) predicted class codes of the rows of ``X`` (m, p) by the certified prediction
    (docs/algorithm.md#certified-prediction): equal to the argmin of the float64
    :func:`class_distance_array` with the same ``n_probe``, every model of single layer.

    Per row chunk: one task per home evaluates its models in float32 with the proven bound
    (:func:`_home_intervals`), their minimum bounds the float64 class distances, which decide the
    class of most rows (:func:`~kahm_dask.float32_bound.certified_argmin`); one more task per home
    evaluates only the undecided rows in float64, under the classes that may still be theirs
    (:func:`_home_block_again`), and the minimum over the homes settles them (:func:`_resolved_codes`).
    ``workers`` and ``trained_on`` place the tasks as in :func:`class_distance_array`; a routed
    class is evaluated in the tasks of its clusters' homes, each cluster on the rows that probe it.
    """
    X, plan = _placed_models(model_path, X, storage_options, workers, trained_on)
    C = plan.n_classes
    homes = plan.home_models(n_probe)
    bounds = []
    for home, models in homes:
        with placed(home):
            bounds.append(X.map_blocks(_home_intervals, models, C, n_probe, dtype=np.float64,
                                       chunks=(X.chunks[0], (2 * C,)), meta=np.empty((0, 0)), token="kahm-home-f32"))
    intervals = _minimum_of(bounds)
    again = []
    for home, models in homes:
        with placed(home):
            again.append(da.blockwise(_home_block_again, "ij", X, "ik", intervals, "il", models, None, C, None,
                                      n_probe, None, new_axes={"j": C}, concatenate=True, dtype=np.float64,
                                      meta=np.empty((0, 0)), token="kahm-home-again"))
    resolved = da.blockwise(_resolved_codes, "i", intervals, "il", _minimum_of(again), "ij", concatenate=True,
                            dtype=np.int64, meta=np.empty((0,), np.int64))
    return as_placed(resolved)


def _homes(entries: list[dict], workers: Sequence[str] | None,
           trained_on: Mapping[tuple[int, int], str | None] | None) -> list[str | None]:
    """The home worker of each cluster ``entries[i]`` (class code, cluster, rows): the worker
    that trained it when ``trained_on`` names one among ``workers`` for every cluster, else
    :func:`~kahm_dask.pipeline.placement.model_homes`; None for each without ``workers``."""
    if not workers:
        return [None] * len(entries)
    if trained_on is not None:
        found = [trained_on.get((e["class"], e["cluster"])) for e in entries]
        if all(home in workers for home in found):
            return found
    return model_homes([e["n_rows"] for e in entries], list(workers))


#: Attribute that marks a Zarr group as a prediction store (a later prediction may replace it).
PREDICTION_MARK = "kahm_dask_predictions"


def check_prediction_target(out: Location) -> None:
    """Raise FileExistsError unless ``out`` is free or a prediction store written here."""
    if not out.exists():
        return
    try:
        attrs = zarr.open_group(out.zarr_store(read_only=True), mode="r", zarr_format=3).attrs.asdict()
    except (ValueError, FileNotFoundError, NotADirectoryError, OSError):
        attrs = {}
    if not attrs.get(PREDICTION_MARK) and not {"classes"} <= set(attrs):
        raise FileExistsError(f"{out} exists and is not a kahm-dask prediction store; choose another path "
                              "or delete it yourself.")


def predict_to_store(
    model_path: LocationLike,
    X: da.Array,
    out_path: LocationLike,
    client=None,
    *,
    progress: Progress | bool = False,
    n_probe: int | None = None,
    eval_dtype: str = "float64",
    storage_options: Mapping[str, Any] | None = None,
    trained_on: Mapping[tuple[int, int], str | None] | None = None,
) -> zarr.Group:
    """Compute distances (m, C) and predicted class codes (m,) into the Zarr group ``out_path``.

    ``out_path`` must be free or hold earlier predictions (a prediction store is replaced, any
    other file or folder is refused before anything runs).
    Runs on ``client`` if given (with a progress bar if ``progress``), else on the default
    scheduler; ``n_probe`` routes, ``eval_dtype`` sets the precision and ``trained_on`` names
    the workers that trained the models as in :func:`class_distance_array`. Written under a temporary
    name and renamed into place when complete
    (:func:`kahm_dask.storage.atomic.atomic_directory`): a failed job leaves the previous predictions
    untouched (on an object store: written in place, marker last,
    :func:`~kahm_dask.storage.location.committed_directory`). Paths may be URLs, read and
    written with fsspec ``storage_options``. Returns the written group, whose attributes hold
    ``classes`` (the labels the codes index).
    """
    model_path = as_location(model_path, storage_options)
    out = as_location(out_path, storage_options)
    check_prediction_target(out)
    D = class_distance_array(model_path, X, n_probe=n_probe, eval_dtype=eval_dtype,
                             workers=worker_addresses(client), trained_on=trained_on)
    codes = D.argmin(axis=1).astype(np.int64)
    with committed_directory(out) as tmp:
        group = zarr.open_group(tmp.zarr_store(), mode="w", zarr_format=3)
        d_arr = group.create_array(DISTANCES, shape=D.shape, dtype=np.float64, chunks=(D.chunks[0][0], D.shape[1]))
        p_arr = group.create_array(PREDICTIONS, shape=codes.shape, dtype=np.int64, chunks=(codes.chunks[0][0],))
        compute(da.store([D, codes], [d_arr, p_arr], lock=False, compute=False), client, progress=progress,
                label=f"predict {D.shape[0]} rows", optimize_graph=False)  # keeps the homes (placement)
        group.attrs.update({"classes": read_manifest(model_path)["classes"], PREDICTION_MARK: True})
    return zarr.open_group(out.zarr_store(read_only=True), mode="r", zarr_format=3)
