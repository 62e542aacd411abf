"""The stores of a Dask estimator: the directory a fit writes (``store_dir``, or a temporary one
owned by the estimator), a model store in a temporary one as bytes for a pickle and back, the
check before a model store is replaced, and the estimator's parameters as the model store's
manifest records them."""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kahm_dask.params import NOT_STORED_PARAMS
from kahm_dask.pipeline.stores.manifest import jsonable, read_manifest
from kahm_dask.storage.location import Location, as_location

__all__ = ["DATA", "WORK", "MODEL", "ESTIMATOR_PARAMS_KEY", "NOT_STORED", "store_root", "owned_model_store",
           "model_store_files", "restore_model_store", "check_target", "stored_params", "estimator_keys",
           "params_from_manifest"]

#: Where a fit writes under ``store_dir``: the training rows, the pipeline's work store (private
#: copies, noisy rows, the model while it is trained) and the model store.
DATA, WORK, MODEL = "train.zarr", "work", "model.zarr"
#: Manifest key of the estimator's public parameters, so that ``DaskKAHMClassifier.load``
#: restores them.
ESTIMATOR_PARAMS_KEY = "estimator_params"
#: Not in the manifest: where the stores are and how they are reached (``storage_options`` may
#: hold credentials), and the parameters of :data:`kahm_dask.params.NOT_STORED_PARAMS`.
NOT_STORED = ("store_dir", "storage_options", *NOT_STORED_PARAMS)


def store_root(estimator: Any) -> Location:
    """``estimator.store_dir`` (a local directory, created, or a URL), or a new temporary directory
    deleted with the estimator (a refit deletes the previous fit's temporary directory)."""
    previous = estimator.__dict__.pop("_owned_dir", None)
    if previous is not None:
        previous()
    if estimator.store_dir is not None:
        root = as_location(estimator.store_dir, estimator.storage_options)
        if root.is_local:
            root.path.mkdir(parents=True, exist_ok=True)
        return root
    return as_location(_owned_temporary_dir(estimator))


def _owned_temporary_dir(estimator: Any) -> Path:
    """A new temporary directory (0700) deleted when ``estimator`` is garbage collected or the
    interpreter exits (``weakref.finalize``), recorded as the estimator's ``_owned_dir``."""
    root = tempfile.mkdtemp(prefix="kahm-dask-")
    estimator._owned_dir = weakref.finalize(estimator, shutil.rmtree, root, ignore_errors=True)
    return Path(root)


def owned_model_store(estimator: Any) -> Path | None:
    """The fitted ``estimator``'s model store when it lies in the temporary directory the
    estimator owns (it goes with the estimator), else None (``store_dir``, a loaded store, or
    not fitted)."""
    finalizer = estimator.__dict__.get("_owned_dir")
    pending = None if finalizer is None else finalizer.peek()  # (estimator, rmtree, (root,), kwargs)
    model = estimator.__dict__.get("model_path_")
    if pending is None or not isinstance(model, Path):
        return None
    _, _, (root,), _ = pending
    return model if model == Path(root) / MODEL else None


def model_store_files(model: Path) -> dict[str, bytes]:
    """Every file of the local model store ``model`` (manifest, cluster groups, completion
    markers; no hidden staging leftovers) by its path relative to the store, as bytes."""
    return {f.relative_to(model).as_posix(): f.read_bytes() for f in sorted(model.rglob("*"))
            if f.is_file() and not any(part.startswith(".") for part in f.relative_to(model).parts)}


def restore_model_store(estimator: Any, files: Mapping[str, bytes]) -> Path:
    """Write the model store ``files`` (from :func:`model_store_files`) into a new temporary
    directory owned by ``estimator`` (as a fit without ``store_dir`` makes); returns its path."""
    model = _owned_temporary_dir(estimator) / MODEL
    for folder in sorted({(model / name).parent for name in files}):  # each folder once, parents first
        folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (model / name).write_bytes(content)
    return model


def check_target(path: Location) -> None:
    """Raise unless ``path`` is free or holds a complete model store (which a write may replace)."""
    if not path.exists():
        return
    try:
        read_manifest(path)
    except (FileNotFoundError, ValueError):
        raise FileExistsError(
            f"{path} exists and is not a kahm-dask model store; choose another path or delete it."
        ) from None


def stored_params(params: dict) -> dict:
    """The public parameters ``params`` of an estimator as JSON for the manifest (its own keys:
    :data:`ESTIMATOR_PARAMS_KEY`)."""
    return {k: jsonable(v) for k, v in params.items() if k not in NOT_STORED}


def estimator_keys(params: dict, recorded: Mapping[str, Any]) -> dict:
    """The manifest's :data:`ESTIMATOR_PARAMS_KEY` entry: the public parameters ``params`` of a
    Dask estimator that the training run's ``recorded`` parameters (the manifest's
    ``parameters``) lack, i.e. its store and prediction settings, as JSON."""
    return stored_params({k: v for k, v in params.items() if k not in recorded})


def params_from_manifest(manifest: dict) -> dict:
    """The estimator parameters a model store's manifest records: its ``parameters`` (what made
    the model, written by every training run; ``random_state`` is the k-means seed the run used,
    drawn or kept by a resumed run) and the estimator's own keys where it wrote them (the store
    and prediction settings a training run does not record)."""
    params = {**manifest.get(ESTIMATOR_PARAMS_KEY, {}), **manifest.get("parameters", {})}
    if params.get("bounds") is not None:
        params["bounds"] = tuple(params["bounds"])
    return params
