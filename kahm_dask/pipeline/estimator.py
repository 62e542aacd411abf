"""The scikit-learn API over the Dask pipeline: :class:`DaskKAHMClassifier`.

``fit`` writes the training rows to a Zarr dataset store (:func:`~kahm_dask.pipeline.store.write_dataset`)
and runs :func:`~kahm_dask.pipeline.train.train_pipeline` on the current ``distributed`` client, or on
a LocalCluster it starts and closes; the fitted estimator is a handle on the model store it wrote.
Prediction is the pipeline's blockwise min/argmin reduction
(:func:`~kahm_dask.pipeline.predict.class_distance_array`, docs/algorithm.md#classifier): lazy dask
arrays for dask input (the cluster models are loaded by the tasks, never in the client), NumPy
arrays for NumPy input. :meth:`DaskKAHMClassifier.to_classifier` and
:meth:`DaskKAHMClassifier.from_classifier` convert to and from the in-memory
:class:`~kahm_dask.KAHMClassifier`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from numbers import Integral
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import zarr
from distributed import Client, default_client
from joblib import cpu_count
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.metrics import accuracy_score
from sklearn.utils._param_validation import validate_parameter_constraints
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from kahm_dask import __version__
from kahm_dask._atomic import atomic_directory
from kahm_dask._random import as_seed_sequence, child_seed_sequence
from kahm_dask._validation import check_label_types
from kahm_dask.classifier import PARTITION_STREAM, KAHMClassifier, class_matching_scores, class_proportions
from kahm_dask.params import PARAMS, Range, check_r_value, parameter_constraints
from kahm_dask.partition import KMEANS_DIMS
from kahm_dask.pipeline.cluster import compute, connect
from kahm_dask.pipeline.config import ClusterConfig
from kahm_dask.pipeline.modelstore import (
    cluster_dir,
    load_cluster,
    read_manifest,
    save_cluster,
    write_manifest,
)
from kahm_dask.pipeline.predict import class_distance_array
from kahm_dask.pipeline.rows import rows_per_chunk
from kahm_dask.pipeline.store import DatasetStore, open_dataset, write_dataset
from kahm_dask.pipeline.train import TrainSettings, _versions, train_pipeline
from kahm_dask.privacy.statement import PrivacyStatement
from kahm_dask.recipe import TrainParams

__all__ = ["DaskKAHMClassifier", "ESTIMATOR_PARAMS_KEY"]

#: The parameters :class:`DaskKAHMClassifier` shares with :class:`~kahm_dask.KAHMClassifier`.
SHARED_PARAMS = (
    "n_components", "n_layers", "block_size", "random_state", "epsilon", "delta", "bounds", "d", "dp_data",
    "r_source", "r_value", "cluster_on", "max_passes", "s_rule", "n_init", "kmeans_dims", "n_probe",
    "insecure_noise_seed",
)
#: Manifest key of the estimator's public parameters (all but ``store_dir`` and
#: ``insecure_noise_seed``), so that :meth:`DaskKAHMClassifier.load` restores them.
ESTIMATOR_PARAMS_KEY = "estimator_params"
#: Where a fit writes under ``store_dir``: the training rows, the pipeline's work store
#: (private copies, noisy rows) and the model store.
DATA, WORK, MODEL = "train.zarr", "work", "model.zarr"
_NOT_STORED = ("store_dir", "insecure_noise_seed")


def _seed_constraints() -> list:
    """``random_state``'s rule restricted to what the pipeline takes as its seed: None or an int ≥ 0."""
    return [c for c in PARAMS["random_state"].rule if c is None or isinstance(c, Range)]


def _current_client() -> Client | None:
    """The ``distributed`` client this process uses by default, or None."""
    try:
        return default_client()
    except ValueError:
        return None


@contextmanager
def _training_client() -> Iterator[Client]:
    """The current client, else one on a LocalCluster of one single-threaded worker process per
    usable core (joblib's ``cpu_count``: affinity and cgroup quotas;
    :func:`~kahm_dask.pipeline.cluster.connect`), closed on exit."""
    client = _current_client()
    if client is not None:
        yield client
        return
    with connect(ClusterConfig(n_workers=cpu_count(), threads_per_worker=1)) as client:
        yield client


