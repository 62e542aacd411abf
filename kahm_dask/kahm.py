"""The Kernel Affine Hull Machine ``A_{Y,n}`` and its distance function (ALGORITHM.md §3–4).

``A_{Y,n}(y) = Σ_i h^i(Py) / Σ_k h^k(Py) · y^i`` (Definition 1, eq. 33) maps every point onto
the affine hull of the samples; ``Γ(y) = ‖y − A_{Y,n}(y)‖`` (Definition 2, eq. 48) says how far
``y`` is from them. Training costs one thin SVD, one N×N kernel matrix and one ``eigh``
(reused for λ* and the solve); a batch of m queries costs O(m·N·(n + p)) (§3.4).
"""

from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.linalg import eigh, svd
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from kahm_dask._batching import row_chunks
from kahm_dask._validation import (
    as_data_matrix,
    check_n_features,
    check_positive_float,
    check_positive_int,
)
from kahm_dask.kernel import gaussian_kernel_matrix, shifted_query_kernel
from kahm_dask.regularization import solve_lambda_spectral

__all__ = [
    "KAHM",
    "DegenerateWeightsWarning",
    "PrincipalSubspace",
    "principal_subspace",
    "DENOMINATOR_RTOL",
]

#: §3.4 guard: a query whose weight sum |Σ h^i| is below this times max_i |B_{i,p}| gets Γ = +∞.
DENOMINATOR_RTOL = 1e-12


class DegenerateWeightsWarning(RuntimeWarning):
    """Some queries had a near-zero KAHM weight sum (§3.4 guard); their distance is +∞."""


