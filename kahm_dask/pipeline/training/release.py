"""The DP stage of a training run: the bounds of the release, the one release sequence
(:func:`~kahm_dask.privacy.release.begin_release`: plan, the ledger, spent on the rows before any noise
is drawn), and the noisy rows, drawn blockwise and stored in the work store once per release.

Stored noise is bound to the rows it was drawn for (their ``order`` fingerprint, in the marker of
``X_noisy``): a resumed run on the same rows continues the release (not drawn, not charged again);
on other rows it refuses, saying what changed; a draw that was interrupted is drawn again under the
id it was charged with (its pending marker). New noise is refused while a model store has clusters
fitted on the old."""

from __future__ import annotations

import dataclasses
import json
import logging

import dask
import dask.array as da
import numpy as np

from kahm_dask.pipeline.stores.dataset import (
    DatasetStore,
    StoreError,
    is_complete,
    mark_complete,
    remember_release,
    store_bounds,
)
from kahm_dask.pipeline.training.settings import TrainSettings
from kahm_dask.pipeline.training.work import NOISY, PENDING_FILE
from kahm_dask.privacy.bounds import (
    BOUNDS_PRIVATE,
    BOUNDS_PRIVATE_SCALING,
    BOUNDS_PUBLIC,
    FeatureBounds,
    ResolvedBounds,
    Scaling,
    clipped_share,
    public_bounds,
    warn_if_clipped,
    warn_private_scaling,
)
from kahm_dask.privacy.fingerprint import DataFingerprint
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import NoiseSource, as_noise_source
from kahm_dask.privacy.release import Release, begin_release
from kahm_dask.storage.codecs import ARRAY_CODECS
from kahm_dask.storage.location import (
    Location,
)

log = logging.getLogger("kahm_dask")

__all__ = ["StoredNoiseError", "release_bounds", "noisy_array", "release_stage", "begin_store_release", "read_zarr"]


def release_bounds(settings: TrainSettings, store: DatasetStore) -> ResolvedBounds:
    """The bounds of a DP release from ``store``: the settings' bounds, else the store's public
    ``feature_range``, else [0, 1] for a store scaled by its private min/max (``scaling`` marked
    ``private``: warns, and the statement names it), else each feature's private min/max (warns)."""
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
    if (store.attrs.get("scaling") or {}).get("private"):
        warn_private_scaling(remedy="ingest the rows again with --bounds LOW HIGH (data.bounds in a pipeline file), "
                                    "the public range of the raw features", stacklevel=4)
        return ResolvedBounds(np.zeros(p), np.ones(p), BOUNDS_PRIVATE_SCALING)
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
        return "rows it cannot identify (the noise was stored without a fingerprint of its rows)"
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
) -> tuple[da.Array, bool]:
    """The release's noisy rows, drawn and stored (in X's dtype) unless a complete copy of this
    release is stored already, and whether that stored copy was read (True) or the noise drawn;
    the pending marker names the release while it is drawn."""
    path = work_path / NOISY
    if release.reused and is_complete(path) is not None:
        log.info("noise: reusing the stored noisy rows (release %s)", release.release_id)
        return read_zarr(path), True
    binding = {**_noise_marker(release.mechanism, X, settings), "noise_id": release.release_id,
               "data": data.order, "data_rows": data.rows}
    (work_path / PENDING_FILE).write_json(binding)
    path.remove()  # incomplete or of another release: never reused
    source = as_noise_source(settings.insecure_noise_seed)
    url, storage_options = path.dask_target()
    noisy_array(X, release.mechanism, source, X.dtype).to_zarr(url, storage_options=storage_options, overwrite=True,
                                                               zarr_format=3, **ARRAY_CODECS)
    mark_complete(path, binding)
    (work_path / PENDING_FILE).remove()
    return read_zarr(path), False


def read_zarr(path: Location) -> da.Array:
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


def release_stage(
    store: DatasetStore, X: da.Array, settings: TrainSettings, work_path: Location, trained: tuple[Location, ...],
    model_path: Location, *, caller_partition: bool,
) -> tuple[da.Array, Release]:
    """The run's DP release (:func:`~kahm_dask.privacy.release.begin_release`: bounds, plan, the
    ledger, spent on the rows before any noise is drawn) and its noisy rows, stored or drawn;
    the release's ``reused`` says whether stored noisy rows were read."""
    data = store.fingerprint()  # verified by train_pipeline before the work store was made
    release = begin_store_release(
        store, X, settings,
        what=f"noisy rows ({store.n_samples} x {store.n_features}, unit: one entry) of {store.location}, from "
             f"which the {settings.params.dp_data} DP rows of {model_path} are built",
        caller_partition=caller_partition,
        stored=lambda mechanism: _stored_release(mechanism, X, settings, data, work_path, trained),
        details={"data_store": str(store.location), "model_store": str(model_path), "work_store": str(work_path)},
    )
    noisy, reused = _draw_noisy_rows(X, release, settings, data, work_path)
    # a pending draw of an interrupted run continues its release but draws its noise again
    return noisy, dataclasses.replace(release, reused=reused)


def begin_store_release(
    store: DatasetStore, X: da.Array, settings: TrainSettings, *, what: str,
    details: dict, caller_partition: bool = False, stored=None, stacklevel: int = 5,
) -> Release:
    """The DP release of a store's rows X with ``settings``, planned and paid for
    (:func:`~kahm_dask.privacy.release.begin_release`, charged to the store's rows) before any
    noise is drawn: the bounds (:func:`release_bounds`; public bounds the store does not record
    count the clipped entries, owner-side), the plan, the ledger; the store then remembers the
    release. ``what``, ``details``, ``stored``: those of ``begin_release``. Training and
    ``kahm-dask release`` both call it."""
    params = settings.params
    bounds = release_bounds(settings, store)
    fr = store.attrs.get("feature_range")
    recorded = fr and np.array_equal(fr["min"], bounds.lower) and np.array_equal(fr["max"], bounds.upper)
    if bounds.source == BOUNDS_PUBLIC and not recorded:
        # bounds the store does not record (it holds rows clipped to its own): count, owner-side
        share = float(dask.compute(clipped_share(X, bounds.lower, bounds.upper))[0])
        warn_if_clipped(share, bounds.lower, bounds.upper, stacklevel=stacklevel)
    release = begin_release(
        params.epsilon, bounds.lower, bounds.upper, bounds.source, scaling=bounds.scaling,
        ledger=settings.ledger, data=store, budget=settings.budget, what=what,
        delta=settings.delta, record_delta=settings.record_delta, d=settings.d, dp_data=params.dp_data,
        r_source=params.r_source, cluster_on=settings.cluster_on, caller_partition=caller_partition,
        insecure_noise=settings.insecure_noise_seed is not None, stored=stored,
        remembered=store.releases, details=details, stacklevel=stacklevel,
    )
    if release.ledger is not None and not release.reused:
        with release.ledger.book.transaction():  # one writer of the store's attributes at a time
            remember_release(store, {**release.entry, "ledger": str(release.ledger.file or "in memory")})
    return release
