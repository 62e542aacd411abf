"""The scikit-learn API over the Dask pipeline: :class:`DaskKAHMClassifier`.

``fit`` writes the training rows to a Zarr dataset store (:func:`~kahm_dask.pipeline.stores.dataset.write_dataset`)
and runs :func:`~kahm_dask.pipeline.training.train.train_pipeline` on the current ``distributed`` client, or on
a LocalCluster it starts and closes; the fitted estimator is a handle on the model store it wrote.
Prediction is the pipeline's blockwise min/argmin reduction
(:func:`~kahm_dask.pipeline.predict.class_distance_array`, docs/algorithm.md#classifier): lazy dask
arrays for dask input (the cluster models are loaded by the tasks, never in the client), NumPy
arrays for NumPy input. :meth:`DaskKAHMClassifier.to_classifier` and
:meth:`DaskKAHMClassifier.from_classifier` convert to and from the in-memory
:class:`~kahm_dask.KAHMClassifier`.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import uuid
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from numbers import Integral
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import zarr
from distributed import Client, default_client
from distributed.security import Security
from joblib import cpu_count
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.metrics import accuracy_score
from sklearn.utils._param_validation import validate_parameter_constraints
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from kahm_dask._random import as_seed_sequence, child_seed_sequence
from kahm_dask._validation import check_label_types
from kahm_dask._version import __version__
from kahm_dask.classifier import PARTITION_STREAM, KAHMClassifier, class_matching_scores, class_proportions
from kahm_dask.params import PARAMS, Range, check_r_value, parameter_constraints
from kahm_dask.partition import KMEANS_DIMS
from kahm_dask.pipeline.cluster import compute, connect, connect_address
from kahm_dask.pipeline.cluster.progress import Progress
from kahm_dask.pipeline.cluster.security import as_security, check_address
from kahm_dask.pipeline.config import ADDRESS, ClusterConfig, PipelineConfig
from kahm_dask.pipeline.predict import class_distance_array
from kahm_dask.pipeline.stores.dataset import DatasetStore, open_dataset, write_dataset
from kahm_dask.pipeline.stores.model import (
    cluster_location,
    load_cluster,
    read_manifest,
    save_cluster,
    versions,
    write_manifest,
)
from kahm_dask.pipeline.stores.rows import rows_per_chunk
from kahm_dask.pipeline.training import TrainSettings, train_pipeline
from kahm_dask.privacy.ledger import check_budget
from kahm_dask.privacy.statement import PrivacyStatement
from kahm_dask.recipe import TrainParams
from kahm_dask.storage.location import Location, LocationLike, as_location, committed_directory, copy_tree
from kahm_dask.storage.locks import exclusive

__all__ = ["DaskKAHMClassifier", "ESTIMATOR_PARAMS_KEY"]

#: The parameters :class:`DaskKAHMClassifier` shares with :class:`~kahm_dask.KAHMClassifier`.
SHARED_PARAMS = (
    "n_components", "n_layers", "block_size", "random_state", "epsilon", "delta", "bounds", "d", "dp_data",
    "r_source", "r_value", "cluster_on", "max_passes", "s_rule", "n_init", "kmeans_dims", "n_probe", "eval_dtype",
    "ledger", "budget", "insecure_noise_seed",
)
#: The partition settings of the pipeline (the ``partition`` section of a pipeline file), which the
#: in-memory estimator does not have: a class too large for one task is clustered out of core.
PARTITION_PARAMS = (
    "min_cluster_size", "oversampling_factor", "init_max_iter", "kmeans_max_iter", "max_cluster_rows",
    "persist_fraction",
)
#: Manifest key of the estimator's public parameters (all but ``store_dir`` and
#: ``insecure_noise_seed``), so that :meth:`DaskKAHMClassifier.load` restores them.
ESTIMATOR_PARAMS_KEY = "estimator_params"
#: Where a fit writes under ``store_dir``: the training rows, the pipeline's work store
#: (private copies, noisy rows) and the model store.
DATA, WORK, MODEL = "train.zarr", "work", "model.zarr"
#: Not in the manifest: local paths, the test-only noise seed, and where the fit ran (``security``
#: holds the paths of a private key and certificates; ``storage_options`` may hold credentials).
_NOT_STORED = ("store_dir", "insecure_noise_seed", "scheduler", "security", "storage_options", "ledger", "budget")


def _seed_constraints() -> list:
    """``random_state``'s rule restricted to what the pipeline takes as its seed: None or an int ≥ 0."""
    return [c for c in PARAMS["random_state"].rule if c is None or isinstance(c, Range)]


