"""A model store's manifest: what the model is and how it was made, in the store's attributes.

The manifest (``attrs["kahm_dask_model"]`` of the model store's root group, format 2)::

    format_version      2
    kahm_dask_version   the version that wrote it
    classes             the class labels (position = class code)
    n_features          p
    parameters          the parameters that made the model, by their names in
                        kahm_dask.params.PARAMS (random_state: the k-means seed used; public,
                        the noise never depends on it)
    seed, seed_streams  the k-means seed again, and the stream it was spawned into
    privacy             None (not private) or {"release_id", "statement"}
    clusters            [{"class", "cluster", "n_rows"}, ...]
    versions            the libraries it was written with
    (extra keys)        the estimator's own parameters, when DaskKAHMClassifier wrote it

Format 1 (kahm-dask before the parameter spine) kept the model parameters in ``params`` (the
per-cluster recipe), and ``block_size``, ``cluster_on`` beside it; :func:`read_manifest` reads
it as format 2, so model stores written then still load, predict and convert.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import zarr

from kahm_dask._version import __version__
from kahm_dask.classifier import PARTITION_STREAM
from kahm_dask.storage.location import COMPLETE_FILE, LocationLike, as_location, is_committed

__all__ = ["MANIFEST_KEY", "FORMAT_VERSION", "write_manifest", "read_manifest", "build_manifest", "jsonable",
           "versions"]

MANIFEST_KEY = "kahm_dask_model"
FORMAT_VERSION = 2
Options = Mapping[str, Any] | None
# the recipe fields a format-1 manifest kept under "params", named as in kahm_dask.params.PARAMS
_V1_RECIPE = ("n_components", "n_layers", "epsilon", "dp_data", "r_source", "r_value", "max_passes")


def write_manifest(model_path: LocationLike, manifest: dict, *, storage_options: Options = None) -> None:
    """Store ``manifest`` in the attributes of the model store at ``model_path`` (created if absent)."""
    group = zarr.open_group(as_location(model_path, storage_options).zarr_store(), mode="a", zarr_format=3)
    group.attrs[MANIFEST_KEY] = manifest


def read_manifest(model_path: LocationLike, *, storage_options: Options = None) -> dict:
    """The manifest of the model store at ``model_path`` (a path or URL), in format 2.

    FileNotFoundError if there is none, or if a remote store has no completion marker (its
    write did not finish); ValueError if the Zarr group there has no manifest, or one of a
    format this version does not read.
    """
    path = as_location(model_path, storage_options)
    if not (path / "zarr.json").exists():
        raise FileNotFoundError(f"no model store at {path} (run `kahm-dask train` first).")
    if not is_committed(path):
        raise FileNotFoundError(f"the model store at {path} is incomplete (no {COMPLETE_FILE}: its write did "
                                "not finish); write it again.")
    attrs = zarr.open_group(path.zarr_store(read_only=True), mode="r", zarr_format=3).attrs.asdict()
    if MANIFEST_KEY not in attrs:
        raise ValueError(f"{path} is not a kahm-dask model store (no manifest).")
    manifest = attrs[MANIFEST_KEY]
    version = manifest.get("format_version")
    if version == 1:
        return upgrade_v1(manifest)
    if version != FORMAT_VERSION:
        raise ValueError(f"{path} is a model store of format {version!r}, written by kahm-dask "
                         f"{manifest.get('kahm_dask_version', '?')}; this version ({__version__}) reads formats 1 "
                         f"and {FORMAT_VERSION}. Train it again, or read it with the version that wrote it.")
    return manifest


def upgrade_v1(manifest: dict) -> dict:
    """A format-1 manifest as format 2: ``parameters`` gathered from ``params`` (the recipe),
    ``block_size``, ``seed`` and, of a DP model, the mechanism's δ, d and bounds and ``cluster_on``
    (the statement records the bounds the release used)."""
    old = dict(manifest)
    recipe = old.pop("params")
    parameters = {name: recipe[name] for name in _V1_RECIPE}
    parameters.update(block_size=old.pop("block_size"), random_state=old["seed"])
    cluster_on = old.pop("cluster_on", None)
    if old["privacy"] is not None:
        mechanism = old["privacy"]["statement"]["mechanism"]
        parameters.update(delta=mechanism["delta"], d=mechanism["d"],
                          bounds=[mechanism["lower"], mechanism["upper"]], cluster_on=cluster_on)
    return {**old, "format_version": FORMAT_VERSION, "parameters": parameters}


def build_manifest(
    classes: list, n_features: int, parameters: dict, privacy: dict | None, clusters: list[dict], extra: dict
) -> dict:
    """The manifest of a model store (the module docstring lists its keys): the class labels,
    the number of features, the ``parameters`` that made the model, the release (``privacy``),
    the ``clusters`` and ``extra`` keys (the estimator's own parameters)."""
    return {
        "format_version": FORMAT_VERSION,
        "kahm_dask_version": __version__,
        "classes": list(classes),
        "n_features": int(n_features),
        "parameters": parameters,
        "seed": parameters.get("random_state"),
        "seed_streams": {"partition": [PARTITION_STREAM]},
        "privacy": privacy,
        "clusters": clusters,
        "versions": versions(),
        **extra,
    }


def jsonable(value: Any) -> Any:
    """``value`` with NumPy arrays and scalars, tuples and mappings as JSON types."""
    if isinstance(value, Mapping):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray | list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def versions() -> dict[str, str]:
    """The versions of the libraries a model store was written with."""
    import dask
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