def _jsonable(value: Any) -> Any:
    """``value`` with NumPy arrays, scalars and tuples as JSON types (lists, numbers)."""
    if isinstance(value, np.ndarray | list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _take(codes: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Labels (m,) of class codes (m,)."""
    return classes[codes]


def _check_target(path: Path) -> None:
    """Raise unless ``path`` is free or holds a model store (which a write may replace)."""
    if not path.exists():
        return
    try:
        read_manifest(path)
    except (FileNotFoundError, ValueError):
        raise FileExistsError(
            f"{path} exists and is not a kahm-dask model store; choose another path or delete it."
        ) from None


class DaskKAHMClassifier(ClassifierMixin, BaseEstimator):
    """KAHM classifier trained and evaluated by the Dask pipeline (docs/design.md).

    The same model as :class:`~kahm_dask.KAHMClassifier` (one wide deep KAHM per class, one
    branch per within-class k-means cluster, DP rows per cluster with ``epsilon``;
    docs/algorithm.md#dp-classifier), with the data and the models in Zarr stores and the work
    on a Dask cluster: the training rows are never loaded whole, and prediction on a dask array
    is a lazy blockwise reduction. ``fit`` runs on the current ``distributed`` client (for a
    remote scheduler, ``store_dir`` must be a path that the client and every worker see), else
    on a LocalCluster of one single-threaded worker process per usable core that it starts
    and closes (in a script, call it under ``if __name__ == "__main__":``, as for any Dask
    cluster of worker processes).

    Parameters
    ----------
    n_components, n_layers, block_size, epsilon, delta, bounds, d, dp_data, r_source, r_value, \
cluster_on, max_passes, s_rule, n_init, kmeans_dims, n_probe, insecure_noise_seed
        As in :class:`~kahm_dask.KAHMClassifier` (the same rules, from
        :data:`kahm_dask.params.PARAMS`). The DP noise comes from the operating system's
        secure generator unless ``insecure_noise_seed`` (tests only) is set.
    random_state : int or None, default=None
        The pipeline's k-means seed (not private; the noise never depends on it). None: a seed
        drawn at each fit, recorded in the model store's manifest.
    store_dir : str, path or None, default=None
        Directory of the stores a fit writes: ``train.zarr`` (the training rows, unless ``fit``
        is given a dataset store; its privacy ledger ``train.zarr.privacy-ledger.json`` beside
        it), ``work/`` (private copies and the noisy rows: they stay with the data owner) and
        ``model.zarr`` (the model store; of a DP fit, publishable). A fit replaces these three.
        None: a temporary directory owned by the estimator and deleted with it (keep the
        model with :meth:`save`).
    chunk_rows : int or None, default=None
        Rows per chunk of the stores a fit writes, and of NumPy inputs to prediction; None:
        about 32 MiB per chunk.

    Attributes
    ----------
    classes_ : (C,) class labels
    n_features_in_ : int, p
    model_path_ : :class:`~pathlib.Path` of the model store
    n_clusters_ : int, clusters (branches) of all classes together
    n_branches_ : (C,) branches per class
    privacy_statement_ : :class:`~kahm_dask.privacy.statement.PrivacyStatement` (DP only)

    Notes
    -----
    Given the same rows, parameters and ``random_state``, the fit gives the branches of
    :class:`~kahm_dask.KAHMClassifier` as long as every class's k-means runs in one task (a class
    whose rows take at most a quarter of a worker's memory); larger classes are clustered out
    of core (k-means‖ and dask-ml), which partitions differently. A pickled copy of a fitted
    estimator refers to the same model store; a temporary one lives as long as the estimator
    that fitted it.

    Examples
    --------
    >>> import dask.array as da
    >>> from distributed import Client, LocalCluster
    >>> from kahm_dask import DaskKAHMClassifier
    >>> from kahm_dask.datasets import load_bundled, split_and_scale
    >>> split = split_and_scale(*load_bundled("iris"))
    >>> cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None)
    >>> client = Client(cluster)
    >>> X = da.from_array(split.X_train, chunks=(50, -1))
    >>> clf = DaskKAHMClassifier(n_components=4, random_state=0).fit(X, split.y_train)
    >>> pred = clf.predict(da.from_array(split.X_test, chunks=(25, -1)))  # lazy
    >>> isinstance(pred, da.Array), bool((pred.compute() == split.y_test).mean() >= 0.9)
    (True, True)
    >>> client.close(); cluster.close()
    """

    _parameter_constraints: dict = {
        **parameter_constraints(*SHARED_PARAMS),
        "random_state": _seed_constraints(),
        "store_dir": [None, str, os.PathLike],
        "chunk_rows": [None, Range(Integral, 1, None, closed="left")],
    }

    def __init__(
        self,
        n_components: int = 20,
        n_layers: int = 1,
        block_size: int = 1000,
        random_state: int | None = None,
        *,
        epsilon: float | None = None,
        delta: float = 0.0,
        bounds=None,
        d=None,
        dp_data: str = "fabricated",
        r_source: str = "passes",
        r_value: float | int | None = None,
        cluster_on: str = "noisy",
        max_passes: int = 100,
        s_rule: str = "round",
        n_init: int = 1,
        kmeans_dims: int | None = KMEANS_DIMS,
        n_probe: int | None = None,
        insecure_noise_seed: int | None = None,
        store_dir: str | os.PathLike | None = None,
        chunk_rows: int | None = None,
    ) -> None:
        self.n_components = n_components
        self.n_layers = n_layers
        self.block_size = block_size
        self.random_state = random_state
        self.epsilon = epsilon
        self.delta = delta
        self.bounds = bounds
        self.d = d
        self.dp_data = dp_data
        self.r_source = r_source
        self.r_value = r_value
        self.cluster_on = cluster_on
        self.max_passes = max_passes
        self.s_rule = s_rule
        self.n_init = n_init
        self.kmeans_dims = kmeans_dims
        self.n_probe = n_probe
        self.insecure_noise_seed = insecure_noise_seed
        self.store_dir = store_dir
        self.chunk_rows = chunk_rows

    # ------------------------------------------------------------------ fitting
    def _check_params(self) -> int | float | None:
        """Raise scikit-learn's ``InvalidParameterError`` naming the first parameter that breaks
        its rule; returns ``r_value`` as ``r_source`` takes it."""
        name = type(self).__name__
        validate_parameter_constraints(self._parameter_constraints, self.get_params(deep=False), name)
        return check_r_value(self.r_source, self.r_value, name)

    def _settings(self, r_value: int | float | None) -> TrainSettings:
        """The pipeline's settings from the parameters (``r_value`` as :meth:`_check_params` returns it)."""
        params = TrainParams(
            self.n_components,
            self.n_layers,
            epsilon=self.epsilon,
            dp_data=self.dp_data,
            r_source=self.r_source,
            r_value=r_value,
            max_passes=self.max_passes,
        )
        return TrainSettings(
            params,
            seed=self.random_state,
            delta=self.delta,
            d=self.d,
            bounds=self.bounds,
            block_size=self.block_size,
            s_rule=self.s_rule,
            cluster_on=self.cluster_on,
            n_init=self.n_init,
            kmeans_dims=self.kmeans_dims,
            insecure_noise_seed=self.insecure_noise_seed,
        )

    def _store_root(self) -> Path:
        """``store_dir``, or a new temporary directory deleted with this estimator (the previous
        fit's temporary directory is deleted now)."""
        previous = self.__dict__.pop("_owned_dir", None)
        if previous is not None:
            previous()
        if self.store_dir is not None:
            root = Path(self.store_dir).absolute()
            root.mkdir(parents=True, exist_ok=True)
            return root
        root = tempfile.mkdtemp(prefix="kahm-dask-")
        self._owned_dir = weakref.finalize(self, shutil.rmtree, root, ignore_errors=True)
        return Path(root)

    def fit(self, X, y=None) -> DaskKAHMClassifier:
        """Train one model per (class, cluster) on the Dask cluster.

        X : (N, p) NumPy array (or array-like), (N, p) dask array, or the path of a dataset
            store written by :func:`~kahm_dask.pipeline.store.write_dataset` or
            :func:`~kahm_dask.pipeline.store.ingest` (then its labels are used and ``y`` must
            be None).
        y : (N,) labels (NumPy, list or dask array); None with a store path.
        """
        r_value = self._check_params()
        source = self._training_source(X, y)
        root = self._store_root()
        work, model = root / WORK, root / MODEL
        for stale in (work, model):  # a fit starts afresh (new noise, new k-means)
            if stale.exists():
                shutil.rmtree(stale)
        with _training_client() as client:
            store = source if isinstance(source, DatasetStore) else write_dataset(
                root / DATA, *source, chunk_rows=self.chunk_rows, overwrite=True
            )
            train_pipeline(store, model, work, self._settings(r_value), client, progress=False)
        manifest = read_manifest(model)
        manifest[ESTIMATOR_PARAMS_KEY] = self._stored_params()
        write_manifest(model, manifest)
        self._set_fitted(model, manifest)
        return self

    def _training_source(self, X, y) -> DatasetStore | tuple[Any, Any]:
        """The dataset store named by ``X``, or the checked ``(X, y)`` to write to one; sets
        ``n_features_in_`` (and ``feature_names_in_`` for a DataFrame)."""
        if isinstance(X, str | os.PathLike):
            if y is not None:
                raise ValueError(
                    f"X is the dataset store {os.fspath(X)!r}, whose labels are used; pass y=None."
                )
            store = open_dataset(X)
            self._forget_feature_names()
            self.n_features_in_ = store.n_features
            return store
        if y is None:
            raise ValueError("y is required unless X is the path of a dataset store (which holds the labels).")
        if isinstance(X, da.Array):
            if X.ndim != 2:
                raise ValueError(f"X must be 2-D of shape (n_samples, n_features), got shape {X.shape}.")
            self._forget_feature_names()
            self.n_features_in_ = int(X.shape[1])
            return X, y
        y = check_label_types(y)
        X, y = validate_data(self, X, y, dtype=np.float64, ensure_min_samples=2)
        check_classification_targets(y)
        return X, y

    def _forget_feature_names(self) -> None:
        if hasattr(self, "feature_names_in_"):
            del self.feature_names_in_

    def _stored_params(self) -> dict:
        """The public parameters, as JSON, for the model store's manifest."""
        return {k: _jsonable(v) for k, v in self.get_params(deep=False).items() if k not in _NOT_STORED}

    def _set_fitted(self, model_path: Path, manifest: dict) -> None:
        """The fitted attributes of the model store at ``model_path`` (its ``manifest``)."""
        clusters = manifest["clusters"]
        self.classes_ = np.asarray(manifest["classes"])
        self.n_features_in_ = int(manifest["n_features"])
        self.model_path_ = Path(model_path).absolute()
        self.n_clusters_ = len(clusters)
        self.n_branches_ = np.bincount([e["class"] for e in clusters], minlength=len(self.classes_))
        if manifest["privacy"] is not None:
            statement = dict(manifest["privacy"]["statement"])
            statement.pop("holds", None)  # derived from the weakenings
            self.privacy_statement_ = PrivacyStatement(**statement)
        elif hasattr(self, "privacy_statement_"):
            del self.privacy_statement_

    def __getstate__(self) -> dict:
        state = dict(super().__getstate__())  # a copy: object.__getstate__ returns __dict__ itself
        state.pop("_owned_dir", None)  # the copy refers to the directory; the original owns it
        return state

    # --------------------------------------------------------------- evaluation
    def _queries(self, X) -> tuple[da.Array, bool]:
        """X as a dask array (m, p) and whether it was lazy (a dask array or a store path)."""
        check_is_fitted(self, "model_path_")
        if isinstance(X, da.Array):
            return X, True
        if isinstance(X, str | os.PathLike):
            return open_dataset(X).X(), True
        X = validate_data(self, X, dtype=np.float64, reset=False)
        rows = rows_per_chunk(self.chunk_rows, X.shape[0], X.shape[1], X.dtype)
        return da.from_array(X, chunks=(rows, -1)), False

    @staticmethod
    def _result(job: da.Array, lazy: bool) -> da.Array | np.ndarray:
        """``job`` itself for lazy input, else computed on the current client (or threads)."""
        return job if lazy else compute(job, _current_client())

    def _distances(self, X) -> tuple[da.Array, bool]:
        X, lazy = self._queries(X)
        return class_distance_array(self.model_path_, X, n_probe=self.n_probe), lazy

    def class_distances(self, X) -> da.Array | np.ndarray:
        """Per-class distances ``Γ_{W_c}(x)`` (eq. 64; docs/algorithm.md#wide-kahm) → (m, C).

        X : (m, p) NumPy array (→ NumPy), dask array or dataset store path (→ lazy dask array).
        """
        return self._result(*self._distances(X))

    def predict(self, X) -> da.Array | np.ndarray:
        """Class of minimum distance (Definition 7; ties: the lowest class index) → (m,)."""
        D, lazy = self._distances(X)
        codes = D.argmin(axis=1)
        labels = codes.map_blocks(_take, self.classes_, dtype=self.classes_.dtype,
                                  meta=np.empty((0,), dtype=self.classes_.dtype))
        return self._result(labels, lazy)

    def _blockwise(self, X, fn) -> da.Array | np.ndarray:
        """``fn`` of the (m, C) distances, blockwise (one chunk across classes)."""
        D, lazy = self._distances(X)
        return self._result(D.map_blocks(fn, dtype=np.float64, meta=np.empty((0, 0))), lazy)

    def match_score(self, X) -> da.Array | np.ndarray:
        """Class-matching scores (Definition 8; docs/algorithm.md#classifier) → (m, C) in
        [e^{-1}, 1]; not probabilities."""
        return self._blockwise(X, class_matching_scores)

    def predict_proba(self, X) -> da.Array | np.ndarray:
        """Class-matching scores normalised to sum to 1 per row → (m, C); they rank the classes
        like the distances, but are not calibrated probabilities
        (:func:`~kahm_dask.classifier.class_proportions`)."""
        return self._blockwise(X, class_proportions)

    def score(self, X, y=None, sample_weight=None) -> da.Array | float:
        """Accuracy (weighted by ``sample_weight`` (m,) if given) of the predictions of X.

        X and y (m,) as in :meth:`predict`; y None only with a dataset store path (its labels).
        A lazy 0-d dask array for lazy X (``float(...)`` computes it), else a float.
        """
        if isinstance(X, str | os.PathLike) and y is None:
            y = open_dataset(X).labels()
        if y is None:
            raise ValueError("y is required unless X is the path of a dataset store (which holds the labels).")
        predicted = self.predict(X)
        if not isinstance(predicted, da.Array):
            return float(accuracy_score(y, predicted, sample_weight=sample_weight))
        y = y if isinstance(y, da.Array) else da.from_array(np.asarray(y), chunks=(predicted.chunks[0],))
        if sample_weight is not None and not isinstance(sample_weight, da.Array):
            sample_weight = da.from_array(np.asarray(sample_weight, dtype=np.float64), chunks=(predicted.chunks[0],))
        return da.average(predicted == y, weights=sample_weight)

    # ------------------------------------------------------------ model store
    def save(self, path: str | os.PathLike) -> Path:
        """Copy the model store to ``path`` atomically (an existing model store there is
        replaced; any other existing path is refused). Returns the path."""
        check_is_fitted(self, "model_path_")
        target = Path(path).absolute()
        if target == self.model_path_:
            return target
        _check_target(target)
        with atomic_directory(target) as tmp:
            shutil.copytree(self.model_path_, tmp, ignore=shutil.ignore_patterns(".*.tmp-*", ".*.old-*"))
        return target

    @classmethod
    def load(cls, path: str | os.PathLike) -> DaskKAHMClassifier:
        """A fitted estimator on the model store at ``path`` (used in place, not copied).

        Its parameters are those the store was fitted with: all of them for a store written by
        this class, else those its manifest records (a ``kahm-dask train`` store).
        """
        manifest = read_manifest(path)
        est = cls(**cls._params_from_manifest(manifest))
        est._set_fitted(Path(path), manifest)
        return est

    @staticmethod
    def _params_from_manifest(manifest: dict) -> dict:
        stored = manifest.get(ESTIMATOR_PARAMS_KEY)
        if stored is not None:
            params = dict(stored)
            if params.get("bounds") is not None:
                params["bounds"] = tuple(params["bounds"])
            return params
        p = manifest["params"]
        params = {name: p[name] for name in ("n_components", "n_layers", "epsilon", "dp_data", "r_source",
                                             "r_value", "max_passes")}
        params.update(block_size=manifest["block_size"], random_state=manifest["seed"])
        if manifest["privacy"] is not None:
            mechanism = manifest["privacy"]["statement"]["mechanism"]
            params.update(delta=mechanism["delta"], d=mechanism["d"], bounds=(mechanism["lower"], mechanism["upper"]),
                          cluster_on=manifest["cluster_on"])
        return params

    def to_classifier(self) -> KAHMClassifier:
        """The equivalent fitted :class:`~kahm_dask.KAHMClassifier`: one
        :class:`~kahm_dask.WideKAHM` per class assembled from the stored cluster models (loaded
        here, in the client), with the model store's k-means seed as ``random_state``.

        Of a DP model, ``dp_data_`` holds each class's stored DP rows in cluster order (when the
        store has them) and ``fabrication_passes_`` the smoother passes per cluster.
        """
        check_is_fitted(self, "model_path_")
        manifest = read_manifest(self.model_path_)
        seed = manifest["seed"]
        clf = KAHMClassifier(**{name: getattr(self, name) for name in SHARED_PARAMS if name != "random_state"},
                             random_state=seed, min_range=manifest["params"]["min_range"])
        root = None if seed is None else as_seed_sequence(seed)
        clusters = self._clusters_by_class(manifest)
        models = []
        for c, entries in enumerate(clusters):
            parts = np.repeat(np.arange(len(entries)), [e["n_rows"] for e in entries])
            wide = clf._wide(None if root is None else child_seed_sequence(root, PARTITION_STREAM, c))
            branches = [load_cluster(cluster_dir(self.model_path_, c, e["cluster"])) for e in entries]
            models.append(wide.assemble(branches, parts))
        clf.classes_ = self.classes_.copy()
        clf.models_ = models
        clf.n_branches_ = np.array([m.n_branches_ for m in models])
        clf.n_features_in_ = self.n_features_in_
        if hasattr(self, "feature_names_in_"):
            clf.feature_names_in_ = self.feature_names_in_
        if hasattr(self, "privacy_statement_"):
            clf.privacy_statement_ = self.privacy_statement_
            self._set_dp_attributes(clf, clusters)
        return clf

    @staticmethod
    def _clusters_by_class(manifest: dict) -> list[list[dict]]:
        """The manifest's cluster entries of each class code, in cluster order."""
        return [sorted((e for e in manifest["clusters"] if e["class"] == c), key=lambda e: e["cluster"])
                for c in range(len(manifest["classes"]))]

    def _set_dp_attributes(self, clf: KAHMClassifier, clusters: list[list[dict]]) -> None:
        """Set ``clf.dp_data_`` (each class's stored DP rows in cluster order, when every cluster
        has them) and, when fabricated, ``clf.fabrication_passes_`` (per cluster, None where not
        recorded)."""
        dp_rows, passes = {}, {}
        for c, (label, entries) in enumerate(zip(self.classes_.tolist(), clusters, strict=True)):
            groups = [zarr.open_group(str(cluster_dir(self.model_path_, c, e["cluster"])), mode="r") for e in entries]
            if all("fabricated" in g for g in groups):
                dp_rows[label] = np.concatenate([g["fabricated"][...] for g in groups])
            passes[label] = [g.attrs["info"].get("passes") for g in groups]
        if len(dp_rows) == len(clusters):
            clf.dp_data_ = dp_rows
        if self.dp_data == "fabricated":
            clf.fabrication_passes_ = passes

    @classmethod
    def from_classifier(cls, clf: KAHMClassifier, path: str | os.PathLike) -> DaskKAHMClassifier:
        """Write the fitted :class:`~kahm_dask.KAHMClassifier` ``clf`` as a model store at
        ``path`` (atomically; an existing model store there is replaced) and return the fitted
        estimator on it.

        ``random_state`` is kept when it is an int (else None); the store has no DP rows (the
        classifier does not keep which branch each of its rows went to) and no release id.
        """
        if not isinstance(clf, KAHMClassifier):
            raise TypeError(f"clf must be a fitted KAHMClassifier, got {type(clf).__name__}.")
        check_is_fitted(clf, "models_")
        params = {name: getattr(clf, name) for name in SHARED_PARAMS}
        if not isinstance(params["random_state"], Integral) or isinstance(params["random_state"], bool):
            params["random_state"] = None
        est = cls(**params)
        est._check_params()
        private = clf.epsilon is not None
        clusters = []
        target = Path(path).absolute()
        _check_target(target)
        with atomic_directory(target) as tmp:
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
            write_manifest(tmp, {
                "format_version": 1,
                "kahm_dask_version": __version__,
                "classes": _jsonable(clf.classes_),
                "n_features": int(clf.n_features_in_),
                "params": clf._recipe().to_dict(),
                "seed": params["random_state"],
                "seed_streams": {"partition": [PARTITION_STREAM]},
                "block_size": clf.block_size,
                "cluster_on": clf.cluster_on if private else None,
                "privacy": {"release_id": None, "statement": clf.privacy_statement_.to_dict()} if private else None,
                "clusters": clusters,
                "versions": _versions(),
                ESTIMATOR_PARAMS_KEY: est._stored_params(),
            })
        return cls.load(target)