def _current_client() -> Client | None:
    """The ``distributed`` client this process uses by default, or None."""
    try:
        return default_client()
    except ValueError:
        return None


def _scheduler_security(scheduler: str | None, security: Any) -> Security | None:
    """The ``security`` parameter as a ``Security`` for the ``scheduler`` parameter, checked:
    ``scheduler`` an address with protocol, ``security`` given for and only for a ``tls://``
    one (:func:`~kahm_dask.pipeline.cluster.security.check_address`)."""
    security = as_security(security)
    if scheduler is None:
        if security is not None:
            raise ValueError("security is given but scheduler is None: security is how the estimator "
                             "connects to scheduler='tls://host:port'; give that address too.")
        return None
    ADDRESS["check"](scheduler, "scheduler")
    check_address(scheduler, security is not None, address_key="scheduler", tls_key="security")
    return security


@contextmanager
def _training_client(scheduler: str | None = None, security: Any = None) -> Iterator[Client]:
    """A client on ``scheduler`` (with ``security``; :func:`_scheduler_security`) for the
    duration of the fit; without one, the current client, else one on a LocalCluster of one
    single-threaded worker process per usable core (joblib's ``cpu_count``: affinity and cgroup
    quotas; :func:`~kahm_dask.pipeline.cluster.connect`), closed on exit."""
    if scheduler is not None:
        with connect_address(scheduler, security=_scheduler_security(scheduler, security)) as client:
            yield client
        return
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


def _check_target(path: Location) -> None:
    """Raise unless ``path`` is free or holds a complete model store (which a write may replace)."""
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
    remote scheduler, ``store_dir`` must be a path or URL that the client and every worker see), else
    on a LocalCluster of one single-threaded worker process per usable core that it starts
    and closes (in a script, call it under ``if __name__ == "__main__":``, as for any Dask
    cluster of worker processes).

    Parameters
    ----------
    n_components, n_layers, block_size, epsilon, delta, bounds, d, dp_data, r_source, r_value, \
