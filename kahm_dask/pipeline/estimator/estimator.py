"""The scikit-learn API over the Dask pipeline: :class:`DaskKAHMClassifier`.

``fit`` runs :func:`~kahm_dask.pipeline.training.train_pipeline` on the estimator's client
(``client``; default the current one, else a LocalCluster started for the fit). A DP fit, or one
whose rows do not fit the workers' memory, first writes the rows to a Zarr dataset store
(:func:`~kahm_dask.pipeline.stores.dataset.write_dataset`, in ``store_dir``); a non-private fit
whose rows fit trains from them directly (:mod:`~kahm_dask.pipeline.stores.held`). The fitted
estimator is a handle on the model store it wrote. Prediction is the pipeline's blockwise min/argmin reduction
(:func:`~kahm_dask.pipeline.predict.class_distance_array`): lazy dask arrays for dask input (the
cluster models are loaded by the tasks, never in the client), NumPy arrays for NumPy input.
:meth:`DaskKAHMClassifier.to_local` and :meth:`DaskKAHMClassifier.from_local` convert to and from
the in-memory :class:`~kahm_dask.KAHMClassifier`. The habits are xgboost.dask's and LightGBM's:
the constructor is the in-memory one plus the Dask-only arguments, the cluster is a client,
pickling drops it, and a pickle carries the model unless the model lives in a named store.
"""

from __future__ import annotations

import copy
import os
import uuid
from collections.abc import Mapping
from numbers import Integral
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
from distributed import Client
from sklearn.base import BaseEstimator
from sklearn.metrics import accuracy_score
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from kahm_dask._validation import check_label_types, check_n_classes
from kahm_dask.base import KAHMClassifierBase
from kahm_dask.classifier import KAHMClassifier
from kahm_dask.params import CLASSIFIER_PARAMS, PARAMS, PARTITION_PARAMS, Range, parameter_constraints
from kahm_dask.pipeline.cluster.progress import Progress
from kahm_dask.pipeline.config.sections import PipelineConfig, estimator_params
from kahm_dask.pipeline.estimator.clients import compute_on, current_client, fitting_client
from kahm_dask.pipeline.estimator.conversion import to_local, write_local
from kahm_dask.pipeline.estimator.stores import (
    DATA,
    ESTIMATOR_PARAMS_KEY,
    MODEL,
    WORK,
    check_target,
    estimator_keys,
    model_store_files,
    owned_model_store,
    params_from_manifest,
    restore_model_store,
    store_root,
)
from kahm_dask.pipeline.placement import as_placed, worker_addresses
from kahm_dask.pipeline.predict import certified_code_array, class_distance_array
from kahm_dask.pipeline.stores.dataset import DatasetStore, open_dataset, write_dataset
from kahm_dask.pipeline.stores.held import hold_rows
from kahm_dask.pipeline.stores.manifest import read_manifest
from kahm_dask.pipeline.stores.rows import rows_per_chunk
from kahm_dask.pipeline.training import TrainingRows, TrainSettings, rows_held_in_memory, train_pipeline, trained_on
from kahm_dask.pipeline.training.layout import class_layout
from kahm_dask.privacy.statement import PrivacyStatement
from kahm_dask.storage.location import LocationLike, as_location, committed_directory, copy_tree
from kahm_dask.storage.locks import exclusive

__all__ = ["DaskKAHMClassifier", "ESTIMATOR_PARAMS_KEY"]


#: Key of the pickled state holding the files of a model store in a temporary directory.
_CARRIED_STORE = "_model_store_files"


def _seed_constraints() -> list:
    """``random_state``'s rule restricted to what the pipeline takes as its seed: None or an int ≥ 0."""
    return [c for c in PARAMS["random_state"].rule if c is None or isinstance(c, Range)]


