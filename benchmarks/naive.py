"""The naive formulation of the same model, as the paper writes it (benchmark and test reference).

This is the KAHM classifier of docs/algorithm.md (docs/algorithm.md#kahm to
docs/algorithm.md#classifier) computed the textbook way, used only by the
performance benchmarks (as the baseline the project is measured against) and by the core
tests (naive and fast agree to 1e-9):

* PCA from ``eigh`` of the p×p sample covariance Σ_Y (Definition 1, step 1), θ by its formula
  (eq. 36) and inverted explicitly; the kernel matrix from Mahalanobis distances computed by
  broadcasting (eqs. 35, 39);
* λ* by the fixed point of eq. (21) with an explicit inverse ``inv(K + λI)`` on every iteration
  (the author's loop), iterated to a tight tolerance;
* prediction with the explicit weight matrix ``W = K_q (K + λI)^{-1}`` (m × N, O(m·N²) flops),
  normalised to unit row sums, and ``A = W Y`` (eqs. 31–33).

The only liberty taken is the row shift of docs/algorithm.md#batched-evaluation (multiply each
query's kernel row by ``exp(min_j D²/(2n))``): it cancels in the normalised weights, so the
model is the same, and it keeps queries far from a cluster from turning into 0/0 (the author's
code returns the origin there, which would be a different model). Deep, wide and classifier
layers are plain loops over layers, branches and classes; the branches are the project's own
k-means partition (same seeds), so naive and project models are the same model and should
predict the same classes.

The formulas the models are built from come first, written from docs/algorithm.md
(docs/algorithm.md#krls, docs/algorithm.md#kahm, docs/algorithm.md#distance) with explicit linear
solves (``scipy.linalg.solve``) and broadcasting, never with the library's spectral shortcuts:
the core tests (tests/core/test_kahm.py, test_regularization.py, test_deep_wide.py) compare them
with the library's fast path, quantity by quantity, and tests/core/test_naive_equivalence.py
compares the naive models with the fast models. This is the project's one reference
implementation: the tests and the benchmarks import it from here (``benchmarks.naive``), from a
clone's root (``pytest``, ``python -m benchmarks.…``).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import solve, solve_triangular

from kahm_dask._batching import row_chunks
from kahm_dask._random import as_seed_sequence, child_seed_sequence
from kahm_dask.classifier import PARTITION_STREAM
from kahm_dask.deep import WideKAHM, layer_dimensions

__all__ = [
    "sq_dists", "gaussian_kernel", "direct_R", "kahm_reference", "explicit_images", "affine_residual",
    "NaiveKAHM", "NaiveDeepKAHM", "NaiveWideKAHM", "NaiveKAHMClassifier", "naive_flops",
]


# --------------------------------------------------------------------------- the formulas


def sq_dists(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``D[a, b] = ‖A[a] − B[b]‖²`` by broadcasting (no BLAS expansion trick)."""
    diff = A[:, None, :] - B[None, :, :]
    return np.einsum("abk,abk->ab", diff, diff)


def gaussian_kernel(A: np.ndarray, B: np.ndarray, width: float) -> np.ndarray:
    """``exp(−‖a − b‖² / width)``."""
    return np.exp(-sq_dists(A, B) / width)


def direct_R(K: np.ndarray, Y: np.ndarray, e: float, tau: float) -> float:
    """``R(e, τ)`` of eq. (21) with an explicit solve (no eigendecomposition)."""
    N, p = Y.shape
    lam = e + tau
    F = K @ solve(K + lam * np.eye(N), Y, assume_a="pos")
    return float(np.sum((Y - F) ** 2) / (p * N))


def kahm_reference(Y: np.ndarray, P: np.ndarray):
    """K (eq. 39) and a function mapping queries to their Mahalanobis codes, from Y and a given
    projection P (θ = covariance of the uncentred codes P y, eq. 36; the codes whitened by its
    Cholesky factor)."""
    n = P.shape[0]
    X = Y @ P.T
    theta = np.atleast_2d(np.cov(X, rowvar=False, ddof=1))
    L = np.linalg.cholesky(theta)

    def codes(Q: np.ndarray) -> np.ndarray:
        return solve_triangular(L, (Q @ P.T).T, lower=True).T

    Z = codes(Y)
    D2 = sq_dists(Z, Z)
    K = np.exp(-D2 / (2 * n))
    return K, codes