cluster_on, max_passes, s_rule, n_init, kmeans_dims, n_probe, eval_dtype, ledger, budget, insecure_noise_seed
        As in :class:`~kahm_dask.KAHMClassifier` (the same rules, from
        :data:`kahm_dask.params.PARAMS`). The DP noise comes from the operating system's
        secure generator unless ``insecure_noise_seed`` (tests only) is set. ``ledger="auto"``
        records every DP fit in the training rows' own privacy ledger, the one
        ``KAHMClassifier`` and the ``kahm-dask`` commands use for the same rows (neither
        ``ledger`` nor ``budget`` is written to the model store). ``n_probe`` and
        ``eval_dtype`` (the precision of the prediction tasks' kernel blocks,
        docs/algorithm.md#evaluation-precision) act at prediction and may be changed after ``fit``.
    min_cluster_size, oversampling_factor, init_max_iter, kmeans_max_iter, max_cluster_rows, \
persist_fraction
        The partition of the pipeline (a pipeline file's ``partition`` section; meanings and
        rules in :data:`kahm_dask.params.PARAMS`): a class whose rows take more than a quarter
        of a worker's memory is clustered out of core with k-means‖ and dask-ml Lloyd;
        ``max_cluster_rows`` bounds the memory of every training task.
    random_state : int or None, default=None
        The pipeline's k-means seed (not private; the noise never depends on it). None: a seed
        drawn at each fit, recorded in the model store's manifest.
    store_dir : str, path or None, default=None
        Directory (a local path, or a URL such as ``s3://bucket/prefix`` reached with
        ``storage_options``) of the stores a fit writes: ``train.zarr`` (the training rows, unless ``fit``
        is given a dataset store; its privacy ledger ``train.zarr.privacy-ledger.json`` beside
        it), ``work/`` (private copies and the noisy rows: they stay with the data owner) and
        ``model.zarr`` (the model store; of a DP fit, publishable). A fit replaces these three.
        None: a temporary directory owned by the estimator and deleted with it (keep the
        model with :meth:`save`).
    chunk_rows : int or None, default=None
        Rows per chunk of the stores a fit writes, and of NumPy inputs to prediction; None:
        about 32 MiB per chunk.
    scheduler : str or None, default=None
        Address of a running Dask scheduler (``tcp://host:port`` or ``tls://host:port``):
        ``fit`` connects to it for the duration of the fit, and predictions of NumPy input are
        computed on a connection to it (lazy predictions stay lazy: compute them on a client
        of your own). ``store_dir`` must then be a path the client and every worker see.
        None: the current client, else a LocalCluster (above).
    security : distributed.security.Security, mapping or None, default=None
        TLS settings for a ``tls://`` ``scheduler`` (required for it, refused for any other):
        a ``Security``, or a mapping of ``ca_file``, ``cert``, ``key`` (optional if ``cert``
        holds it) and ``require_encryption`` (default True), the keys of the ``tls`` section
        (:mod:`kahm_dask.pipeline.cluster.security`). Neither ``scheduler`` nor ``security`` is
        written to the model store.
    storage_options : dict or None, default=None
        fsspec options (credentials, ``client_kwargs={"endpoint_url": ...}``, …) for the URLs
        this estimator reads and writes: ``store_dir``, a dataset store URL given to ``fit`` or
        the predictions, and the targets of :meth:`save` and :meth:`load`
        (:mod:`kahm_dask.storage.location`). Passed to the tasks on the workers; never written
        to a store.

    Attributes
    ----------
    classes_ : (C,) class labels
    n_features_in_ : int, p
    model_path_ : :class:`~pathlib.Path` of the model store, or its URL (str) for a remote one
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
    >>> from kahm_dask.datasets import PUBLIC_BOUNDS, load_bundled, split_and_scale
    >>> split = split_and_scale(*load_bundled("digits"), bounds=PUBLIC_BOUNDS["digits"])
    >>> cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None)
    >>> client = Client(cluster)
    >>> # name=False: random task names (dask's default names a chunk by a hash of its private content)
    >>> X = da.from_array(split.X_train, chunks=(300, -1), name=False)
    >>> clf = DaskKAHMClassifier(n_components=10, random_state=0).fit(X, split.y_train)
    >>> pred = clf.predict(da.from_array(split.X_test, chunks=(300, -1), name=False))  # lazy
    >>> isinstance(pred, da.Array), bool((pred.compute() == split.y_test).mean() >= 0.95)
    (True, True)
    >>> client.close(); cluster.close()
    """

    _parameter_constraints: dict = {
        **parameter_constraints(*SHARED_PARAMS, *PARTITION_PARAMS),
        "random_state": _seed_constraints(),
        "store_dir": [None, str, os.PathLike],
        "chunk_rows": [None, Range(Integral, 1, None, closed="left")],
        "scheduler": [None, str],
        "security": [None, Security, Mapping],
        "storage_options": [None, dict],
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
        min_cluster_size: int | None = None,
        oversampling_factor: float | None = None,
        init_max_iter: int = 5,
        kmeans_max_iter: int = 100,
        max_cluster_rows: int | None = None,
        persist_fraction: float = 0.25,
        n_probe: int | None = None,
        eval_dtype: str = "float64",
        ledger="auto",
        budget: tuple[float, float] | None = None,
        insecure_noise_seed: int | None = None,
        store_dir: str | os.PathLike | None = None,
        chunk_rows: int | None = None,
        scheduler: str | None = None,
        security: Security | Mapping[str, Any] | None = None,
        storage_options: dict | None = None,
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
        self.min_cluster_size = min_cluster_size
        self.oversampling_factor = oversampling_factor
        self.init_max_iter = init_max_iter
        self.kmeans_max_iter = kmeans_max_iter
        self.max_cluster_rows = max_cluster_rows
        self.persist_fraction = persist_fraction
        self.n_probe = n_probe
        self.eval_dtype = eval_dtype
        self.ledger = ledger
        self.budget = budget
        self.insecure_noise_seed = insecure_noise_seed
        self.store_dir = store_dir
        self.chunk_rows = chunk_rows
        self.scheduler = scheduler
        self.security = security
        self.storage_options = storage_options

    # ------------------------------------------------------------------ fitting
    def _check_params(self) -> int | float | None:
        """Raise scikit-learn's ``InvalidParameterError`` naming the first parameter that breaks
        its rule; returns ``r_value`` as ``r_source`` takes it."""
        name = type(self).__name__
        validate_parameter_constraints(self._parameter_constraints, self.get_params(deep=False), name)
        _scheduler_security(self.scheduler, self.security)  # before any file is written
        check_budget(self.budget, "budget")
        return check_r_value(self.r_source, self.r_value, name)

    @classmethod
    def from_config(cls, cfg: PipelineConfig, *, bounds=None, d=None) -> DaskKAHMClassifier:
        """The estimator a pipeline file describes: its ``model``, ``privacy`` and ``partition``
        sections and its ``seed`` (the one translation of a pipeline file into parameters, used by
        ``kahm-dask run``); ``bounds`` and ``d``: the DP release's feature bounds and adjacency
        bound in feature units, as the run found them (None: ``privacy.d`` as written)."""
        m, p, part = cfg.model, cfg.privacy, cfg.partition
        return cls(
            n_components=m.n_components, n_layers=m.n_layers, block_size=m.block_size, random_state=cfg.seed,
            epsilon=p.epsilon, delta=p.delta, bounds=bounds, d=p.d if d is None else d, dp_data=p.dp_data,
            r_source=p.r_source,
            r_value=p.r_value, cluster_on=p.cluster_on, max_passes=p.max_passes, s_rule=m.s_rule, n_init=m.n_init,
            kmeans_dims=m.kmeans_dims, min_cluster_size=m.min_cluster_size,
            oversampling_factor=part.oversampling_factor, init_max_iter=part.init_max_iter,
            kmeans_max_iter=part.max_iter, max_cluster_rows=part.max_cluster_rows,
            persist_fraction=part.persist_fraction, n_probe=m.n_probe, eval_dtype=m.eval_dtype,
            ledger="auto" if p.ledger_dir is None else str(p.ledger_dir),
        )

    def train_settings(
        self, *, bounds_source: str | None = None, budget: tuple[float, float] | None = None
    ) -> TrainSettings:
        """The pipeline's :class:`~kahm_dask.pipeline.training.train.TrainSettings` of these parameters, after
        checking them: the one translation of parameters into settings (``fit``, ``kahm-dask train``,
        ``kahm-dask run`` and the federated run all use it).

        bounds_source : where ``bounds`` come from, for the privacy statement
            (:data:`~kahm_dask.privacy.bounds.BOUNDS_PUBLIC` when None and bounds are given).
        budget : (ε, δ) cap of the training rows' privacy ledger (None: the ``budget``
            parameter); a release beyond it is refused before any noise is drawn.
        """
        r_value = self._check_params()
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
            bounds_source=bounds_source,
            block_size=self.block_size,
            s_rule=self.s_rule,
            cluster_on=self.cluster_on,
            n_init=self.n_init,
            kmeans_dims=self.kmeans_dims,
            min_cluster_size=self.min_cluster_size,
            oversampling_factor=self.oversampling_factor,
            init_max_iter=self.init_max_iter,
            kmeans_max_iter=self.kmeans_max_iter,
            max_cluster_rows=self.max_cluster_rows,
            kmeans_persist_fraction=self.persist_fraction,
            ledger=self.ledger,
            budget=check_budget(self.budget if budget is None else budget),
            insecure_noise_seed=self.insecure_noise_seed,
        )

    def fit_store(
        self, store: DatasetStore, model_path: LocationLike, work_path: LocationLike, *,
        client: Client | None = None, progress: Progress | bool = False, bounds_source: str | None = None,
        budget: tuple[float, float] | None = None,
    ) -> dict:
        """Train on the dataset ``store`` into the model store ``model_path``, with the private work
        stores (noisy rows, private copies) in ``work_path``, on ``client`` (None: Dask's default
        scheduler); returns the pipeline's training summary. ``bounds_source`` and ``budget``: as in
        :meth:`train_settings`.

        The one fit :meth:`fit`, ``kahm-dask train`` and ``kahm-dask run`` share; they differ only in
        where the stores live. Finished clusters already in ``model_path`` are kept (a rerun resumes).
        """
        settings = self.train_settings(bounds_source=bounds_source, budget=budget)
        summary = train_pipeline(store, model_path, work_path, settings, client, progress=progress,
                                 manifest_extra=lambda seed: {ESTIMATOR_PARAMS_KEY: self._stored_params(seed=seed)})
        self._set_fitted(model_path, read_manifest(model_path))
        return summary

    def _store_root(self) -> Location:
        """``store_dir`` (a local directory, created, or a URL), or a new temporary directory
        deleted with this estimator (the previous fit's temporary directory is deleted now)."""
        previous = self.__dict__.pop("_owned_dir", None)
        if previous is not None:
            previous()
        if self.store_dir is not None:
            root = as_location(self.store_dir, self.storage_options)
            if root.is_local:
                root.path.mkdir(parents=True, exist_ok=True)
            return root
        root = tempfile.mkdtemp(prefix="kahm-dask-")
        self._owned_dir = weakref.finalize(self, shutil.rmtree, root, ignore_errors=True)
        return as_location(root)

    def fit(self, X, y=None) -> DaskKAHMClassifier:
        """Train one model per (class, cluster) on the Dask cluster.

        X : (N, p) NumPy array (or array-like), (N, p) dask array, or the path or URL (read
            with ``storage_options``) of a dataset store written by
            :func:`~kahm_dask.pipeline.stores.dataset.write_dataset` or
            :func:`~kahm_dask.pipeline.stores.dataset.ingest` (then its labels are used and ``y``
            must be None).
        y : (N,) labels (NumPy, list or dask array); None with a store path.
        """
        self._check_params()
        source = self._training_source(X, y)
        root = self._store_root()
        work, model = root / WORK, root / MODEL
        with exclusive(root.path if root.is_local else None, "store_dir"):
            for stale in (work, model):  # a fit starts afresh (new noise, new k-means)
                stale.remove()
            with _training_client(self.scheduler, self.security) as client:
                store = source if isinstance(source, DatasetStore) else write_dataset(
                    root / DATA, *source, chunk_rows=self.chunk_rows, overwrite=True
                )
                self.fit_store(store, model, work, client=client)
        return self

    def _training_source(self, X, y) -> DatasetStore | tuple[Any, Any]:
        """The dataset store named by ``X``, or the checked ``(X, y)`` to write to one; sets
        ``n_features_in_`` (and ``feature_names_in_`` for a DataFrame)."""
        if isinstance(X, str | os.PathLike):
            if y is not None:
                raise ValueError(
                    f"X is the dataset store {os.fspath(X)!r}, whose labels are used; pass y=None."
                )
            store = open_dataset(X, storage_options=self.storage_options)
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

    def _stored_params(self, seed: int | None = None) -> dict:
        """The public parameters, as JSON, for the model store's manifest; ``random_state`` is the
        k-means ``seed`` the fit used when given (a seed drawn by the fit, or kept by a resumed run,
        is recorded, so the same store gives the same parameters however it was reached)."""
        params = {k: _jsonable(v) for k, v in self.get_params(deep=False).items() if k not in _NOT_STORED}
        if seed is not None:
            params["random_state"] = int(seed)
        return params

    def _set_fitted(self, model_path: LocationLike, manifest: dict) -> None:
        """The fitted attributes of the model store at ``model_path`` (its ``manifest``)."""
        clusters = manifest["clusters"]
        self.classes_ = np.asarray(manifest["classes"])
        self.n_features_in_ = int(manifest["n_features"])
        self.model_path_ = as_location(model_path, self.storage_options).public()
        self.n_clusters_ = len(clusters)
        self.n_branches_ = np.bincount([e["class"] for e in clusters], minlength=len(self.classes_))
        if manifest["privacy"] is not None:
            statement = dict(manifest["privacy"]["statement"])
            statement.pop("holds", None)  # derived from the weakenings
            self.privacy_statement_ = PrivacyStatement(**statement)
        elif hasattr(self, "privacy_statement_"):
            del self.privacy_statement_

    def __repr__(self, N_CHAR_MAX: int = 700) -> str:
        """scikit-learn's repr, with the values of ``storage_options`` (credentials) masked."""
        if not self.storage_options:
            return super().__repr__(N_CHAR_MAX)
        shown = copy.copy(self)
        shown.storage_options = dict.fromkeys(self.storage_options, "***")
        return BaseEstimator.__repr__(shown, N_CHAR_MAX)

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
            return open_dataset(X, storage_options=self.storage_options).X(), True
        X = validate_data(self, X, dtype=np.float64, reset=False)
        rows = rows_per_chunk(self.chunk_rows, X.shape[0], X.shape[1], X.dtype)
        # a random name: dask's default is a hash of the content, which would name private rows
        # in every task key (seen by the scheduler and its dashboard)
        return da.from_array(X, chunks=(rows, -1), name=f"kahm-queries-{uuid.uuid4().hex}"), False

    def _result(self, job: da.Array, lazy: bool) -> da.Array | np.ndarray:
        """``job`` itself for lazy input (the caller computes it), else computed: on a connection
        to ``scheduler`` if given, else on the current client (or threads)."""
        if lazy:
            return job
        if self.scheduler is None:
            return compute(job, _current_client())
        with connect_address(self.scheduler, security=_scheduler_security(self.scheduler, self.security)) as client:
            return compute(job, client)

    def _distances(self, X) -> tuple[da.Array, bool]:
        X, lazy = self._queries(X)
        return class_distance_array(self.model_path_, X, n_probe=self.n_probe, eval_dtype=self.eval_dtype,
                                    storage_options=self.storage_options), lazy

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
            y = open_dataset(X, storage_options=self.storage_options).labels()
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
    def save(self, path: str | os.PathLike) -> Path | str:
        """Copy the model store to ``path`` (a local path, or a URL written with
        ``storage_options``) atomically: an existing model store there is replaced, any other
        existing path is refused; on an object store the copy is written in place with its
        completion marker last (:func:`~kahm_dask.storage.location.committed_directory`).
        Returns the path (the URL for a remote one)."""
        check_is_fitted(self, "model_path_")
        source = as_location(self.model_path_, self.storage_options)
        target = as_location(path, self.storage_options)
        if target == source:
            return target.public()
        _check_target(target)
        with committed_directory(target) as tmp:
            copy_tree(source, tmp)
        return target.public()

    @classmethod
    def load(cls, path: str | os.PathLike, *, storage_options: dict | None = None) -> DaskKAHMClassifier:
        """A fitted estimator on the model store at ``path`` (a local path, or a URL read with
        ``storage_options``; used in place, not copied).

        Its parameters are those the store was fitted with: all of them for a store written by
        this class, else those its manifest records (a ``kahm-dask train`` store); its
        ``storage_options`` are the ones given here (they are never stored).
        """
        where = as_location(path, storage_options)
        manifest = read_manifest(where)
        est = cls(**cls._params_from_manifest(manifest), storage_options=storage_options)
        est._set_fitted(where, manifest)
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
        manifest = read_manifest(self.model_path_, storage_options=self.storage_options)
        seed = manifest["seed"]
        clf = KAHMClassifier(**{name: getattr(self, name) for name in SHARED_PARAMS if name != "random_state"},
                             random_state=seed, min_range=manifest["params"]["min_range"])
        root = None if seed is None else as_seed_sequence(seed)
        clusters = self._clusters_by_class(manifest)
        models = []
        for c, entries in enumerate(clusters):
            parts = np.repeat(np.arange(len(entries)), [e["n_rows"] for e in entries])
            wide = clf._wide(None if root is None else child_seed_sequence(root, PARTITION_STREAM, c))
            branches = [load_cluster(self._cluster(c, e["cluster"])) for e in entries]
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
            groups = [zarr.open_group(self._cluster(c, e["cluster"]).zarr_store(read_only=True), mode="r")
                      for e in entries]
            if all("fabricated" in g for g in groups):
                dp_rows[label] = np.concatenate([g["fabricated"][...] for g in groups])
            passes[label] = [g.attrs["info"].get("passes") for g in groups]
        if len(dp_rows) == len(clusters):
            clf.dp_data_ = dp_rows
        if self.dp_data == "fabricated":
            clf.fabrication_passes_ = passes

    def _cluster(self, c: int, s: int) -> Location:
        """Where cluster (c, s) of the fitted model store is."""
        return cluster_location(self.model_path_, c, s, self.storage_options)

    @classmethod
    def from_classifier(
        cls, clf: KAHMClassifier, path: str | os.PathLike, *, storage_options: dict | None = None
    ) -> DaskKAHMClassifier:
        """Write the fitted :class:`~kahm_dask.KAHMClassifier` ``clf`` as a model store at
        ``path`` (a local path, or a URL written with ``storage_options``; atomically, as in
        :meth:`save`; an existing model store there is replaced) and return the fitted
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
        target = as_location(path, storage_options)
        _check_target(target)
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
                "versions": versions(),
                ESTIMATOR_PARAMS_KEY: est._stored_params(),
            })
        return cls.load(target, storage_options=storage_options)
