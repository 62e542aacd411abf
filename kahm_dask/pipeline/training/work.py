"""The work store of a training run: what it holds, the checks before a release, the run's k-means
seed and settings, and the model staged in it until it is committed.

The work store is owner-side (folders 0700): the noisy rows before fabrication, the class- and
cluster-grouped copies (of the private rows too where a setting reads them), the k-means seed, the
settings of the clusters trained, and the model store while it is trained (``model.zarr``), which
:func:`commit_model` moves to the model path when every cluster is written. A second run on one
work store is refused (:func:`kahm_dask.storage.locks.exclusive`)."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np

from kahm_dask.pipeline.stores.model import cluster_done, mark_model_complete
from kahm_dask.pipeline.training.tasks import GROUPED_X, GROUPED_X_NOISY
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

__all__ = [
    "NOISY",
    "PENDING_FILE",
    "SEED_FILE",
    "STAGED_MODEL",
    "WORK_ENTRIES",
    "kmeans_seed",
    "check_training_targets",
    "check_same_settings",
    "commit_model",
    "cluster_info",
]


#: The work store's noisy rows (written once per release, with a completion marker).
NOISY = "X_noisy"


#: The release being drawn (its id, the rows' fingerprint): removed once ``X_noisy`` is complete.
PENDING_FILE = "X_noisy.pending.json"


#: The run's k-means seed when none is given (public; kept so that a resume repeats it).
SEED_FILE = "kmeans_seed.json"


#: The model store while it is trained, in the work store (moved to the model path when complete).
STAGED_MODEL = "model.zarr"


def kmeans_seed(seed: int | None, work_path: LocationLike) -> int:
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


def cluster_info(model_path: Location, c: int, s: int) -> dict:
    info = cluster_done(model_path, c, s)
    if info is None:
        raise FileNotFoundError(f"cluster c{c}_s{s} of the model store {model_path} is missing; delete the "
                                "model store and rerun.")
    return info


def commit_model(staged: Location, model_path: Location) -> None:
    """Mark the staged model store complete and put it at ``model_path`` (replacing an older
    model store there): renamed when both are local on one file system, else copied with the
    completion marker last (:func:`~kahm_dask.storage.location.committed_directory`).

    Temporary cluster directories that writers of an interrupted earlier run left in the staged
    store are removed first: the run holds its work store alone, so none is still being written.
    """
    if staged.is_local:
        _remove_interrupted_writes(staged.path / "clusters")
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


def _remove_interrupted_writes(clusters: Path) -> None:
    """Remove the hidden ``.<cluster>.tmp-<uuid>`` directories under ``clusters``
    (:func:`~kahm_dask.storage.atomic.sibling_path`) that killed writers left."""
    if clusters.is_dir():
        for leftover in clusters.glob(".*.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)


def check_same_settings(models: tuple[Location, Location], work_path: Location, current: dict) -> bool:
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