@dataclass(frozen=True)
class PrincipalSubspace:
    """Top principal directions of a data matrix after the caps of §3.3.

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
    """Thin-SVD PCA of ``Y`` (N, p) capped as in §3.3 (decisions A10, A21, A22).

    The dimension is ``min(n_max, N − 1, p, #{σ_k > ε_mach·max(1, σ_1)})``, then lowered to
    ``j − 1`` where ``j`` is the first code coordinate whose range over the samples is below
    ``min_range`` (floor 1 while σ_1 passes the cap). Rank-0 data get 0 directions.
    """
    N, p = Y.shape
    mean = Y.mean(axis=0)
    empty = PrincipalSubspace(mean, np.zeros((0, p)), np.zeros(0))
    if N < 2 or n_max < 1:
        return empty
    U, S, Vt = svd(Y - mean, full_matrices=False, check_finite=False)
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


class KAHM(TransformerMixin, BaseEstimator):
    """Kernel Affine Hull Machine ``A_{Y,n}`` (ALGORITHM.md Definition 1, §3).

    Parameters
    ----------
    n_components : int, default=20
        Subspace dimension n, capped by the data as in §3.3 (see ``n_components_``).
    min_range : float or None, default=1e-3
        Lower n while an encoded coordinate's range is below this (absolute, §3.3).
        ``None`` or 0 disables the rule.
    chunk_size : int, default=1000
        Queries evaluated per block; memory per block is O(chunk_size · N).
    regularization : float or None, default=None
        ``None`` uses λ* of Theorem 1 (the method). A positive float forces λ; meant for
        tests and ablations only.
    lambda_rtol, lambda_atol, lambda_max_iter :
        Stopping rule of the λ* fixed point (§2.5, decision A8): stop when the change of
        e is at most ``lambda_rtol·s`` or, if ``lambda_atol`` is set, when the change of λ
        is at most ``lambda_atol`` (the author's rule).

    Attributes
    ----------
    components_ : (n, p) encoding matrix P (top-n principal directions as rows)
    explained_variance_ : (n,) θ = diag(σ_1..σ_n), eq. (36)
    n_components_ : int, effective n after the caps
    mean_ : (p,) sample mean (codes are centred; the kernel only sees differences)
    lambda_ : float, λ* (or the forced value); e_hat_ : ê; n_iter_ : fixed-point iterations
    kernel_eigenvalues_ : (N,) eigenvalues μ of K_{YPᵀ}, clipped at 0
    codes_ : (N, n) whitened training codes z = θ^{-1/2} P (y − ȳ)
    beta_ : (N, p + 1) ``(K + λI)^{-1} [Y | 1]``, numerator and denominator weights (§3.4)
    training_error_ : float, r = Σ_i ‖y^i − A(y^i)‖ (eq. 101) on the training rows
    n_samples_fit_, n_features_in_ : int
    """

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
    ) -> None:
        self.n_components = n_components
        self.min_range = min_range
        self.chunk_size = chunk_size
        self.regularization = regularization
        self.lambda_rtol = lambda_rtol
        self.lambda_atol = lambda_atol
        self.lambda_max_iter = lambda_max_iter

    # ------------------------------------------------------------------ fitting
    def fit(self, Y, y=None) -> "KAHM":
        """Fit the KAHM to the samples ``Y`` (N, p), one sample per row."""
        self._fit(Y)
        return self

    def fit_transform(self, Y, y=None, **fit_params) -> np.ndarray:
        """Fit and return the images of the training rows, (N, p).

        Uses ``A(Y) = diag(H1)^{-1} H Y`` with ``H = K(K + λI)^{-1}`` from the
        eigendecomposition already computed (§3.4, "Training-set images").
        """
        return self._fit(Y, training_images=True)

    def _check_params(self) -> None:
        check_positive_int(self.n_components, "n_components")
        check_positive_int(self.chunk_size, "chunk_size")
        check_positive_int(self.lambda_max_iter, "lambda_max_iter")
        if self.min_range is not None and not (
            isinstance(self.min_range, numbers.Real) and self.min_range >= 0
        ):
            raise ValueError(f"min_range must be None or a number >= 0, got {self.min_range!r}.")
        if self.regularization is not None:
            check_positive_float(self.regularization, "regularization")

    def _fit(self, Y, training_images: bool = False) -> np.ndarray | None:
        self._check_params()
        Y = as_data_matrix(Y, "Y")
        subspace = principal_subspace(Y, self.n_components, self.min_range)
        return self._fit_subspace(Y, subspace, self.n_components, training_images)

    def _fit_subspace(
        self,
        Y: np.ndarray,
        subspace: PrincipalSubspace,
        n: int,
        training_images: bool = False,
    ) -> np.ndarray | None:
        """Fit on validated ``Y`` with a precomputed PCA; ``n`` is capped by ``subspace``.

        Shared by the layers of a deep KAHM, which all model the same ``Y`` (§5).
        """
        N, p = Y.shape
        n = min(n, subspace.n_cap)
        P = subspace.directions[:n]
        sigma = subspace.variances[:n]
        whitening = P.T / np.sqrt(sigma)  # (p, n)
        Z = (Y - subspace.mean) @ whitening
        K = gaussian_kernel_matrix(Z, n)
        mu, U = eigh(K, overwrite_a=True, check_finite=False)
        np.maximum(mu, 0.0, out=mu)
        C = U.T @ np.hstack([Y, np.ones((N, 1))])  # (N, p + 1)
        s = float(np.einsum("ij,ij->", Y, Y)) / (p * N)
        if self.regularization is not None:
            lam, e_hat, n_iter = float(self.regularization), float("nan"), 0
        elif s == 0.0:
            # All-zero data are rank 0: A(y) = ȳ = 0 for every λ > 0 (§3.3).
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
        self.beta_ = U @ (C / (mu + lam)[:, None])
        self.n_samples_fit_ = N
        self.n_features_in_ = p
        self._set_derived()

        HY = U @ (C * (mu / (mu + lam))[:, None])  # K (K + λI)^{-1} [Y | 1]
        images, bad = self._ratio(HY)
        gamma = np.linalg.norm(Y - images, axis=1)
        gamma[bad] = np.inf
        self.training_error_ = float(gamma.sum())
        return images if training_images else None

    def _set_derived(self) -> None:
        """Quantities computed deterministically from the stored state."""
        self.whitening_ = self.components_.T / np.sqrt(self.explained_variance_)
        self.codes_sq_norms_ = np.einsum("ij,ij->i", self.codes_, self.codes_)
        self._den_threshold = DENOMINATOR_RTOL * float(np.max(np.abs(self.beta_[:, -1])))

    # ------------------------------------------------------------ serialisation
    _STATE_ARRAYS = ("mean_", "components_", "explained_variance_", "codes_", "beta_", "kernel_eigenvalues_")
    _STATE_SCALARS = ("n_components_", "lambda_", "e_hat_", "n_iter_", "n_samples_fit_", "n_features_in_", "training_error_")

    def to_state(self) -> tuple[dict[str, np.ndarray], dict[str, float | int]]:
        """The fitted state as arrays and scalars, for storage (no I/O here).

        Arrays: mean (p,), components (n, p), explained_variance (n,), codes (N, n),
        beta (N, p + 1), kernel_eigenvalues (N,). Everything else is derived on load.
        """
        check_is_fitted(self, "beta_")
        arrays = {k.rstrip("_"): getattr(self, k) for k in self._STATE_ARRAYS}
        scalars = {k.rstrip("_"): getattr(self, k) for k in self._STATE_SCALARS}
        scalars = {k: (int(v) if isinstance(v, (int, np.integer)) else float(v)) for k, v in scalars.items()}
        return arrays, {**scalars, "params": self.get_params()}

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], scalars: dict) -> "KAHM":
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
        """Images ``O[:, :p] / O[:, p]`` (eq. 33) and the mask of guarded rows (§3.4)."""
        den = O[:, -1]
        bad = ~(np.abs(den) >= self._den_threshold)  # also catches NaN
        with np.errstate(divide="ignore", invalid="ignore"):
            images = O[:, :-1] / den[:, None]
        images[bad] = np.nan
        return images, bad

    def _images(self, Yq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Images of validated query rows ``Yq`` (m, p) and their guard mask (m,).

        Rows whose weight sum is degenerate, or whose input is not finite, get NaN images.
        """
        Zq = (Yq - self.mean_) @ self.whitening_
        Kq = shifted_query_kernel(Zq, self.codes_, self.codes_sq_norms_, self.n_components_)
        images, bad = self._ratio(Kq @ self.beta_)
        if bad.any():
            new = int(np.count_nonzero(bad & np.isfinite(Yq).all(axis=1)))
            if new:
                warnings.warn(
                    f"{new} query row(s) had a near-zero KAHM weight sum; their distance "
                    "is set to +inf (ALGORITHM.md §3.4).",
                    DegenerateWeightsWarning,
                    stacklevel=3,
                )
        return images, bad

    def _evaluate(self, Yq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Images (m, p) and distances Γ (m,) of validated queries, in row chunks."""
        m = Yq.shape[0]
        images = np.empty_like(Yq)
        gamma = np.empty(m)
        for rows in row_chunks(m, self.chunk_size):
            img, bad = self._images(Yq[rows])
            images[rows] = img
            g = np.linalg.norm(Yq[rows] - img, axis=1)
            g[bad] = np.inf
            gamma[rows] = g
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
