"""Model stores to and from the in-memory classifier: ``DaskKAHMClassifier.to_local()`` assembles
a fitted :class:`~kahm_dask.KAHMClassifier` from the stored cluster models, and
``DaskKAHMClassifier.from_local`` writes a fitted one as a model store."""

from __future__ import annotations

from numbers import Integral
from typing import Any

import numpy as np
import zarr

from kahm_dask._random import as_seed_sequence, child_seed_sequence
from kahm_dask.classifier import PARTITION_STREAM, KAHMClassifier
from kahm_dask.params import CLASSIFIER_PARAMS
from kahm_dask.pipeline.estimator.stores import ESTIMATOR_PARAMS_KEY, estimator_keys, stored_params
from kahm_dask.pipeline.stores.manifest import build_manifest, jsonable, read_manifest, write_manifest
from kahm_dask.pipeline.stores.model import cluster_location, dp_rows_array, load_cluster, save_cluster
from kahm_dask.storage.location import Location, committed_directory

__all__ = ["to_local", "write_local"]


def _clusters_by_class(manifest: dict) -> list[list[dict]]:
    """The manifest's cluster entries of each class code, in cluster order."""
    return [sorted((e for e in manifest["clusters"] if e["class"] == c), key=lambda e: e["cluster"])
            for c in range(len(manifest["classes"]))]


def to_local(estimator: Any) -> KAHMClassifier:
    """The fitted :class:`~kahm_dask.KAHMClassifier` equal to the fitted Dask ``estimator``: one
    :class:`~kahm_dask.WideKAHM` per class assembled from the stored cluster models (loaded in the
    client), with the estimator's parameters that the in-memory classifier has and the model
    store's k-means seed as ``random_state``. Of a DP model, ``dp_data_`` holds each class's
    stored DP rows in cluster order (when the store has them) and ``fabrication_passes_`` the
    smoother passes per cluster."""
    options = estimator.storage_options
    manifest = read_manifest(estimator.model_path_, storage_options=options)
    seed = manifest["seed"]
    params = {name: getattr(estimator, name) for name in CLASSIFIER_PARAMS}
    clf = KAHMClassifier(**{**params, "random_state": seed})
    root = None if seed is None else as_seed_sequence(seed)
    clusters = _clusters_by_class(manifest)

    def where(c: int, s: int) -> Location:
        return cluster_location(estimator.model_path_, c, s, options)

    models = []
    for c, entries in enumerate(clusters):
        parts = np.repeat(np.arange(len(entries)), [e["n_rows"] for e in entries])
        wide = clf._wide(None if root is None else child_seed_sequence(root, PARTITION_STREAM, c))
        models.append(wide.assemble([load_cluster(where(c, e["cluster"])) for e in entries], parts))
    clf.classes_ = estimator.classes_.copy()
    clf.models_ = models
    clf.n_branches_ = np.array([m.n_branches_ for m in models])
    clf.n_features_in_ = estimator.n_features_in_
    clf.epsilon_ = estimator.epsilon_
    if hasattr(estimator, "feature_names_in_"):
        clf.feature_names_in_ = estimator.feature_names_in_
    if hasattr(estimator, "privacy_statement_"):
        clf.privacy_statement_ = estimator.privacy_statement_
        dp_rows, passes = {}, {}
        for c, (label, entries) in enumerate(zip(estimator.classes_.tolist(), clusters, strict=True)):
            groups = [zarr.open_group(where(c, e["cluster"]).zarr_store(read_only=True), mode="r") for e in entries]
            arrays = [dp_rows_array(g) for g in groups]
            if all(a is not None for a in arrays):
                dp_rows[label] = np.concatenate([a[...] for a in arrays])
            passes[label] = [g.attrs["info"].get("passes") for g in groups]
        if len(dp_rows) == len(clusters):
            clf.dp_data_ = dp_rows
        if estimator.dp_data == "fabricated":
            clf.fabrication_passes_ = passes
    return clf


def write_local(clf: KAHMClassifier, target: Location, estimator_params: dict) -> None:
    """Write the fitted :class:`~kahm_dask.KAHMClassifier` ``clf`` as a model store at ``target``
    (committed when complete): its branches as the clusters, its parameters (``random_state`` kept
    when it is an int), the Dask estimator's ``estimator_params`` that these lack and the privacy
    statement in the manifest. The store has no DP rows (the
    classifier does not keep which branch each of its rows went to) and no release id."""
    private = clf.epsilon_ is not None
    parameters = stored_params(clf.get_params(deep=False))
    if not isinstance(clf.random_state, Integral) or isinstance(clf.random_state, bool):
        parameters["random_state"] = None
    clusters = []
    with committed_directory(target) as tmp:
        for c, (label, model) in enumerate(zip(clf.classes_.tolist(), clf.models_, strict=True)):
            for s, branch in enumerate(model.branches_):
                info = {"class": c, "cluster": s, "n_rows": int(model.branch_sizes_[s]),
                        "passes": None, "layer_dims": list(branch.layer_dims_)}
                if private and clf.dp_data == "fabricated":
                    info["passes"] = clf.fabrication_passes_[label][s]
                if private and clf.r_source == "private":
                    del info["passes"]  # depends on private rows (as in the pipeline's tasks)
                save_cluster(tmp, c, s, branch, info)
                clusters.append({"class": c, "cluster": s, "n_rows": info["n_rows"]})
        release = {"release_id": None, "statement": clf.privacy_statement_.to_dict()} if private else None
        own = {ESTIMATOR_PARAMS_KEY: estimator_keys(estimator_params, parameters)}
        write_manifest(tmp, build_manifest(jsonable(clf.classes_), clf.n_features_in_, parameters, release,
                                           clusters, own))
