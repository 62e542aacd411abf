"""Conditionally deep KAHM (Definitions 3–4) and wide KAHM (Definitions 5–6).

A deep KAHM stacks L KAHMs of the same data with dimensions ``max(n − l + 1, 1)`` and returns,
per query, the layer output nearest to the query. A wide KAHM k-means-partitions the data into
S branches, one deep KAHM each, and returns the branch output nearest to the query. Ties keep
the lowest layer / branch index (docs/decisions.md#decision-ties). See
docs/algorithm.md#deep-kahm and docs/algorithm.md#wide-kahm.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin, _fit_context
from sklearn.utils.validation import check_is_fitted

from kahm_dask._batching import row_chunks
from kahm_dask._validation import as_data_matrix, check_n_features, check_n_rows, weights_dtype
from kahm_dask.float32_bound import class_intervals
from kahm_dask.kahm import EVAL_BLOCK_ROWS, KAHM, _buffer, _row_sq_norms, eval_dtype, principal_subspace
from kahm_dask.params import check_estimator_params, parameter_constraints
from kahm_dask.partition import (
    KMEANS_DIMS,
    check_partition,
    default_min_cluster_size,
    kmeans_partition,
    n_branches,
)
from kahm_dask.routing import routed_intervals, routed_minimum

__all__ = ["DeepKAHM", "WideKAHM", "layer_dimensions"]


def layer_dimensions(n_components: int, n_layers: int) -> list[int]:
    """Requested dimension of layer l = 1..L: ``max(n − l + 1, 1)``.

    See docs/decisions.md#decision-layer-dimensions.
    """
    return [max(n_components - l + 1, 1) for l in range(1, n_layers + 1)]


def _running_min(best_g, best_img, best_idx, g, img, idx) -> None:
    """Replace rows where ``g`` is strictly smaller (ties keep the earlier index).

    ``best_img`` and ``img`` may be None (distances only)."""
    better = g < best_g
    best_g[better] = g[better]
    if best_img is not None:
        best_img[better] = img[better]
    best_idx[better] = idx


def _query_blocks(n_rows: int, chunk_rows: int | None) -> Iterator[slice]:
    """Row blocks of at most EVAL_BLOCK_ROWS rows (cache/BLAS-sized, docs/performance.md),
    each inside one chunk of ``chunk_rows`` consecutive rows (None: one chunk of all rows)."""
    for chunk in row_chunks(n_rows, max(n_rows, 1) if chunk_rows is None else chunk_rows):
        for block in row_chunks(chunk.stop - chunk.start, EVAL_BLOCK_ROWS):
            yield slice(chunk.start + block.start, chunk.start + block.stop)


class _BatchEvaluator(TransformerMixin, BaseEstimator):
    """The one blocked evaluation of deep and wide KAHMs behind the public API.

    A subclass implements ``_block_into(yq, best_g, best_img, best_idx, dtype)``: the running
    minimum (:func:`_running_min`) over its candidate outputs (layers or branches) for one block
    of at most EVAL_BLOCK_ROWS query rows, written into the given views, with the kernel blocks
    in the NumPy ``dtype`` (docs/algorithm.md#evaluation-precision).
    """

    def _validate_queries(self, Yq) -> np.ndarray:
        check_is_fitted(self, "n_features_in_")
        Yq = as_data_matrix(Yq, "Yq")
        check_n_features(Yq.shape[1], self.n_features_in_, type(self).__name__)
        return Yq

    def _evaluate_rows(
        self,
        Yq: np.ndarray,
        *,
        keep_images: bool = True,
        chunk_rows: int | None = None,
        dtype: str | None = None,
    ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
        """Outputs F(y) (m, p) — None unless ``keep_images`` —, distances ``Γ(y) = ‖y − F(y)‖``
        (m,) and the selected layer/branch index (m,) of validated queries ``Yq`` (m, p).

        Each block of :func:`_query_blocks` goes through ``_block_into`` while it is in cache;
        memory beyond the outputs is one block's temporaries. Rows never reached by a finite
        distance keep Γ = +∞, index 0 and NaN images. ``dtype``: the precision of the kernel
        blocks, "float64" or "float32" (None: ``eval_dtype``); the outputs are float64 either way.
        """
        kernel_dtype = eval_dtype(self.eval_dtype if dtype is None else dtype, type(self).__name__)
        m = Yq.shape[0]
        gamma = np.full(m, np.inf)
        index = np.zeros(m, dtype=np.int64)
        images = np.full_like(Yq, np.nan) if keep_images else None
        for rows in _query_blocks(m, chunk_rows):
            self._block_into(
                Yq[rows], gamma[rows], None if images is None else images[rows], index[rows], kernel_dtype
            )
        return images, gamma, index

    def _distance_rows(self, Yq: np.ndarray, dtype: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Distances (m,) and selected index (m,) of validated queries, without images (cheaper);
        ``dtype`` as in :meth:`_evaluate_rows`."""
        return self._evaluate_rows(Yq, keep_images=False, dtype=dtype)[1:]

    def transform(self, Yq) -> np.ndarray:
        """Model outputs for the query rows ``Yq`` (m, p) → (m, p)."""
        return self._evaluate_rows(self._validate_queries(Yq), chunk_rows=self.chunk_size)[0]

    def distance(self, Yq) -> np.ndarray:
        """Distances ``Γ(y) = ‖y − F(y)‖`` of the query rows → (m,) (images not kept)."""
        return self._distance_rows(self._validate_queries(Yq))[0]

    def transform_with_distance(self, Yq) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Outputs (m, p), distances (m,) and the selected layer/branch index (m,)."""
        return self._evaluate_rows(self._validate_queries(Yq), chunk_rows=self.chunk_size)


class DeepKAHM(_BatchEvaluator):
    """Conditionally deep KAHM ``D_{Y,n,L}`` (Definitions 3–4, eqs. 50–52, 55).

    Layer l applies ``A_{Y,n_l}`` to the output of layer l − 1 (layer 1 to the query), with
    ``n_l = max(n − l + 1, 1)`` capped by the data (docs/algorithm.md#kahm-guards). All layers
    model the same ``Y``, so one PCA serves them all, and layers whose capped dimension
    coincides share one fitted KAHM.

    The output for a query y (p,) is the layer output nearest to it,
    ``D(y) = M_{l̂}(y)`` with ``l̂ = argmin_l ‖y − M_l(y)‖`` (ties: the lowest layer), and its
    distance is ``Γ_D(y) = min_l ‖y − M_l(y)‖`` (eq. 55; docs/algorithm.md#deep-kahm).

    Parameters
    ----------
    n_components : int, default=20
        n: layer l asks for dimension ``max(n − l + 1, 1)``
        (docs/decisions.md#decision-layer-dimensions).
    n_layers : int, default=5
        L.
    min_range : float or None, default=1e-3
        See :class:`~kahm_dask.KAHM`.
    chunk_size : int, default=1000
        Query rows per evaluation chunk of ``transform`` (memory only).
    eval_dtype : {"auto", "float64", "float32"}, default="auto"
        Precision of the kernel blocks at evaluation ("auto": float64), passed to every layer; see
        :class:`~kahm_dask.KAHM` and docs/algorithm.md#evaluation-precision.

    Attributes
    ----------
    layers_ : list of L fitted :class:`~kahm_dask.KAHM` (possibly shared objects)
    layer_dims_ : list of L int, the effective dimension of each layer
    n_features_in_ : int, p

    Examples
    --------
    >>> import numpy as np
    >>> from kahm_dask import DeepKAHM
    >>> Y = np.random.default_rng(0).normal(size=(100, 5))
    >>> deep = DeepKAHM(n_components=3, n_layers=4).fit(Y)
    >>> deep.layer_dims_
    [3, 2, 1, 1]
    >>> deep.layers_[2] is deep.layers_[3]  # equal dimensions share one KAHM
    True
    >>> Q = Y[:6] + 0.1
    >>> images, gamma, layer = deep.transform_with_distance(Q)
    >>> images.shape, gamma.shape, layer.shape
    ((6, 5), (6,), (6,))
    >>> bool(np.all(gamma <= deep.layers_[0].distance(Q)))  # layer 1 is a candidate
    True
    """

    _parameter_constraints: dict = parameter_constraints(
        "n_components", "n_layers", "min_range", "chunk_size", "eval_dtype"
    )

    def __init__(
        self,
        n_components: int = 20,
        n_layers: int = 5,
        *,
        min_range: float | None = 1e-3,
        chunk_size: int = 1000,
        eval_dtype: str = "auto",
    ) -> None:
        self.n_components = n_components
        self.n_layers = n_layers
        self.min_range = min_range
        self.chunk_size = chunk_size
        self.eval_dtype = eval_dtype

    def _kahm(self) -> KAHM:
        return KAHM(self.n_components, min_range=self.min_range, chunk_size=self.chunk_size, eval_dtype=self.eval_dtype)

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, Y, y=None) -> DeepKAHM:
        """Fit L KAHMs to ``Y`` (N, p)."""
        dtype = weights_dtype(Y)
        self._fit_validated(as_data_matrix(Y, "Y"), dtype)
        return self

    def _fit_validated(self, Y: np.ndarray, beta_dtype: np.dtype | type = np.float64) -> DeepKAHM:
        """Fit on validated ``Y``; ``beta_dtype`` is every layer's weight precision
        (:meth:`KAHM._fit_subspace`)."""
        subspace = principal_subspace(Y, self.n_components, self.min_range)
        by_dim: dict[int, KAHM] = {}
        layers = []
        for n_l in layer_dimensions(self.n_components, self.n_layers):
            dim = min(n_l, subspace.n_cap)
            if dim not in by_dim:
                layer = self._kahm()  # its parameters are this model's, checked by its fit
                layer._fit_subspace(Y, subspace, dim, beta_dtype=beta_dtype)
                by_dim[dim] = layer
            layers.append(by_dim[dim])
        self.layers_ = layers
        self.layer_dims_ = [layer.n_components_ for layer in layers]
        self.n_features_in_ = Y.shape[1]
        return self

    def to_state(self) -> tuple[list, dict]:
        """Distinct layers' :meth:`KAHM.to_state` and how layers map onto them (for storage)."""
        check_is_fitted(self, "layers_")
        distinct: list[KAHM] = []
        layer_map = []
        for layer in self.layers_:
            if not any(layer is k for k in distinct):
                distinct.append(layer)
            layer_map.append(next(i for i, k in enumerate(distinct) if k is layer))
        meta = {"layer_map": layer_map, "params": self.get_params(), "n_features_in": self.n_features_in_}
        return [k.to_state() for k in distinct], meta

    @classmethod
    def from_state(cls, layer_states: list, meta: dict) -> DeepKAHM:
        """Rebuild a fitted DeepKAHM from :meth:`to_state` output."""
        model = cls(**meta["params"])
        distinct = [KAHM.from_state(arrays, scalars) for arrays, scalars in layer_states]
        model.layers_ = [distinct[i] for i in meta["layer_map"]]
        model.layer_dims_ = [layer.n_components_ for layer in model.layers_]
        model.n_features_in_ = int(meta["n_features_in"])
        return model

    def _distances_with_bound(self, Yq: np.ndarray, dtype: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Γ_D (m,) of validated queries ``Yq`` (m, p) in ``dtype`` (None: ``eval_dtype``) and a
        proven bound (m,) on |Γ_D − Γ_D,64| (docs/algorithm.md#float32-error-bound): the single
        layer's (:meth:`KAHM._distances_with_bound`); +inf with more than one layer, whose later
        layers take the earlier ones' float32 images as input."""
        if len(self.layers_) == 1:
            return self.layers_[0]._distances_with_bound(Yq, dtype)
        return self._distance_rows(Yq, dtype=dtype)[0], np.full(Yq.shape[0], np.inf)

    def _block_into(self, yq: np.ndarray, best_g, best_img, best_l, dtype: np.dtype) -> None:
        """Nested layer outputs ``M_l`` (eq. 51) of one block of query rows (≤ EVAL_BLOCK_ROWS)
        and the running minimum of ``‖y − M_l(y)‖`` over the layers (eq. 55), while it is in cache.

        Updates the ``best_*`` views in place (``best_img`` may be None: distances only).
        Layer outputs alternate between two per-thread float64 buffers: layer l reads layer
        l − 1's. ``dtype``: the NumPy dtype of every layer's kernel block.
        """
        shape = yq.shape
        x = yq
        for l, layer in enumerate(self.layers_):
            out = _buffer("layer-even" if l % 2 == 0 else "layer-odd", shape)
            bad = layer._images_into(x, out, dtype)
            layer._warn_degenerate(bad, x, stacklevel=4)
            diff = np.subtract(yq, out, out=_buffer("diff", shape))
            g = np.sqrt(_row_sq_norms(diff))
            g[bad] = np.inf
            _running_min(best_g, best_img, best_l, g, out, l)
            x = out


class WideKAHM(_BatchEvaluator):
    """Wide conditionally deep KAHM ``W_{Y,n,L,S}`` (Definitions 5–6, eqs. 57–64).

    The rows Y (N, p) are split into S branches (docs/algorithm.md#kmeans-partition), one
    :class:`DeepKAHM` ``D_s`` each; a query y gets the output of the branch nearest to it,
    ``ŝ = argmin_s Γ_{D_s}(y)`` (ties: the lowest branch), and ``Γ_W(y) = min_s Γ_{D_s}(y)``
    (eq. 64; docs/algorithm.md#wide-kahm).

    Parameters
    ----------
    n_components, n_layers : int, default=20, 5
        Passed to every branch's :class:`DeepKAHM`.
    block_size : int, default=1000
        N_b; the number of branches is ``S = max(1, round(N / N_b))`` (``s_rule="ceil"``
        for ⌈N/N_b⌉).
    random_state : None, int, SeedSequence or Generator
        Seeds the k-means runs (one derived stream per attempt).
    min_cluster_size : int or None
        Default ``max(30, n + 2)``.
    n_init : int, default=1
        k-means restarts.
    kmeans_dims : int or None, default=50
        The k-means runs on the rows' top ``kmeans_dims`` principal coordinates
        (:func:`~kahm_dask.partition.kmeans_space`); None: on all features.
    s_rule, min_range, chunk_size : see above and :class:`KAHM`.
    n_probe : int or None, default=None
        Routing of :meth:`distance`: each query is evaluated on the ``n_probe`` branches whose
        centres are nearest to it (:mod:`kahm_dask.routing`,
        docs/algorithm.md#routing); None or ``n_probe ≥ S`` evaluates every branch (eq. 64
        exactly). ``transform`` always evaluates every branch.
    eval_dtype : {"auto", "float64", "float32"}, default="auto"
        Precision of the kernel blocks at evaluation ("auto": float64; docs/algorithm.md#evaluation-precision),
        for every branch whatever the branches' own setting; see :class:`~kahm_dask.KAHM`.

    Attributes
    ----------
    branches_ : list of S fitted :class:`DeepKAHM`
    n_branches_ : int, S after the minimum-cluster-size rule
    branch_sizes_ : (S,) rows per branch
    centres_ : (S, p) mean of each branch's training rows (the routing centres)
    n_features_in_ : int, p

    Examples
    --------
    Two well separated blobs of 100 rows and ``block_size=100``: S = round(200 / 100) = 2.

    >>> import numpy as np
    >>> from kahm_dask import DeepKAHM, WideKAHM
    >>> rng = np.random.default_rng(0)
    >>> Y = np.vstack([rng.normal(size=(100, 4)), rng.normal(size=(100, 4)) + 10.0])
    >>> wide = WideKAHM(n_components=3, n_layers=2, block_size=100, random_state=0).fit(Y)
    >>> wide.n_branches_, sorted(wide.branch_sizes_.tolist())
    (2, [100, 100])
    >>> gamma = wide.distance(Y[:3])
    >>> per_branch = np.column_stack([branch.distance(Y[:3]) for branch in wide.branches_])
    >>> bool(np.array_equal(gamma, per_branch.min(axis=1)))  # eq. 64
    True

    A given partition replaces the k-means; :meth:`assemble` takes branches fitted elsewhere:

    >>> parts = np.repeat([0, 1], 100)
    >>> WideKAHM(3, 2).fit(Y, partition=parts).transform_with_distance(Y[:3])[2].tolist()
    [0, 0, 0]
    >>> branches = [DeepKAHM(3, 2).fit(Y[parts == s]) for s in (0, 1)]
    >>> WideKAHM(3, 2).assemble(branches, parts).branch_sizes_.tolist()
    [100, 100]
    """

    _parameter_constraints: dict = parameter_constraints(
        "n_components", "n_layers", "block_size", "random_state", "min_cluster_size", "n_init", "kmeans_dims",
        "s_rule", "min_range", "chunk_size", "n_probe", "eval_dtype",
    )

    def __init__(
        self,
        n_components: int = 20,
        n_layers: int = 5,
        block_size: int = 1000,
        random_state=None,
        *,
        min_cluster_size: int | None = None,
        n_init: int = 1,
        kmeans_dims: int | None = KMEANS_DIMS,
        s_rule: str = "round",
        min_range: float | None = 1e-3,
        chunk_size: int = 1000,
        n_probe: int | None = None,
        eval_dtype: str = "auto",
    ) -> None:
        self.n_components = n_components
        self.n_layers = n_layers
        self.block_size = block_size
        self.random_state = random_state
        self.min_cluster_size = min_cluster_size
        self.n_init = n_init
        self.kmeans_dims = kmeans_dims
        self.s_rule = s_rule
        self.min_range = min_range
        self.chunk_size = chunk_size
        self.n_probe = n_probe
        self.eval_dtype = eval_dtype

    def _deep(self) -> DeepKAHM:
        return DeepKAHM(
            self.n_components,
            self.n_layers,
            min_range=self.min_range,
            chunk_size=self.chunk_size,
            eval_dtype=self.eval_dtype,
        )

    def _min_cluster_size(self) -> int:
        if self.min_cluster_size is None:
            return default_min_cluster_size(self.n_components)
        return self.min_cluster_size

    def partition(self, Y: np.ndarray) -> np.ndarray:
        """k-means branch labels (N,) of validated ``Y`` (docs/algorithm.md#kmeans-partition)."""
        check_estimator_params(self)
        S = n_branches(Y.shape[0], self.block_size, self.s_rule)
        return kmeans_partition(
            Y,
            S,
            min_cluster_size=self._min_cluster_size(),
            random_state=self.random_state,
            n_init=self.n_init,
            kmeans_dims=self.kmeans_dims,
        )

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, Y, y=None, *, partition=None) -> WideKAHM:
        """Fit to ``Y`` (N, p).

        ``partition`` : optional (N,) integer branch labels that replace the k-means
        partition (e.g. labels computed by the Dask pipeline); each branch needs ≥ 2 rows.
        """
        dtype = weights_dtype(Y)
        Y = as_data_matrix(Y, "Y")
        check_n_rows(Y.shape[0], 2, "Y")
        labels, ids = self.branch_labels(Y, partition)
        return self.assemble([self._deep()._fit_validated(Y[labels == s], dtype) for s in ids], labels)

    def branch_labels(self, Y: np.ndarray, partition=None) -> tuple[np.ndarray, np.ndarray]:
        """Branch labels (N,) of validated ``Y`` (N, p) and their sorted distinct values (S,).

        ``partition`` None: the k-means partition (:meth:`partition`); else the given (N,)
        integer labels, checked (each branch needs ≥ 2 rows).
        """
        if partition is None:
            labels = self.partition(Y)
            return labels, np.unique(labels)
        return check_partition(partition, Y.shape[0])

    def assemble(self, branches: list[DeepKAHM], labels: np.ndarray) -> WideKAHM:
        """Set the fitted state from already-fitted branches and the partition they came from.

        labels : (N,) branch labels of the training rows; ``branches[s]`` is the
        :class:`DeepKAHM` fitted on the rows labelled with the s-th smallest label (what
        :meth:`fit` does, and what a caller that builds each branch's rows itself, e.g. the
        DP classifier with :class:`~kahm_dask.recipe.TrainParams`, hands over).
        """
        ids = np.unique(labels)
        if len(branches) != len(ids):
            raise ValueError(f"{len(branches)} branches for a partition into {len(ids)} parts.")
        self.branches_ = list(branches)
        self.branch_sizes_ = np.array([np.count_nonzero(labels == s) for s in ids])
        self.n_branches_ = len(ids)
        self.centres_ = np.stack([branch.layers_[0].mean_ for branch in self.branches_])
        self.n_features_in_ = self.branches_[0].n_features_in_
        return self

    def distance(self, Yq) -> np.ndarray:
        """Distances ``Γ_W(y)`` (m,) of the query rows ``Yq`` (m, p) (eq. 64), over the
        ``n_probe`` nearest branches when routing is on."""
        return self._distance_rows(self._validate_queries(Yq), n_probe=self.n_probe)[0]

    def _distance_rows(
        self, Yq: np.ndarray, n_probe: int | None = None, dtype: str | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Distances (m,) and selected branch (m,) of validated queries ``Yq`` (m, p).

        ``n_probe`` None or ≥ S: every branch (the blocked exhaustive path). Otherwise the
        minimum over the probed branches only (:func:`~kahm_dask.routing.routed_minimum`,
        docs/algorithm.md#routing). ``dtype``: the precision of the kernel blocks, "float64" or
        "float32" (None: ``eval_dtype``), for every branch.
        """
        if n_probe is None or n_probe >= self.n_branches_:
            return super()._distance_rows(Yq, dtype=dtype)
        dtype = self.eval_dtype if dtype is None else dtype
        eval_dtype(dtype, type(self).__name__)
        return routed_minimum(
            Yq, self.centres_, n_probe, lambda s, rows: self.branches_[s]._distance_rows(rows, dtype=dtype)[0]
        )

    def _distance_intervals(
        self, Yq: np.ndarray, dtype: str | None = None, n_probe: int | None = None
    ) -> tuple[np.ndarray, ...]:
        """Γ_W (m,) of validated queries ``Yq`` (m, p) in ``dtype`` (None: ``eval_dtype``) and the
        interval (lower (m,), upper (m,)) that holds the float64 evaluation's Γ_W,64
        (docs/algorithm.md#float32-error-bound), every branch evaluated or, with ``n_probe`` < S,
        the ``n_probe`` branches of nearest centre (as :meth:`_distance_rows`).

        Each branch s gives Γ_s and a bound b_s (:meth:`DeepKAHM._distances_with_bound`: +inf for
        a branch of more than one layer), so Γ_W,64 = min_s Γ_s,64 lies in
        [min_s (Γ_s − b_s), min_s (Γ_s + b_s)] (:func:`~kahm_dask.float32_bound.class_intervals`),
        the minimum over the same branches as Γ_W,64's (:func:`~kahm_dask.routing.routed_intervals`).
        """
        def interval(s: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            g, b = self.branches_[s]._distances_with_bound(rows, dtype)
            return (g, *class_intervals(g, b))

        if n_probe is not None and n_probe < self.n_branches_:
            return routed_intervals(Yq, self.centres_, n_probe, interval)
        m = Yq.shape[0]
        gamma, lower, upper = np.full(m, np.inf), np.full(m, np.inf), np.full(m, np.inf)
        for s in range(self.n_branches_):
            for total, part in zip((gamma, lower, upper), interval(s, Yq), strict=True):
                np.minimum(total, part, out=total)
        return gamma, lower, upper

    def _distances_with_bound(self, Yq: np.ndarray, dtype: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Γ_W (m,) as in :meth:`_distance_intervals` and a proven bound (m,) on |Γ_W − Γ_W,64|:
        the larger distance from Γ_W to that interval's ends."""
        gamma, lower, upper = self._distance_intervals(Yq, dtype)
        with np.errstate(invalid="ignore"):
            bound = np.maximum(upper - gamma, gamma - lower)
        bound[~np.isfinite(bound)] = np.inf
        return gamma, bound

    def _block_into(self, yq: np.ndarray, best_g, best_img, best_s, dtype: np.dtype) -> None:
        """Every branch's deep output for one block of query rows; keep the nearest
        (eqs. 57–58, Γ_W of eq. 64).

        Each branch's running minimum over its layers, then the minimum over branches (ties keep
        the lowest branch). Updates the ``best_*`` views in place (``best_img`` may be None).
        ``dtype``: the NumPy dtype of every kernel block.
        """
        k = yq.shape[0]
        g_b, l_b = np.empty(k), np.empty(k, dtype=np.int64)
        img_b = None if best_img is None else np.empty_like(yq)
        for s, branch in enumerate(self.branches_):
            g_b.fill(np.inf)
            if img_b is not None:
                img_b.fill(np.nan)
            branch._block_into(yq, g_b, img_b, l_b, dtype)
            _running_min(best_g, best_img, best_s, g_b, img_b, s)
