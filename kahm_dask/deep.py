"""Conditionally deep KAHM (Definitions 3–4) and wide KAHM (Definitions 5–6).

A deep KAHM stacks L KAHMs of the same data with dimensions ``max(n − l + 1, 1)`` and returns,
per query, the layer output nearest to the query. A wide KAHM k-means-partitions the data into
S branches, one deep KAHM each, and returns the branch output nearest to the query. Ties keep
the lowest layer / branch index (docs/algorithm.md#decision-ties). See
docs/algorithm.md#deep-kahm and docs/algorithm.md#wide-kahm.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from kahm_dask._batching import row_chunks
from kahm_dask._validation import as_data_matrix, check_n_features, check_n_rows, check_positive_int
from kahm_dask.kahm import EVAL_BLOCK_ROWS, KAHM, _buffer, _row_sq_norms, principal_subspace
from kahm_dask.partition import (
    check_partition,
    default_min_cluster_size,
    kmeans_partition,
    n_branches,
)

__all__ = ["DeepKAHM", "WideKAHM", "layer_dimensions"]


def layer_dimensions(n_components: int, n_layers: int) -> list[int]:
    """Requested dimension of layer l = 1..L: ``max(n − l + 1, 1)``.

    See docs/algorithm.md#decision-layer-dimensions.
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


def _query_blocks(Yq: np.ndarray):
    """Row blocks of at most EVAL_BLOCK_ROWS rows (cache/BLAS-sized, docs/performance.md)."""
    return row_chunks(Yq.shape[0], EVAL_BLOCK_ROWS)