def _take(codes: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """The labels (m,) of class codes (m,)."""
    return classes[codes]


class DaskKAHMClassifier(KAHMClassifierBase):
    """KAHM classifier trained and evaluated by the Dask pipeline (docs/design.md).

    The model of :class:`~kahm_dask.KAHMClassifier` (one wide deep KAHM per class, one branch per
    within-class k-means cluster, DP rows per cluster with ``epsilon``;
    docs/algorithm.md#dp-classifier), with the data and the models in Zarr stores and the work on
    a Dask cluster: the training rows are never loaded whole, and prediction on a dask array is a
    lazy blockwise reduction. It runs on :attr:`client` (set it, or let it be the current
    ``distributed`` client); without any client, ``fit`` starts a LocalCluster of one
    single-threaded worker process per usable core and closes it after the fit (in a script,
    under ``if __name__ == "__main__":``, as for any Dask cluster of worker processes). For a
    remote scheduler, ``store_dir`` must be a path or URL that the client and every worker see.

    Parameters
    ----------
    n_components, n_layers, block_size, epsilon, record_epsilon, record_delta, delta, bounds, d, dp_data, \
r_source, r_value, cluster_on, max_passes, s_rule, min_range, chunk_size, n_init, kmeans_dims, n_probe, eval_dtype, \
n_jobs, ledger, budget, insecure_noise_seed : as in KAHMClassifier
        As in :class:`~kahm_dask.KAHMClassifier`: the same rules and defaults, from
        :data:`kahm_dask.params.PARAMS`. ``ledger="auto"`` records every DP fit in the training
        rows' own privacy ledger, the one ``KAHMClassifier`` and the ``kahm-dask`` commands use
        for the same rows. ``n_probe`` and ``eval_dtype`` act at prediction and may be changed
        after ``fit``. ``n_jobs`` is the threads of the classifier :meth:`to_local` returns (the
        pipeline's parallelism is the cluster's). None of ``ledger``, ``budget``,
        ``insecure_noise_seed`` and ``n_jobs`` is written to the model store.
    random_state : int or None, default=None
        The pipeline's k-means seed (not private; the noise never depends on it). None: a seed
        drawn at each fit, recorded in the model store's manifest.
    min_cluster_size, oversampling_factor, init_max_iter, kmeans_max_iter, max_cluster_rows, \
persist_fraction : the partition's
        The partition of the pipeline (a pipeline file's ``partition`` section; meanings, rules
        and defaults in :data:`kahm_dask.params.PARAMS`): a class whose rows take more than
        ``persist_fraction`` of a worker's memory is clustered out of core with k-means‖ and
        dask-ml Lloyd; ``max_cluster_rows`` bounds the memory of every training task.
    store_dir : str, path or None, default=None
        Directory (a local path, or a URL such as ``s3://bucket/prefix`` reached with
        ``storage_options``) of the stores a fit writes: ``train.zarr`` (the training rows, for a
        DP fit, or one whose rows take more than ``persist_fraction`` of the workers' memory;
        not when ``fit`` is given a dataset store), ``work/`` (private copies and the noisy rows:
        they stay with the data owner) and ``model.zarr`` (the model store; of a DP fit,
        publishable). A fit replaces them. None: a temporary directory owned by the estimator and
        deleted with it (keep the model with :meth:`save`).
    chunk_rows : int or None, default=None
        Rows per chunk of the stores a fit writes, and of NumPy inputs to prediction; None:
        about 32 MiB per chunk.
    storage_options : dict or None, default=None
        fsspec options (credentials, ``client_kwargs={"endpoint_url": ...}``, …) for the URLs
        this estimator reads and writes: ``store_dir``, a dataset store URL given to ``fit`` or
        the predictions, and the targets of :meth:`save` and :meth:`load`
        (:mod:`kahm_dask.storage.location`). Passed to the tasks on the workers; never written
        to a store, and masked in the repr.

    Attributes
    ----------
    client : the ``distributed.Client`` it computes on (None: the current client, at each call);
        not a parameter (a client cannot be copied by ``clone``) and not pickled. The first time
        the estimator computes on a client whose worker processes it did not start, it registers
        the pipeline's worker plugins there (one BLAS thread per Dask thread, the allocator
        setting, the task code imported up front: :func:`~kahm_dask.pipeline.cluster.prepare_workers`)
    classes_ : (C,) class labels
    n_features_in_ : int, p
    model_path_ : :class:`~pathlib.Path` of the model store, or its URL (str) for a remote one
    n_clusters_ : int, clusters (branches) of all classes together
    n_branches_ : (C,) branches per class
    epsilon_ : float or None, the ε per entry of the release (solved from ``record_epsilon`` when set)
    privacy_statement_ : :class:`~kahm_dask.privacy.statement.PrivacyStatement` (DP only)

    Notes
    -----
    Given the same rows, parameters and ``random_state``, the fit gives the branches of
    :class:`~kahm_dask.KAHMClassifier` as long as every class's k-means runs in one task (a class
    whose rows take at most ``persist_fraction`` of a worker's memory); larger classes are
    clustered out of core (k-means‖ and dask-ml), which partitions differently.

    A pickle (``pickle``, ``joblib.dump``, ``copy.deepcopy``) never holds the client. Fitted
    without ``store_dir``, it carries the model store's files (the manifest and each cluster's
    model arrays and attributes, and of a DP model its DP rows; nothing from ``train.zarr`` or
    ``work/``, nor the training rows' fingerprint): the copy writes them to a temporary directory
    of its own, deleted with it, and predicts anywhere, like the fitting estimator. The model
    store of a DP fit is publishable, and so is such a pickle; a non-private model is fitted on
    the private rows, and its pickle stays with the data owner as its store does. Fitted with
    ``store_dir`` or loaded, the pickle names the model store (a few KB) and the copy reads it
    there.

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
    >>> import pickle
    >>> twin = pickle.loads(pickle.dumps(clf))  # no store_dir: the pickle carries the model store
    >>> twin.model_path_ != clf.model_path_, bool((twin.predict(split.X_test) == pred.compute()).all())
    (True, True)
    >>> client.close(); cluster.close()
    """

    _parameter_constraints: dict = {
        **parameter_constraints(*CLASSIFIER_PARAMS, *PARTITION_PARAMS),
        "random_state": _seed_constraints(),
        "store_dir": [None, str, os.PathLike],
        "chunk_rows": [None, Range(Integral, 1, None, closed="left")],
        "storage_options": [None, dict],
    }
    _fitted_attribute = "model_path_"

    def __init__(
        self,
        n_components: int = 20,
        n_layers: int = 1,
        block_size: int = 1000,
        random_state: int | None = None,
        *,
        epsilon: float | None = None,
        record_epsilon: float | None = None,
        record_delta: float = 1e-5,
        delta: float = 0.0,
        bounds=None,
        d=None,
        dp_data: str = "noisy",
        r_source: str = "passes",
        r_value: float | int | None = None,
        cluster_on: str = "noisy",
        max_passes: int = 100,
        s_rule: str = "round",
        min_range: float | None = 1e-3,
        chunk_size: int = 1000,
        n_init: int = 1,
        kmeans_dims: int | None = 50,
        n_probe: int | None = None,
        eval_dtype: str = "auto",
        n_jobs: int | None = None,
        ledger="auto",
        budget: tuple[float, float] | None = None,
        insecure_noise_seed: int | None = None,
        min_cluster_size: int | None = None,
        oversampling_factor: float | None = None,
        init_max_iter: int = 5,
        kmeans_max_iter: int = 100,
        max_cluster_rows: int | None = None,
        persist_fraction: float = 0.25,
        store_dir: str | os.PathLike | None = None,
        chunk_rows: int | None = None,
        storage_options: dict | None = None,
    ) -> None:
        self.n_components = n_components
        self.n_layers = n_layers
        self.block_size = block_size
        self.random_state = random_state
        self.epsilon = epsilon
        self.record_epsilon = record_epsilon
        self.record_delta = record_delta
        self.delta = delta
        self.bounds = bounds
        self.d = d
        self.dp_data = dp_data
        self.r_source = r_source
        self.r_value = r_value
        self.cluster_on = cluster_on
        self.max_passes = max_passes
        self.s_rule = s_rule
        self.min_range = min_range
        self.chunk_size = chunk_size
        self.n_init = n_init
        self.kmeans_dims = kmeans_dims
        self.n_probe = n_probe
        self.eval_dtype = eval_dtype
        self.n_jobs = n_jobs
        self.ledger = ledger
        self.budget = budget
        self.insecure_noise_seed = insecure_noise_seed
        self.min_cluster_size = min_cluster_size
        self.oversampling_factor = oversampling_factor
        self.init_max_iter = init_max_iter
        self.kmeans_max_iter = kmeans_max_iter
        self.max_cluster_rows = max_cluster_rows
        self.persist_fraction = persist_fraction
        self.store_dir = store_dir
        self.chunk_rows = chunk_rows
        self.storage_options = storage_options

    # ------------------------------------------------------------------ the client
    @property
    def client(self) -> Client | None:
        """The client this estimator computes on: the one set, else the current one (None if
        there is none: a fit then starts a LocalCluster, a NumPy prediction runs on threads)."""
        return current_client(self.__dict__.get("_client"))

    @client.setter
    def client(self, client: Client | None) -> None:
        self._client = client

    def __getstate__(self) -> dict:
        """The pickled state: the parameters and fitted attributes without the client, and the
        model store's files when it lies in the estimator's temporary directory (the class
        docstring's Notes)."""
        state = dict(super().__getstate__())  # a copy: object.__getstate__ returns __dict__ itself
        state.pop("_client", None)  # a client is a connection: the copy finds its own
        state.pop("_owned_dir", None)  # the original owns its directory; a copy gets its own
        model = owned_model_store(self)
        if model is not None:
            state[_CARRIED_STORE] = model_store_files(model)
            del state["model_path_"]
        return state

    def __setstate__(self, state: dict) -> None:
        """Restore a pickled state; a carried model store is written to a new temporary
        directory owned by this copy (deleted with it, as a fit's)."""
        state = dict(state)
        files = state.pop(_CARRIED_STORE, None)
        super().__setstate__(state)
        if files is not None:
            self.model_path_ = restore_model_store(self, files)

    def __repr__(self, N_CHAR_MAX: int = 700) -> str:
        """scikit-learn's repr, with the values of ``storage_options`` (credentials) masked."""
        if not self.storage_options:
            return super().__repr__(N_CHAR_MAX)
        shown = copy.copy(self)
        shown.storage_options = dict.fromkeys(self.storage_options, "***")
        return BaseEstimator.__repr__(shown, N_CHAR_MAX)

    # ------------------------------------------------------------------ fitting
    @classmethod
    def from_config(cls, cfg: PipelineConfig, *, bounds=None, d=None) -> DaskKAHMClassifier:
        """The estimator a pipeline file describes (:func:`~kahm_dask.pipeline.config.sections.estimator_params`);
        ``bounds`` and ``d``: the DP release's feature bounds and adjacency bound in feature units,
        as the run found them (None: as written)."""
        params = estimator_params(cfg)
        if bounds is not None:
            params["bounds"] = bounds
        if d is not None:
            params["d"] = d
        return cls(**params)

    def train_settings(
        self, *, bounds_source: str | None = None, budget: tuple[float, float] | None = None
    ) -> TrainSettings:
        """The pipeline's :class:`~kahm_dask.pipeline.training.TrainSettings` of these parameters,
        after checking them (``fit``, ``kahm-dask train``, ``kahm-dask run`` and the federated run
        all use it). ``bounds_source``: where ``bounds`` come from, for the privacy statement;
        ``budget``: (ε, δ) cap of the training rows' ledger (None: the ``budget`` parameter)."""
        r_value = self._check_params()
        return TrainSettings.from_params(self.get_params(deep=False), r_value=r_value,
                                         bounds_source=bounds_source, budget=budget)

    def fit_store(
        self, store: TrainingRows, model_path: LocationLike, work_path: LocationLike, *,
        client: Client | None = None, progress: Progress | bool = False, bounds_source: str | None = None,
        budget: tuple[float, float] | None = None,
    ) -> dict:
        """Train on the dataset ``store`` into the model store ``model_path``, with the private work
        stores (noisy rows, private copies) in ``work_path``, on ``client`` (None: Dask's default
        scheduler); returns the pipeline's training summary. ``bounds_source`` and ``budget``: as in
        :meth:`train_settings`.

        The one fit :meth:`fit`, ``kahm-dask train`` and ``kahm-dask run`` share; they differ only in
        where the stores live. Finished clusters staged in ``work_path`` are kept (a rerun resumes).
        """
        settings = self.train_settings(bounds_source=bounds_source, budget=budget)
        own = estimator_keys(self.get_params(deep=False), settings.to_params())
        summary = train_pipeline(store, model_path, work_path, settings, client, progress=progress,
                                 manifest_extra={ESTIMATOR_PARAMS_KEY: own})
        self._set_fitted(model_path, read_manifest(model_path))
        self._trained_on = trained_on(summary)  # each model's home for predictions
        return summary

    def fit(self, X, y=None) -> DaskKAHMClassifier:
        """Train one model per (class, cluster) on the Dask cluster.

        X : (N, p) NumPy array (or array-like), (N, p) dask array, or the path or URL (read with
            ``storage_options``) of a dataset store written by
            :func:`~kahm_dask.pipeline.stores.dataset.write_dataset` or
            :func:`~kahm_dask.pipeline.stores.dataset.ingest` (then its labels are used and ``y``
            must be None).
        y : (N,) labels (NumPy, list or dask array); None with a store path.
        """
        self._check_params()
        source = self._training_source(X, y)
        root = store_root(self)
        work, model = root / WORK, root / MODEL
        with exclusive(root.path if root.is_local else None, "store_dir"):
            for stale in (work, model):  # a fit starts afresh (new noise, new k-means)
                stale.remove()
            with fitting_client(self.__dict__.get("_client")) as client:
                store = source if isinstance(source, DatasetStore) else self._training_rows(source, root, client)
                self.fit_store(store, model, work, client=client)
        return self

    def _training_rows(self, source: tuple[Any, Any], root, client: Client) -> TrainingRows:
        """The rows ``source`` = (X, y) as the training run reads them: held in the workers'
        memory for a non-private fit whose rows fit there (the run's own rule,
        :func:`~kahm_dask.pipeline.training.rows_held_in_memory`; ``root/train.zarr`` of an
        earlier fit is removed), else written to the dataset store ``root/train.zarr``."""
        data, settings = root / DATA, self.train_settings()
        if not settings.params.private:
            held = hold_rows(*source, chunk_rows=self.chunk_rows)
            if rows_held_in_memory({"X": held.X()}, class_layout(held.y()), settings, client):
                data.remove()  # private rows of an earlier fit
                return held
        return write_dataset(data, *source, chunk_rows=self.chunk_rows, overwrite=True)

    def _training_source(self, X, y) -> DatasetStore | tuple[Any, Any]:
        """The dataset store named by ``X``, or the checked ``(X, y)`` to write to one; sets
        ``n_features_in_`` (and ``feature_names_in_`` for a DataFrame)."""
        if isinstance(X, str | os.PathLike):
            if y is not None:
                raise ValueError(f"X is the dataset store {os.fspath(X)!r}, whose labels are used; pass y=None.")
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
        X, y = validate_data(self, X, y, dtype=[np.float64, np.float32], ensure_min_samples=2)
        check_classification_targets(y)
        check_n_classes(np.unique(y).tolist())  # before the store is written (the pipeline checks it again)
        return X, y

    def _forget_feature_names(self) -> None:
        if hasattr(self, "feature_names_in_"):
            del self.feature_names_in_

    def _set_fitted(self, model_path: LocationLike, manifest: dict) -> None:
        """The fitted attributes of the model store at ``model_path`` (its ``manifest``)."""
        clusters = manifest["clusters"]
        self.classes_ = np.asarray(manifest["classes"])
        self.n_features_in_ = int(manifest["n_features"])
        self.model_path_ = as_location(model_path, self.storage_options).public()
        self.n_clusters_ = len(clusters)
        self.n_branches_ = np.bincount([e["class"] for e in clusters], minlength=len(self.classes_))
        self.epsilon_ = None
        if manifest["privacy"] is not None:
            statement = dict(manifest["privacy"]["statement"])
            statement.pop("holds", None)  # derived from the weakenings
            self.privacy_statement_ = PrivacyStatement(**statement)
            self.epsilon_ = self.privacy_statement_.mechanism["epsilon"]
        elif hasattr(self, "privacy_statement_"):
            del self.privacy_statement_

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
        """``job`` itself for lazy input (the caller computes it), else computed on :attr:`client`
        with each cluster model evaluated on its home worker (:mod:`kahm_dask.pipeline.placement`)."""
        if lazy:
            return job
        return compute_on(job, self.__dict__.get("_client"), optimize_graph=False)  # keeps the homes

    def _lazy_distances(self, X) -> tuple[da.Array, bool]:
        """The lazy class distances of X (a :class:`~kahm_dask.pipeline.placement.PlacedArray`),
        each model evaluated on the worker of :attr:`client` that trained it (where the fit left
        it in the cache), or on a home chosen by its rows (:mod:`kahm_dask.pipeline.placement`)."""
        X, lazy = self._queries(X)
        return class_distance_array(self.model_path_, X, n_probe=self.n_probe, eval_dtype=self.eval_dtype,
                                    storage_options=self.storage_options, workers=worker_addresses(self.client),
                                    trained_on=self.__dict__.get("_trained_on")), lazy

    def class_distances(self, X) -> da.Array | np.ndarray:
        """Per-class distances ``Γ_{W_c}(x)`` (eq. 64; docs/algorithm.md#wide-kahm) → (m, C).

        X : (m, p) NumPy array (→ NumPy), dask array or dataset store path (→ lazy dask array).
        """
        return self._result(*self._lazy_distances(X))

    def _certified_labels(self, X) -> da.Array | np.ndarray:
        """Labels (m,) by the certified prediction (docs/algorithm.md#certified-prediction,
        :func:`~kahm_dask.pipeline.predict.certified_code_array`), on the models' homes as
        :meth:`class_distances`; lazy for lazy X."""
        X, lazy = self._queries(X)
        codes = certified_code_array(self.model_path_, X, storage_options=self.storage_options,
                                     workers=worker_addresses(self.client), trained_on=self.__dict__.get("_trained_on"),
                                     n_probe=self.n_probe)
        dtype = self.classes_.dtype
        labels = codes.map_blocks(_take, self.classes_, dtype=dtype, meta=np.empty((0,), dtype))
        return self._result(as_placed(labels), lazy)

    def _map_distances(self, X, fn, *, rows: bool, dtype) -> da.Array | np.ndarray:
        D, lazy = self._lazy_distances(X)
        meta = np.empty((0,) if rows else (0, 0), dtype)
        mapped = D.map_blocks(fn, dtype=dtype, meta=meta, **({"drop_axis": 1} if rows else {}))
        return self._result(as_placed(mapped), lazy)

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
        check_target(target)
        with committed_directory(target) as tmp:
            copy_tree(source, tmp)
        return target.public()

    @classmethod
    def load(cls, path: str | os.PathLike, *, storage_options: Mapping[str, Any] | None = None) -> DaskKAHMClassifier:
        """A fitted estimator on the model store at ``path`` (a local path, or a URL read with
        ``storage_options``; used in place, not copied), with the parameters the store was
        fitted with (its manifest's) and the ``storage_options`` given here (never stored)."""
        where = as_location(path, storage_options)
        manifest = read_manifest(where)
        est = cls(**params_from_manifest(manifest), storage_options=storage_options)
        est._set_fitted(where, manifest)
        return est

    def to_local(self) -> KAHMClassifier:
        """The equivalent fitted in-memory :class:`~kahm_dask.KAHMClassifier`
        (:func:`~kahm_dask.pipeline.estimator.conversion.to_local`)."""
        check_is_fitted(self, "model_path_")
        return to_local(self)

    @classmethod
    def from_local(
        cls, clf: KAHMClassifier, path: str | os.PathLike, *, storage_options: Mapping[str, Any] | None = None
    ) -> DaskKAHMClassifier:
        """Write the fitted :class:`~kahm_dask.KAHMClassifier` ``clf`` as a model store at ``path``
        (a local path, or a URL written with ``storage_options``; atomically, as in :meth:`save`;
        an existing model store there is replaced) and return the fitted estimator on it."""
        if not isinstance(clf, KAHMClassifier):
            raise TypeError(f"clf must be a fitted KAHMClassifier, got {type(clf).__name__}.")
        check_is_fitted(clf, "models_")
        est = cls(**{name: getattr(clf, name) for name in CLASSIFIER_PARAMS})
        if isinstance(est.random_state, np.random.SeedSequence | np.random.Generator):
            est.random_state = None
        est._check_params()
        target = as_location(path, storage_options)
        check_target(target)
        write_local(clf, target, est.get_params(deep=False))
        return cls.load(target, storage_options=storage_options)