def explicit_images(K: np.ndarray, lam: float, Kq: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """``w(y)ᵀ Y`` with ``w = h / 1ᵀh``, ``h = (K + λI)^{-1} k(Py)`` by a linear solve (eq. 33)."""
    N = K.shape[0]
    H = solve(K + lam * np.eye(N), Kq.T, assume_a="sym")  # (N, m)
    W = H / H.sum(axis=0, keepdims=True)
    return W.T @ Y


def affine_residual(points: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Least-squares residual norm of ``points − y¹`` against ``span{y^i − y¹}`` (per row)."""
    B = (Y[1:] - Y[0]).T  # (p, N-1)
    R = (points - Y[0]).T  # (p, m)
    coef, *_ = np.linalg.lstsq(B, R, rcond=None)
    return np.linalg.norm(R - B @ coef, axis=0)


# --------------------------------------------------------------------------- the naive models


def _mahalanobis_sq(A: np.ndarray, B: np.ndarray, theta_inv: np.ndarray) -> np.ndarray:
    """``(a − b)ᵀ θ^{-1} (a − b)`` for all pairs, by an (m, N, n) broadcast (no BLAS trick)."""
    out = np.empty((A.shape[0], B.shape[0]))
    for rows in row_chunks(A.shape[0], 64):  # bound the (64, N, n) temporary
        diff = A[rows, None, :] - B[None, :, :]
        out[rows] = np.einsum("abi,ij,abj->ab", diff, theta_inv, diff, optimize=True)
    return out


class NaiveKAHM:
    """``A_{Y,n}`` of Definition 1 with an explicit inverse and explicit O(m·N²) weights."""

    def __init__(self, n_components: int = 20, min_range: float | None = 1e-3, lambda_rtol: float = 1e-13):
        self.n_components = n_components
        self.min_range = min_range
        self.lambda_rtol = lambda_rtol

    def fit(self, Y: np.ndarray) -> NaiveKAHM:
        Y = np.asarray(Y, dtype=np.float64)
        N, p = Y.shape
        self.Y_ = Y
        self.mean_ = Y.mean(axis=0)
        Yc = Y - self.mean_
        cov = Yc.T @ Yc / (N - 1)  # Σ_Y (p × p)
        w, V = np.linalg.eigh(cov)
        w, V = w[::-1], V[:, ::-1]
        n_valid = int(np.count_nonzero(w > np.finfo(np.float64).eps * max(1.0, w[0])))
        n = min(self.n_components, N - 1, p, n_valid)
        if self.min_range and n > 0:
            codes = Yc @ V[:, :n]
            small = np.flatnonzero(np.ptp(codes, axis=0) < self.min_range)
            if small.size:
                n = max(int(small[0]), 1)
        self.n_ = n
        self.P_ = V[:, :n].T  # (n, p)
        X = Y @ self.P_.T  # codes x = P y (not centred)
        theta = self.P_ @ cov @ self.P_.T  # eq. (36)
        self.theta_inv_ = np.linalg.inv(theta) if n else np.zeros((0, 0))
        self.codes_ = X
        width = 2.0 * n if n else 1.0
        K = np.exp(-_mahalanobis_sq(X, X, self.theta_inv_) / width)
        self.lambda_ = self._solve_lambda(K, Y)
        self.G_ = np.linalg.inv(K + self.lambda_ * np.eye(N))  # (K + λI)^{-1}, explicit
        self._width = width
        return self

    def _solve_lambda(self, K: np.ndarray, Y: np.ndarray) -> float:
        """Fixed point e = R(e, 2s) of eq. (21), with ``inv(K + λI)`` on every iteration."""
        N, p = Y.shape
        s = float(np.sum(Y * Y)) / (p * N)
        if s == 0.0:
            return 1.0
        tau, e = 2.0 * s, 0.5 * s
        for _ in range(1000):
            G = np.linalg.inv(K + (e + tau) * np.eye(N))
            F = K @ (G @ Y)
            e_new = float(np.sum((Y - F) ** 2)) / (p * N)
            if abs(e_new - e) <= self.lambda_rtol * s:
                return e_new + tau
            e = e_new
        return e + tau

    def images(self, Yq: np.ndarray) -> np.ndarray:
        """``A(y) = Σ_i w_i y^i`` with ``w = K_q G / (K_q G 1)`` (eqs. 31–33)."""
        Xq = Yq @ self.P_.T
        D2 = _mahalanobis_sq(Xq, self.codes_, self.theta_inv_)
        # row shift (docs/algorithm.md#batched-evaluation)
        Kq = np.exp(-(D2 - D2.min(axis=1, keepdims=True)) / self._width)
        W = Kq @ self.G_  # (m, N): the explicit O(m·N²) weights h^i
        W /= W.sum(axis=1, keepdims=True)
        return W @ self.Y_


class NaiveDeepKAHM:
    """Definition 3: L naive KAHMs of the same data, nested, nearest layer output."""

    def __init__(self, n_components: int = 20, n_layers: int = 5, min_range: float | None = 1e-3):
        self.n_components, self.n_layers, self.min_range = n_components, n_layers, min_range

    def fit(self, Y: np.ndarray) -> NaiveDeepKAHM:
        self.layers_ = [
            NaiveKAHM(n_l, self.min_range).fit(Y) for n_l in layer_dimensions(self.n_components, self.n_layers)
        ]
        return self

    def images_and_distances(self, Yq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        best_g = np.full(Yq.shape[0], np.inf)
        best = np.full_like(Yq, np.nan)
        x = Yq
        for layer in self.layers_:
            x = layer.images(x)
            g = np.sqrt(np.sum((Yq - x) ** 2, axis=1))
            better = g < best_g
            best_g[better], best[better] = g[better], x[better]
        return best, best_g


class NaiveWideKAHM:
    """Definition 5 over a given partition (the project's k-means labels)."""

    def __init__(self, n_components: int = 20, n_layers: int = 5, min_range: float | None = 1e-3):
        self.n_components, self.n_layers, self.min_range = n_components, n_layers, min_range

    def fit(self, Y: np.ndarray, labels: np.ndarray) -> NaiveWideKAHM:
        self.branches_ = [
            NaiveDeepKAHM(self.n_components, self.n_layers, self.min_range).fit(Y[labels == s])
            for s in np.unique(labels)
        ]
        return self

    def distances(self, Yq: np.ndarray) -> np.ndarray:
        return np.min([b.images_and_distances(Yq)[1] for b in self.branches_], axis=0)


class NaiveKAHMClassifier:
    """Definition 7 with naive class models; branches from the project's k-means (same seeds)."""

    def __init__(self, n_components: int = 20, n_layers: int = 5, block_size: int = 1000, random_state=None,
                 chunk_size: int = 1000, n_init: int = 1):
        self.n_components, self.n_layers, self.block_size = n_components, n_layers, block_size
        self.random_state, self.chunk_size, self.n_init = random_state, chunk_size, n_init

    def fit(self, X: np.ndarray, y: np.ndarray) -> NaiveKAHMClassifier:
        X = np.asarray(X, dtype=np.float64)
        self.classes_, y_idx = np.unique(y, return_inverse=True)
        root = as_seed_sequence(self.random_state)
        self.models_ = []
        for c in range(len(self.classes_)):
            Yc = X[y_idx == c]
            wide = WideKAHM(self.n_components, self.n_layers, self.block_size,
                            random_state=child_seed_sequence(root, PARTITION_STREAM, c), n_init=self.n_init)
            labels = wide.partition(Yc)  # the project's partition: same branches as KAHMClassifier
            self.models_.append(NaiveWideKAHM(self.n_components, self.n_layers).fit(Yc, labels))
        return self

    def class_distances(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        out = np.empty((X.shape[0], len(self.models_)))
        for rows in row_chunks(X.shape[0], self.chunk_size):
            for c, model in enumerate(self.models_):
                out[rows, c] = model.distances(X[rows])
        return out

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.classes_[np.argmin(self.class_distances(X), axis=1)]

    def model_bytes(self) -> int:
        """Stored arrays: per layer Y (N×p), G (N×N), P (n×p), codes (N×n)."""
        return sum(
            layer.Y_.nbytes + layer.G_.nbytes + layer.P_.nbytes + layer.codes_.nbytes + layer.theta_inv_.nbytes
            for wide in self.models_ for branch in wide.branches_ for layer in branch.layers_
        )


def naive_flops(m: int, N: int, n: int, p: int) -> float:
    """Dense flops of one naive layer evaluation on m queries: weights K_q G (2mN²), A = W Y (2mNp),
    codes (2mpn) and the Mahalanobis distances (about 2mNn² + 3mNn by the broadcast)."""
    return 2.0 * m * N * N + 2.0 * m * N * p + 2.0 * m * p * n + m * N * (2.0 * n * n + 3.0 * n)