class _BatchEvaluator(TransformerMixin, BaseEstimator):
    """Shared public evaluation API: chunked ``_evaluate_rows`` behind validation."""

    def _validate_queries(self, Yq) -> np.ndarray:
        check_is_fitted(self, "n_features_in_")
        Yq = as_data_matrix(Yq, "Yq")
        check_n_features(Yq.shape[1], self.n_features_in_, type(self).__name__)
        return Yq

    def _evaluate(self, Yq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        m = Yq.shape[0]
        images, gamma = np.empty_like(Yq), np.empty(m)
        index = np.empty(m, dtype=np.int64)
        for rows in row_chunks(m, self.chunk_size):
            images[rows], gamma[rows], index[rows] = self._evaluate_rows(Yq[rows])
        return images, gamma, index

    def transform(self, Yq) -> np.ndarray:
        """Model outputs for the query rows ``Yq`` (m, p) → (m, p)."""
        return self._evaluate(self._validate_queries(Yq))[0]

    def distance(self, Yq) -> np.ndarray:
        """Distances ``Γ(y) = ‖y − F(y)‖`` of the query rows → (m,) (images not kept)."""
        return self._distance_rows(self._validate_queries(Yq))[0]

    def transform_with_distance(self, Yq) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Outputs (m, p), distances (m,) and the selected layer/branch index (m,)."""
        return self._evaluate(self._validate_queries(Yq))


class DeepKAHM(_BatchEvaluator):
    """Conditionally deep KAHM ``D_{Y,n,L}`` (Definitions 3–4, eqs. 50–52, 55).

    Layer l applies ``A_{Y,n_l}`` to the output of layer l − 1 (layer 1 to the query), with
    ``n_l = max(n − l + 1, 1)`` capped by the data (docs/algorithm.md#kahm-guards). All layers
    model the same ``Y``, so one PCA serves them all, and layers whose capped dimension
    coincides share one fitted KAHM.

    Parameters
    ----------
    n_components : int, default=20
    n_layers : int, default=5
    min_range : float or None, default=1e-3   (see :class:`KAHM`)
    chunk_size : int, default=1000

    Attributes
    ----------
    layers_ : list of fitted :class:`KAHM`, one per layer (possibly shared objects)
    layer_dims_ : list of int, the effective dimension of each layer
    n_features_in_ : int
    """

    def __init__(
        self,
        n_components: int = 20,
        n_layers: int = 5,
        *,
        min_range: float | None = 1e-3,
        chunk_size: int = 1000,
    ) -> None:
        self.n_components = n_components
        self.n_layers = n_layers
        self.min_range = min_range
        self.chunk_size = chunk_size

    def _kahm(self) -> KAHM:
        return KAHM(self.n_components, min_range=self.min_range, chunk_size=self.chunk_size)

    def fit(self, Y, y=None) -> "DeepKAHM":
        """Fit L KAHMs to ``Y`` (N, p)."""
        check_positive_int(self.n_components, "n_components")
        check_positive_int(self.n_layers, "n_layers")
        check_positive_int(self.chunk_size, "chunk_size")
        Y = as_data_matrix(Y, "Y")
        self._fit_validated(Y)
        return self

    def _fit_validated(self, Y: np.ndarray) -> "DeepKAHM":
        subspace = principal_subspace(Y, self.n_components, self.min_range)
        by_dim: dict[int, KAHM] = {}
        layers = []
        for n_l in layer_dimensions(self.n_components, self.n_layers):
            dim = min(n_l, subspace.n_cap)
            if dim not in by_dim:
                layer = self._kahm()
                layer._check_params()
                layer._fit_subspace(Y, subspace, dim)
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
    def from_state(cls, layer_states: list, meta: dict) -> "DeepKAHM":
        """Rebuild a fitted DeepKAHM from :meth:`to_state` output."""
        model = cls(**meta["params"])
        distinct = [KAHM.from_state(arrays, scalars) for arrays, scalars in layer_states]
        model.layers_ = [distinct[i] for i in meta["layer_map"]]
        model.layer_dims_ = [layer.n_components_ for layer in model.layers_]
        model.n_features_in_ = int(meta["n_features_in"])
        return model

    def _evaluate_rows(self, Yq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Nested layer outputs ``M_l`` (eq. 51), the nearest one and its layer index."""
        m = Yq.shape[0]
        best_g = np.full(m, np.inf)
        best_img = np.full_like(Yq, np.nan)
        best_l = np.zeros(m, dtype=np.int64)
        for rows in _query_blocks(Yq):
            self._block_into(Yq[rows], best_g[rows], best_img[rows], best_l[rows])
        return best_img, best_g, best_l

    def _distance_rows(self, Yq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``Γ_D`` (eq. 55) and the selected layer, without keeping the images (cheaper)."""
        m = Yq.shape[0]
        best_g = np.full(m, np.inf)
        best_l = np.zeros(m, dtype=np.int64)
        for rows in _query_blocks(Yq):
            self._block_into(Yq[rows], best_g[rows], None, best_l[rows])
        return best_g, best_l

    def _block_into(self, yq: np.ndarray, best_g, best_img, best_l) -> None:
        """All L layers for one block of query rows (≤ EVAL_BLOCK_ROWS) while it is in cache.

        Updates the running minimum (``best_*`` views, in place; ``best_img`` may be None).
        Layer outputs alternate between two per-thread buffers: layer l reads layer l − 1's.
        """
        shape = yq.shape
        x = yq
        for l, layer in enumerate(self.layers_):
            out = _buffer("layer-even" if l % 2 == 0 else "layer-odd", shape)
            bad = layer._images_into(x, out)
            layer._warn_degenerate(bad, x, stacklevel=4)
            diff = np.subtract(yq, out, out=_buffer("diff", shape))
            g = np.sqrt(_row_sq_norms(diff))
            g[bad] = np.inf
            _running_min(best_g, best_img, best_l, g, out, l)
            x = out


class WideKAHM(_BatchEvaluator):
    """Wide conditionally deep KAHM ``W_{Y,n,L,S}`` (Definitions 5–6, eqs. 57–64).

    Parameters
    ----------
    n_components, n_layers : int
        Passed to every branch's :class:`DeepKAHM`.
    block_size : int, default=1000
        N_b; the number of branches is ``S = max(1, round(N / N_b))`` (``s_rule="ceil"``
        for ⌈N/N_b⌉).
    random_state : None, int, SeedSequence or Generator
        Seeds the k-means runs (one derived stream per attempt).
    min_cluster_size : int or None
        Default ``max(30, n + 2)``.
    n_init : int, default=10
        k-means restarts.
    s_rule, min_range, chunk_size : see above and :class:`KAHM`.

    Attributes
    ----------
    branches_ : list of fitted :class:`DeepKAHM`
    n_branches_ : int, S after the minimum-cluster-size rule
    branch_sizes_ : (S,) rows per branch
    n_features_in_ : int
    """

    def __init__(
        self,
        n_components: int = 20,
        n_layers: int = 5,
        block_size: int = 1000,
        random_state=None,
        *,
        min_cluster_size: int | None = None,
        n_init: int = 10,
        s_rule: str = "round",
        min_range: float | None = 1e-3,
        chunk_size: int = 1000,
    ) -> None:
        self.n_components = n_components
        self.n_layers = n_layers
        self.block_size = block_size
        self.random_state = random_state
        self.min_cluster_size = min_cluster_size
        self.n_init = n_init
        self.s_rule = s_rule
        self.min_range = min_range
        self.chunk_size = chunk_size

    def _deep(self) -> DeepKAHM:
        return DeepKAHM(
            self.n_components, self.n_layers, min_range=self.min_range, chunk_size=self.chunk_size
        )

    def _min_cluster_size(self) -> int:
        if self.min_cluster_size is None:
            return default_min_cluster_size(self.n_components)
        return check_positive_int(self.min_cluster_size, "min_cluster_size")

    def partition(self, Y: np.ndarray) -> np.ndarray:
        """k-means branch labels (N,) of validated ``Y`` (docs/algorithm.md#kmeans-partition)."""
        S = n_branches(Y.shape[0], self.block_size, self.s_rule)
        return kmeans_partition(
            Y,
            S,
            min_cluster_size=self._min_cluster_size(),
            random_state=self.random_state,
            n_init=check_positive_int(self.n_init, "n_init"),
        )

    def fit(self, Y, y=None, *, partition=None) -> "WideKAHM":
        """Fit to ``Y`` (N, p).

        ``partition`` : optional (N,) integer branch labels that replace the k-means
        partition (e.g. labels computed by the Dask pipeline); each branch needs ≥ 2 rows.
        """
        for name in ("n_components", "n_layers", "block_size", "chunk_size"):
            check_positive_int(getattr(self, name), name)
        Y = as_data_matrix(Y, "Y")
        check_n_rows(Y.shape[0], 2, "Y")
        if partition is None:
            labels = self.partition(Y)
            ids = np.unique(labels)
        else:
            labels, ids = check_partition(partition, Y.shape[0])
        self.branches_ = [self._deep()._fit_validated(Y[labels == s]) for s in ids]
        self.branch_sizes_ = np.array([np.count_nonzero(labels == s) for s in ids])
        self.n_branches_ = len(ids)
        self.n_features_in_ = Y.shape[1]
        return self

    def _evaluate_rows(self, Yq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every branch's deep output; keep the nearest (eqs. 57–58)."""
        m = Yq.shape[0]
        best_g = np.full(m, np.inf)
        best_img = np.full_like(Yq, np.nan)
        best_s = np.zeros(m, dtype=np.int64)
        for rows in _query_blocks(Yq):
            yq = Yq[rows]
            k = yq.shape[0]
            # the branch's own running minimum over its layers, then the minimum over branches
            g_b, l_b = np.empty(k), np.empty(k, dtype=np.int64)
            img_b = np.empty_like(yq)
            for s, branch in enumerate(self.branches_):
                g_b.fill(np.inf)
                img_b.fill(np.nan)
                branch._block_into(yq, g_b, img_b, l_b)
                _running_min(best_g[rows], best_img[rows], best_s[rows], g_b, img_b, s)
        return best_img, best_g, best_s

    def _distance_rows(self, Yq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``Γ_W`` (eq. 64) and the selected branch, without keeping the images (cheaper).

        The minimum over branches of the minimum over layers is the minimum over all (branch,
        layer) pairs, so one running minimum serves both; ties keep the lowest branch.
        """
        m = Yq.shape[0]
        best_g = np.full(m, np.inf)
        best_s = np.zeros(m, dtype=np.int64)
        for rows in _query_blocks(Yq):
            yq = Yq[rows]
            k = yq.shape[0]
            g_b, l_b = np.empty(k), np.empty(k, dtype=np.int64)
            for s, branch in enumerate(self.branches_):
                g_b.fill(np.inf)
                branch._block_into(yq, g_b, None, l_b)
                _running_min(best_g[rows], None, best_s[rows], g_b, None, s)
        return best_g, best_s
