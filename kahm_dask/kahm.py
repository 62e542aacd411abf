"""The Kernel Affine Hull Machine ``A_{Y,n}`` and its distance function.

See docs/algorithm.md#kahm and docs/algorithm.md#distance.

``A_{Y,n}(y) = Σ_i h^i(Py) / Σ_k h^k(Py) · y^i`` (Definition 1, eq. 33) maps every point onto
the affine hull of the samples; ``Γ(y) = ‖y − A_{Y,n}(y)‖`` (Definition 2, eq. 48) says how far
``y`` is from them. Training costs one thin SVD, one N×N kernel matrix and one ``eigh``
(reused for λ* and the solve); a batch of m queries costs O(m·N·(n + p))
(docs/algorithm.md#batched-evaluation).
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.linalg import eigh, svd
from sklearn.base import BaseEstimator, TransformerMixin, _fit_context
from sklearn.utils.validation import check_is_fitted

from kahm_dask._batching import row_chunks
from kahm_dask._validation import (
    as_data_matrix,
    check_n_features,
    weights_dtype,
)
from kahm_dask.float32_bound import distance_bound, image_bound, nonnegative_sum_upper, row_norms_upper
from kahm_dask.kernel import gaussian_kernel_matrix, kernel_scale
from kahm_dask.params import check_params, parameter_constraints
from kahm_dask.regularization import solve_lambda_spectral

__all__ = [
    "KAHM",
    "DegenerateWeightsWarning",
    "PrincipalSubspace",
    "principal_subspace",
    "DENOMINATOR_RTOL",
    "eval_dtype",
]

#: Denominator guard (docs/algorithm.md#denominator-guard): a query whose weight sum |Σ h^i| is
#: below this times max_i |B_{i,p}| gets Γ = +∞.
DENOMINATOR_RTOL = 1e-12

#: Rows evaluated together inside the query loops (docs/performance.md): small enough that the
#: (rows × N) kernel block and the (rows × p) images stay in the per-core L2/L3, large enough
#: that OpenBLAS amortises packing the (N × (p + 1)) weights of every GEMM. Callers' chunk_size
#: still bounds memory; this only subdivides their chunks.
EVAL_BLOCK_ROWS = 512

_workspace = threading.local()


def _buffer(key: str, shape: tuple[int, ...], dtype: np.dtype | type = np.float64) -> np.ndarray:
    """A reusable per-thread scratch array of ``shape`` and ``dtype`` (contents undefined).

    Evaluation writes its temporaries (kernel block, GEMM output, images) into these instead
    of allocating fresh arrays for every (block, branch, layer): the buffers stay hot in cache
    and never page-fault again. One buffer per (``key``, ``dtype``), at most ``EVAL_BLOCK_ROWS``
    rows each, so a few tens of MiB per thread. Never returned to callers.
    """
    cache = getattr(_workspace, "buffers", None)
    if cache is None:
        cache = _workspace.buffers = {}
    dtype = np.dtype(dtype)
    size = int(np.prod(shape))
    buf = cache.get((key, dtype))
    if buf is None or buf.size < size:
        buf = cache[key, dtype] = np.empty(size, dtype=dtype)
    return buf[:size].reshape(shape)


def eval_dtype(value: str, caller: str) -> np.dtype:
    """The NumPy dtype of the kernel blocks of distances under the ``eval_dtype`` parameter
    ``value`` (docs/algorithm.md#evaluation-precision): float64 for "auto" (whose float32 is the
    certified prediction of a classifier, docs/algorithm.md#certified-prediction) and "float64",
    float32 for "float32"; scikit-learn's ``InvalidParameterError`` naming the parameter and
    ``caller`` for any other value."""
    check_params({"eval_dtype": value}, caller)
    return np.dtype(np.float32 if value == "float32" else np.float64)


def _row_sq_norms(A: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", A, A)


class DegenerateWeightsWarning(RuntimeWarning):
    """Some queries had a near-zero KAHM weight sum; their distance is +∞.

    See docs/algorithm.md#denominator-guard.
    """


@dataclass(frozen=True)
class PrincipalSubspace:
    """Top principal directions of a data matrix after the caps of
    docs/algorithm.md#kahm-guards.

    mean : (p,) sample mean ȳ
    directions : (k, p) unit eigenvectors of Σ_Y as rows, by decreasing eigenvalue
    variances : (k,) the matching eigenvalues σ_1 ≥ … ≥ σ_k (> 0)
    n_cap : k, the largest subspace dimension these data support (0 for rank-0 data)
    """

    mean: np.ndarray
    directions: np.ndarray
    variances: np.ndarray

    @property
    def n_cap(self) -> int:
        return int(self.variances.shape[0])


def principal_subspace(Y: np.ndarray, n_max: int, min_range: float | None = 1e-3) -> PrincipalSubspace:
    """Thin-SVD PCA of ``Y`` (N, p) capped as in docs/algorithm.md#kahm-guards.

    The dimension is ``min(n_max, N − 1, p, #{σ_k > ε_mach·max(1, σ_1)})``, then lowered to
    ``j − 1`` where ``j`` is the first code coordinate whose range over the samples is below
    ``min_range`` (floor 1 while σ_1 passes the cap). Rank-0 data get 0 directions. The decisions:
    docs/decisions.md#decision-dimension-caps, docs/decisions.md#decision-eigenvalue-cap,
    docs/decisions.md#decision-rank-floor and docs/decisions.md#decision-rank-zero.
    """
    N, p = Y.shape
    mean = Y.mean(axis=0)
    empty = PrincipalSubspace(mean, np.zeros((0, p)), np.zeros(0))
    if N < 2 or n_max < 1:
        return empty
    Yc = Y - mean
    fast = _top_principal_directions(Yc, min(n_max, N - 1, p), min_range)
    if fast is not None:
        return PrincipalSubspace(mean, *fast)
    U, S, Vt = svd(Yc, full_matrices=False, check_finite=False)
    sigma = S * S / (N - 1)
    n_valid = int(np.count_nonzero(sigma > np.finfo(np.float64).eps * max(1.0, sigma[0])))
    n = min(n_max, N - 1, p, n_valid)
    if n == 0:
        return empty
    if min_range:
        codes = U[:, :n] * S[:n]  # = (Y − ȳ) Vᵀ; ranges are translation invariant
        small = np.flatnonzero(np.ptp(codes, axis=0) < min_range)
        if small.size:
            n = max(int(small[0]), 1)
    return PrincipalSubspace(mean, Vt[:n].copy(), sigma[:n].copy())


#: The fast PCA path defers to the thin SVD when a cap decision (docs/algorithm.md#kahm-guards) is
#: this close to its threshold (docs/decisions.md#decision-pca-path).
_PCA_MARGIN = 1e6


def _top_principal_directions(
    Yc: np.ndarray, k: int, min_range: float | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """Top-``k`` principal directions of centred ``Yc`` (N, p) from ``eigh`` of the smaller
    of the two Gram matrices, ``YcᵀYc`` (p × p) or ``Yc Ycᵀ`` (N × N), computing only the top
    ``k`` eigenpairs (``subset_by_index``). Returns ``(directions (n, p), variances (n,))``
    after the caps, or ``None`` when a cap decision is within a wide margin of its
    threshold (rank-deficient data, a code range ≈ ``min_range``): there the caller's thin
    SVD decides (docs/decisions.md#decision-pca-path).

    Same subspace as the thin SVD up to rounding (docs/performance.md: 5× cheaper for an
    MNIST cluster of 1000 × 784, which spends 0.64 s in the SVD).
    """
    N, p = Yc.shape
    if k < 1:
        return None
    if p <= N:
        G = Yc.T @ Yc
        w, V = eigh(G, subset_by_index=[p - k, p - 1], overwrite_a=True, check_finite=False)
        w, V = w[::-1], V[:, ::-1]
    else:
        G = Yc @ Yc.T
        w, U = eigh(G, subset_by_index=[N - k, N - 1], overwrite_a=True, check_finite=False)
        w, U = w[::-1], U[:, ::-1]
        if not w[-1] > 0:
            return None
        V = Yc.T @ (U / np.sqrt(w))
        V /= np.linalg.norm(V, axis=0)
    sigma = w / (Yc.shape[0] - 1)
    threshold = np.finfo(np.float64).eps * max(1.0, sigma[0])
    if not sigma[-1] > _PCA_MARGIN * threshold:
        return None  # near the rank cap: let the SVD count the valid directions
    n = k
    if min_range:
        ranges = np.ptp(Yc @ V, axis=0)
        if np.any(np.abs(ranges - min_range) <= 1e-6 * min_range):
            return None
        small = np.flatnonzero(ranges < min_range)
        if small.size:
            n = max(int(small[0]), 1)
    return np.ascontiguousarray(V[:, :n].T), sigma[:n].copy()


class KAHM(TransformerMixin, BaseEstimator):
    """Kernel Affine Hull Machine ``A_{Y,n}`` (the paper's Definition 1; docs/algorithm.md#kahm).

    Parameters
    ----------
    n_components : int, default=20
        Subspace dimension n, capped by the data as in docs/algorithm.md#kahm-guards (see
        ``n_components_``).
    min_range : float or None, default=1e-3
        Lower n while an encoded coordinate's range is below this (absolute,
        docs/algorithm.md#kahm-guards).
        ``None`` or 0 disables the rule.
    chunk_size : int, default=1000
        Queries evaluated per block; memory per block is O(chunk_size · N).
    regularization : float or None, default=None
        ``None`` uses λ* of Theorem 1 (the method). A positive float forces λ; meant for
        tests and ablations only.
    lambda_rtol, lambda_atol, lambda_max_iter :
        Stopping rule of the λ* fixed point (docs/algorithm.md#lambda-star,
        docs/decisions.md#decision-lambda-stopping): stop when the change of e is at most
        ``lambda_rtol·s`` or, if ``lambda_atol`` is set, when the change of λ is at most
        ``lambda_atol`` (the author's rule).
    eval_dtype : {"auto", "float64", "float32"}, default="auto"
        Precision of the kernel block and its GEMM when queries are evaluated
        (docs/algorithm.md#evaluation-precision). "auto" and "float64": float64 (a classifier's
        "auto" predicts in float32 with a proof, docs/algorithm.md#certified-prediction).
        "float32" runs the (m × N)·(N × (p + 1)) GEMM in float32 (~2.5× faster,
        docs/performance.md), with distances within ~1e-5 relative of float64 and a proven bound
        (docs/algorithm.md#float32-error-bound); queries, images and distances stay float64.
        May be changed after ``fit``.

    Attributes
    ----------
    components_ : (n, p) encoding matrix P (top-n principal directions as rows)
    explained_variance_ : (n,) θ = diag(σ_1..σ_n), eq. (36)
    n_components_ : int, effective n after the caps
    mean_ : (p,) sample mean (codes are centred; the kernel only sees differences)
    lambda_ : float, λ* (or the forced value); e_hat_ : ê; n_iter_ : fixed-point iterations
    kernel_eigenvalues_ : (N,) eigenvalues μ of K_{YPᵀ}, clipped at 0
    codes_ : (N, n) whitened training codes z = θ^{-1/2} P (y − ȳ)
    beta_ : (N, p + 1) ``(K + λI)^{-1} [Y | 1]``, numerator and denominator weights
        (docs/algorithm.md#batched-evaluation); float64, holding float32 values when fitted on
        float32 rows (docs/algorithm.md#weights-precision)
    training_error_ : float, r = Σ_i ‖y^i − A(y^i)‖ (eq. 101) on the training rows
    n_samples_fit_, n_features_in_ : int

    Examples
    --------
    Fit to N = 100 samples of p = 5 features; queries give images (m, p) on the samples'
    affine hull and distances Γ (m,) (eq. 48):

    >>> import numpy as np
    >>> from kahm_dask import KAHM
    >>> rng = np.random.default_rng(0)
    >>> Y = rng.normal(size=(100, 5))
    >>> kahm = KAHM(n_components=3).fit(Y)
    >>> kahm.n_components_, kahm.components_.shape, kahm.beta_.shape
    (3, (3, 5), (100, 6))
    >>> Q = rng.normal(size=(4, 5))
    >>> images, gamma = kahm.transform_with_distance(Q)
    >>> images.shape, gamma.shape
    ((4, 5), (4,))
    >>> bool(np.allclose(gamma, np.linalg.norm(Q - images, axis=1)))
    True
    >>> bool(np.isclose(kahm.training_error_, kahm.distance(Y).sum()))  # r of eq. 101
    True
    >>> bool(np.all(kahm.distance(Q + 50.0) > kahm.distance(Q)))  # far from the samples
    True
    """

    _parameter_constraints: dict = parameter_constraints(
        "n_components", "min_range", "chunk_size", "regularization", "lambda_rtol", "lambda_atol", "lambda_max_iter",
        "eval_dtype",
    )

    def __init__(
        self,
        n_components: int = 20,
        *,
        min_range: float | None = 1e-3,
        chunk_size: int = 1000,
        regularization: float | None = None,
        lambda_rtol: float = 1e-10,
        lambda_atol: float | None = None,
        lambda_max_iter: int = 1000,
        eval_dtype: str = "auto",
    ) -> None:
        self.n_components = n_components
        self.min_range = min_range
        self.chunk_size = chunk_size
        self.regularization = regularization
        self.lambda_rtol = lambda_rtol
        self.lambda_atol = lambda_atol
        self.lambda_max_iter = lambda_max_iter
        self.eval_dtype = eval_dtype

    # ------------------------------------------------------------------ fitting
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, Y, y=None) -> KAHM:
        """Fit the KAHM to the samples ``Y`` (N, p), one sample per row."""
        self._fit(Y)
        return self

    @_fit_context(prefer_skip_nested_validation=True)
    def fit_transform(self, Y, y=None, **fit_params) -> np.ndarray:
        """Fit and return the images of the training rows, (N, p).

        Uses ``A(Y) = diag(H1)^{-1} H Y`` with ``H = K(K + λI)^{-1}`` from the
        eigendecomposition already computed (docs/algorithm.md#training-images).
        """
        return self._fit(Y, training_images=True)

    def _fit(self, Y, training_images: bool = False) -> np.ndarray | None:
        dtype = weights_dtype(Y)
        Y = as_data_matrix(Y, "Y")
        subspace = principal_subspace(Y, self.n_components, self.min_range)
        return self._fit_subspace(Y, subspace, self.n_components, training_images, dtype)

    def _fit_subspace(
        self,
        Y: np.ndarray,
        subspace: PrincipalSubspace,
        n: int,
        training_images: bool = False,
        beta_dtype: np.dtype | type = np.float64,
    ) -> np.ndarray | None:
        """Fit on validated ``Y`` with a precomputed PCA; ``n`` is capped by ``subspace``.

        Shared by the layers of a deep KAHM, which all model the same ``Y``
        (docs/algorithm.md#deep-kahm). ``beta_dtype`` float32 (float32 training rows,
        :func:`~kahm_dask._validation.weights_dtype`) rounds β to float32 once, before anything
        is computed from it: the model is then the same whether it stays in memory or is
        stored at the data's size and loaded (docs/algorithm.md#weights-precision).
        """
        N, p = Y.shape
        n = min(n, subspace.n_cap)
        P = subspace.directions[:n]
        sigma = subspace.variances[:n]
        whitening = P.T / np.sqrt(sigma)  # (p, n)
        Z = (Y - subspace.mean) @ whitening
        K = gaussian_kernel_matrix(Z, n)
        # divide and conquer (LAPACK syevd): all eigenpairs, ~25% faster than MRRR here. NumPy's
        # eigh releases the GIL (SciPy's holds it), so n_jobs threads fit KAHMs in parallel.
        mu, U = np.linalg.eigh(K)
        del K
        np.maximum(mu, 0.0, out=mu)
        Y1 = np.empty((N, p + 1))
        Y1[:, :p] = Y
        Y1[:, p] = 1.0
        C = U.T @ Y1  # (N, p + 1)
        del Y1  # rebuilt block by block below: the fit holds at most Y, C, U and β at once
        s = float(np.einsum("ij,ij->", Y, Y)) / (p * N)
        if self.regularization is not None:
            lam, e_hat, n_iter = float(self.regularization), float("nan"), 0
        elif s == 0.0:
            # All-zero data are rank 0: A(y) = ȳ = 0 for every λ > 0
            # (docs/decisions.md#decision-all-zero-data).
            lam, e_hat, n_iter = 1.0, 0.0, 0
        else:
            c2 = np.einsum("ij,ij->i", C[:, :p], C[:, :p])
            sol = solve_lambda_spectral(
                mu,
                c2,
                s,
                p * N,
                rtol=self.lambda_rtol,
                lambda_atol=self.lambda_atol,
                max_iter=self.lambda_max_iter,
            )
            lam, e_hat, n_iter = sol.lambda_star, sol.e_hat, sol.n_iter

        self.mean_ = subspace.mean
        self.components_ = P
        self.explained_variance_ = sigma
        self.n_components_ = int(n)
        self.codes_ = Z
        self.lambda_ = lam
        self.e_hat_ = e_hat
        self.n_iter_ = n_iter
        self.kernel_eigenvalues_ = mu
        C /= (mu + lam)[:, None]  # in place: C is not needed afterwards
        self.beta_ = U @ C
        del C, U
        if np.dtype(beta_dtype) == np.float32:  # held in float64, exactly float32 values
            self.beta_[...] = self.beta_.astype(np.float32)
        self.n_samples_fit_ = N
        self.n_features_in_ = p
        self._set_derived()

        # K (K + λI)^{-1} [Y | 1] = [Y | 1] − λ (K + λI)^{-1} [Y | 1]: one pass instead of a
        # third N × N × (p + 1) GEMM (agrees with U diag(μ/(μ+λ)) C to ~1e-14, performance.md),
        # in row blocks so that the temporaries stay O(block · p).
        images = np.empty_like(Y) if training_images else None
        gamma = np.empty(N)
        for rows in row_chunks(N, EVAL_BLOCK_ROWS):
            HY = np.empty((rows.stop - rows.start, p + 1))
            HY[:, :p] = Y[rows]
            HY[:, p] = 1.0
            HY -= lam * self.beta_[rows]
            block_images, bad = self._ratio(HY)
            block_gamma = np.linalg.norm(Y[rows] - block_images, axis=1)
            block_gamma[bad] = np.inf
            gamma[rows] = block_gamma
            if images is not None:
                images[rows] = block_images
        self.training_error_ = float(gamma.sum())
        return images

    def _set_derived(self) -> None:
        """Quantities computed deterministically from the stored state."""
        self.whitening_ = self.components_.T / np.sqrt(self.explained_variance_)
        self.codes_sq_norms_ = np.einsum("ij,ij->i", self.codes_, self.codes_)
        self._den_threshold = DENOMINATOR_RTOL * float(np.max(np.abs(self.beta_[:, -1])))
        self._set_fused_operands()

    def _set_fused_operands(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Operands of the fused query kernel; also rebuilds them for models pickled before
        they existed. Returns ``(query_map (p, n + 1), query_offset (n + 1,), codes_aug
        (n + 1, N))``."""
        # Query-side operands of the fused kernel (see _images_into). With c = 1/(2n):
        #   [y W·2c − ȳ W·2c, 1] · [z, −c‖z‖²]ᵀ = −c‖zq − z‖² + c‖zq‖²,
        # and the last term is constant along the row, so it cancels in the row shift
        # (docs/algorithm.md#batched-evaluation).
        # The affine map y ↦ [(y − ȳ) W·2c, 1] is one GEMM plus a broadcast row (no pass
        # over the m × p queries to centre them).
        n, p = self.n_components_, self.components_.shape[1]
        c = kernel_scale(n)
        query_map = np.zeros((p, n + 1))
        query_map[:, :n] = self.whitening_ * (2.0 * c)
        query_offset = -(self.mean_ @ query_map)
        query_offset[n] = 1.0
        self._query_map, self._query_offset = query_map, query_offset
        codes_aug = np.empty((n + 1, self.codes_.shape[0]))
        codes_aug[:n] = self.codes_.T
        codes_aug[n] = -c * self.codes_sq_norms_
        self._codes_aug = codes_aug
        return query_map, query_offset, codes_aug

    def _beta32(self) -> tuple[np.ndarray, np.ndarray, float]:
        """``beta_`` (N, p + 1) rounded to float32, the operand of the float32 GEMM
        (docs/algorithm.md#evaluation-precision), and what the float32 error bound takes from it
        (docs/algorithm.md#float32-error-bound): the (N, 2) upper bounds of
        :func:`~kahm_dask.float32_bound.row_norms_upper` and max |β̂|.

        Made on first use and kept on the instance with the ``beta_`` they were made from (a new
        ``beta_``, e.g. a refit, makes them again); not part of :meth:`to_state` and never pickled.
        One tuple assignment, so threads sharing a model at worst make them twice.
        """
        cached = self.__dict__.get("_beta32_cache")
        if cached is None or cached[0] is not self.beta_:
            beta32 = self.beta_.astype(np.float32)
            cached = self._beta32_cache = (self.beta_, beta32, row_norms_upper(beta32), float(np.max(np.abs(beta32))))
        return cached[1:]

    def __getstate__(self) -> dict:
        state = dict(super().__getstate__())  # a copy: object.__getstate__ returns __dict__ itself
        state.pop("_beta32_cache", None)  # derived, rebuilt on first float32 use
        return state

    # ------------------------------------------------------------ serialisation
    _STATE_ARRAYS = ("mean_", "components_", "explained_variance_", "codes_", "beta_", "kernel_eigenvalues_")
    _STATE_SCALARS = (
        "n_components_", "lambda_", "e_hat_", "n_iter_", "n_samples_fit_", "n_features_in_", "training_error_"
    )

    def to_state(self) -> tuple[dict[str, np.ndarray], dict[str, float | int]]:
        """The fitted state as arrays and scalars, for storage (no I/O here).

        Arrays: mean (p,), components (n, p), explained_variance (n,), codes (N, n),
        beta (N, p + 1), kernel_eigenvalues (N,); all float64 but beta, which is float32 when
        its values are (a fit on float32 rows, docs/algorithm.md#weights-precision): the store
        then holds the model at about the data's size, and loading gives back the same values.
        Everything else is derived on load.
        """
        check_is_fitted(self, "beta_")
        arrays = {k.rstrip("_"): getattr(self, k) for k in self._STATE_ARRAYS}
        beta32 = self.beta_.astype(np.float32)
        if np.array_equal(beta32, self.beta_):  # exactly representable: nothing is lost
            arrays["beta"] = beta32
        scalars = {k.rstrip("_"): getattr(self, k) for k in self._STATE_SCALARS}
        scalars = {k: (int(v) if isinstance(v, (int, np.integer)) else float(v)) for k, v in scalars.items()}
        return arrays, {**scalars, "params": self.get_params()}

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], scalars: dict) -> KAHM:
        """Rebuild a fitted KAHM from :meth:`to_state` output; evaluates bit-identically."""
        scalars = dict(scalars)
        model = cls(**scalars.pop("params"))
        for k in cls._STATE_ARRAYS:
            setattr(model, k, np.ascontiguousarray(arrays[k.rstrip("_")], dtype=np.float64))
        for k in cls._STATE_SCALARS:
            setattr(model, k, scalars[k.rstrip("_")])
        model._set_derived()
        return model

    # --------------------------------------------------------------- evaluation
    def _ratio(self, O: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Images ``O[:, :p] / O[:, p]`` (eq. 33) and the mask of guarded rows
        (docs/algorithm.md#denominator-guard)."""
        den = O[:, -1]
        bad = ~(np.abs(den) >= self._den_threshold)  # also catches NaN
        with np.errstate(divide="ignore", invalid="ignore"):
            images = O[:, :-1] / den[:, None]
        images[bad] = np.nan
        return images, bad

    def _images_into(self, x: np.ndarray, out: np.ndarray, dtype: np.dtype | type = np.float64,
                     bound: np.ndarray | None = None) -> np.ndarray:
        """Images of the rows of ``x`` (m, p) written into ``out`` (m, p), both float64; returns
        the guard mask (m,). With ``bound`` (m,), also writes there a proven bound on how far each
        row's image lies from the float64 evaluation's (docs/algorithm.md#float32-error-bound:
        0 in float64, which is that evaluation; +inf for a row either evaluation may guard).

        The fused batch formula of docs/algorithm.md#batched-evaluation, two GEMMs and three
        passes over the (m, N) block:
        ``E = [Zq/n, 1]·[Z, −‖z‖²/(2n)]ᵀ`` (= −D²/(2n) up to a row constant; ``Zq/n`` from
        one GEMM with the mean folded into an offset row), ``E −= rowmax E``,
        ``Kq = exp(E)`` in place (each row's largest entry is exactly 1), ``O = Kq·B``,
        ``out = O[:, :p] / O[:, p]``. Rows with a degenerate weight sum (or non-finite input)
        get NaN. Temporaries live in per-thread buffers; keep ``m`` ≤ EVAL_BLOCK_ROWS.

        ``dtype`` float32 (docs/algorithm.md#evaluation-precision): ``Zq``, ``E − rowmax E`` and
        ``Kq = exp(E)`` are the float64 evaluation's, value for value (E's entries carry the row
        constant ‖zq‖²/(2n) until the shift, so in float32 its rounding would be an error in every
        exponent; their GEMM, m·(n + 1)·N, is ~3% of the big one). Kq is then rounded to float32
        and ``O = Kq·B`` runs in float32 (B from :meth:`_beta32`), and the quotient is taken in
        float64 from the float32 O. The guard is the same test on the float32 denominator.
        """
        m, p = x.shape
        try:
            query_map, query_offset, codes_aug = self._query_map, self._query_offset, self._codes_aug
        except AttributeError:
            query_map, query_offset, codes_aug = self._set_fused_operands()
        zq = np.matmul(x, query_map, out=_buffer("zq", (m, query_map.shape[1])))
        zq += query_offset
        E = np.matmul(zq, codes_aug, out=_buffer("E", (m, codes_aug.shape[1])))
        np.subtract(E, E.max(axis=1, keepdims=True), out=E)
        np.exp(E, out=E)
        single = np.dtype(dtype) == np.float32
        if single:
            Kq = _buffer("Kq", E.shape, np.float32)
            Kq[...] = E  # rounded once: the bound's k̂ = fl32(k)
            beta32, norms32, beta_max = self._beta32()
            O = np.matmul(Kq, beta32, out=_buffer("O", (m, p + 1), np.float32))
        else:
            O = np.matmul(E, self.beta_, out=_buffer("O", (m, p + 1)))
        den = O[:, p].astype(np.float64, copy=False)  # float32: the quotient is formed in float64
        bad = ~(np.abs(den) >= self._den_threshold)  # also catches NaN
        with np.errstate(divide="ignore", invalid="ignore"):
            np.divide(O[:, :p], den[:, None], out=out)
        if bad.any():
            out[bad] = np.nan
        if bound is not None:
            if single:
                bound[...] = image_bound(
                    nonnegative_sum_upper(Kq @ norms32, Kq.shape[1]), den, np.sqrt(_row_sq_norms(out)),
                    n_rows=Kq.shape[1], n_features=p, beta_max=beta_max,
                    threshold=self._den_threshold)
            else:
                bound[...] = np.where(bad, np.inf, 0.0)
        return bad

    def _distances_with_bound(self, Yq: np.ndarray, dtype: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Distances Γ (m,) of validated queries ``Yq`` (m, p) in ``dtype`` (None: ``eval_dtype``)
        and a proven bound (m,) on |Γ − Γ₆₄| against the float64 evaluation
        (docs/algorithm.md#float32-error-bound; +inf for a guarded row)."""
        kernel_dtype = eval_dtype(self.eval_dtype if dtype is None else dtype, type(self).__name__)
        m, p = Yq.shape
        gamma, bound = np.empty(m), np.empty(m)
        for rows in row_chunks(m, min(self.chunk_size, EVAL_BLOCK_ROWS)):
            img = _buffer("bound-images", (rows.stop - rows.start, p))
            bad = self._images_into(Yq[rows], img, kernel_dtype, bound=bound[rows])
            diff = np.subtract(Yq[rows], img, out=_buffer("diff", img.shape))
            gamma[rows] = np.sqrt(_row_sq_norms(diff))
            gamma[rows][bad] = np.inf
        return gamma, distance_bound(bound, gamma, p)

    def _warn_degenerate(self, bad: np.ndarray, x: np.ndarray, stacklevel: int = 3) -> None:
        """Warn about rows newly guarded here (rows whose input was already NaN do not count)."""
        if bad.any():
            new = int(np.count_nonzero(bad & np.isfinite(x).all(axis=1)))
            if new:
                warnings.warn(
                    f"{new} query row(s) had a near-zero KAHM weight sum; their distance "
                    "is set to +inf (docs/algorithm.md#denominator-guard).",
                    DegenerateWeightsWarning,
                    stacklevel=stacklevel + 1,
                )

    def _images(self, Yq: np.ndarray, dtype: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Images (m, p) of validated query rows ``Yq`` (m, p) and their guard mask (m,); float64
        whatever ``dtype``, the precision of the kernel block (None: ``eval_dtype``).

        Rows whose weight sum is degenerate, or whose input is not finite, get NaN images.
        """
        kernel_dtype = eval_dtype(self.eval_dtype if dtype is None else dtype, type(self).__name__)
        m = Yq.shape[0]
        images = np.empty_like(Yq)
        bad = np.empty(m, dtype=bool)
        for rows in row_chunks(m, EVAL_BLOCK_ROWS):
            bad[rows] = self._images_into(Yq[rows], images[rows], kernel_dtype)
        self._warn_degenerate(bad, Yq)
        return images, bad

    def _evaluate(self, Yq: np.ndarray, dtype: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Images (m, p) and distances Γ (m,) of validated queries ``Yq`` (m, p), in row chunks;
        float64 whatever ``dtype``, the precision of the kernel block (None: ``eval_dtype``)."""
        kernel_dtype = eval_dtype(self.eval_dtype if dtype is None else dtype, type(self).__name__)
        m = Yq.shape[0]
        images = np.empty_like(Yq)
        gamma = np.empty(m)
        bad = np.empty(m, dtype=bool)
        for rows in row_chunks(m, min(self.chunk_size, EVAL_BLOCK_ROWS)):
            img = images[rows]
            bad[rows] = self._images_into(Yq[rows], img, kernel_dtype)
            diff = np.subtract(Yq[rows], img, out=_buffer("diff", img.shape))
            gamma[rows] = np.sqrt(_row_sq_norms(diff))
        gamma[bad] = np.inf
        self._warn_degenerate(bad, Yq)
        return images, gamma

    def _validate_queries(self, Yq) -> np.ndarray:
        check_is_fitted(self, "beta_")
        Yq = as_data_matrix(Yq, "Yq")
        check_n_features(Yq.shape[1], self.n_features_in_, type(self).__name__)
        return Yq

    def transform(self, Yq) -> np.ndarray:
        """Images ``A_{Y,n}(y)`` of the query rows ``Yq`` (m, p) → (m, p) (eq. 33)."""
        return self._evaluate(self._validate_queries(Yq))[0]

    def distance(self, Yq) -> np.ndarray:
        """Distances ``Γ(y) = ‖y − A_{Y,n}(y)‖`` (eq. 48) of the rows of ``Yq`` → (m,)."""
        return self._evaluate(self._validate_queries(Yq))[1]

    def transform_with_distance(self, Yq) -> tuple[np.ndarray, np.ndarray]:
        """Images (m, p) and distances (m,) in one pass."""
        return self._evaluate(self._validate_queries(Yq))
