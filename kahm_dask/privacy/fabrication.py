"""Smoother, DP fabricated data and big-data fabrication (the paper's Definitions 13–14).

The smoother fits a KAHM to the current points and replaces every point by its own KAHM
image, repeatedly (docs/decisions.md#decision-smoother-recursion): ``Ŷ_0 = Y⁺_ε``,
``Ŷ_m = A_{Ŷ_{m−1},n}(Ŷ_{m−1})``. The fabricated data ``Ỹ = F_n(Y⁺_ε, r)`` are the images
after the smallest number of passes ``M̃`` whose modelling error does not exceed the original
data's ``r`` (eqs. 100–106). See docs/algorithm.md#fabrication.

Privacy: with the defaults (``r_source="passes"``, ``cluster_on="noisy"``) everything here is
post-processing of ``Y⁺_ε``. The paper's stopping threshold ``r`` is computed from the private
rows (``r_source="private"``) and its Remark 4 partition from the private rows
(``cluster_on="original"``): both leak beyond the noise and are options that warn;
see docs/privacy.md.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from kahm_dask._validation import as_data_matrix, check_n_rows, check_positive_int
from kahm_dask.kahm import KAHM
from kahm_dask.params import DEFAULT_PASSES, PARAMS, check_params
from kahm_dask.partition import (
    KMEANS_DIMS,
    check_partition,
    default_min_cluster_size,
    kmeans_partition,
    n_branches,
)

__all__ = [
    "Fabrication",
    "FabricationWarning",
    "smooth",
    "fabricate",
    "modelling_error",
    "fabricate_partitioned",
    "fabricate_subset",
    "R_SOURCES",
    "CLUSTER_ON",
    "DEFAULT_PASSES",
]

R_SOURCES = PARAMS["r_source"].choices
CLUSTER_ON = PARAMS["cluster_on"].choices


class FabricationWarning(UserWarning):
    """The smoother reached ``max_passes`` before the modelling error fell to r."""


class Fabrication(NamedTuple):
    """Output of :func:`fabricate`.

    data : (N, p) fabricated matrix Ỹ (eq. 103)
    n_passes : M̃ (eq. 105), or None if r was not reached within ``max_passes``
    errors : (k,) modelling error Σ_i ‖ŷ^{i,m−1} − A(ŷ^{i,m−1})‖ of each tested iterate
    """

    data: np.ndarray
    n_passes: int | None
    errors: np.ndarray


def modelling_error(Y, n_components: int, *, min_range: float | None = 1e-3) -> float:
    """``r = Σ_i ‖y^i − A_{Y,n}(y^i)‖`` (eq. 101): a sum of norms, not of squares.

    Computed in float64 whatever ``Y``'s dtype: a threshold for the smoother's float64 passes,
    not a model to store, so β is not rounded for float32 rows
    (docs/algorithm.md#weights-precision)."""
    return KAHM(n_components, min_range=min_range).fit(as_data_matrix(Y, "Y")).training_error_


def _kahm_pass(Yh: np.ndarray, n_components: int, min_range: float | None) -> tuple[np.ndarray, float]:
    """One smoother pass: KAHM of ``Yh`` and the images of its own rows, and their error."""
    model = KAHM(n_components, min_range=min_range)
    images = model.fit_transform(Yh)
    if not np.isfinite(images).all():
        raise FloatingPointError(
            "a smoother pass produced non-finite images (degenerate KAHM weights); "
            "scale the features (e.g. to [0, 1]) before fabrication."
        )
    return images, model.training_error_


def smooth(Y_noisy, n_components: int, n_passes: int, *, min_range: float | None = 1e-3) -> np.ndarray:
    """Smoother ``T_{n,M}(Y⁺) = Ŷ_{M−1}`` (Definition 13, eqs. 93–98); M = 1 returns a copy."""
    Yh = as_data_matrix(Y_noisy, "Y_noisy", min_rows=2).copy()
    for _ in range(check_positive_int(n_passes, "n_passes") - 1):
        Yh, _ = _kahm_pass(Yh, n_components, min_range)
    return Yh


def fabricate(
    Y_noisy,
    n_components: int,
    r: float | None = None,
    *,
    max_passes: int = 100,
    n_passes: int | None = None,
    min_range: float | None = 1e-3,
) -> Fabrication:
    """DP fabricated data ``Ỹ = F_n(Y⁺_ε, r)`` (Definition 14;
    docs/algorithm.md#fabricated-data).

    Y_noisy : (N, p) noisy data from Algorithm 1. Give exactly one of
    ``r`` (stop at the first pass whose iterate's modelling error is ≤ r; the paper) or
    ``n_passes`` (a fixed M̃, no data-dependent stopping). If r is not reached within
    ``max_passes`` a :class:`FabricationWarning` is issued and the last images returned.
    """
    Yh = as_data_matrix(Y_noisy, "Y_noisy", min_rows=2)
    if (r is None) == (n_passes is None):
        raise ValueError("give exactly one of r (error threshold) or n_passes (fixed M̃).")
    if n_passes is not None:
        limit = check_positive_int(n_passes, "n_passes")
    else:
        if not np.isfinite(r) or r < 0:
            raise ValueError(f"r must be a finite number >= 0, got {r}.")
        limit = check_positive_int(max_passes, "max_passes")
    errors = []
    for m in range(1, limit + 1):
        images, err = _kahm_pass(Yh, n_components, min_range)
        errors.append(err)
        if r is not None and err <= r:
            return Fabrication(images, m, np.asarray(errors))
        Yh = images
    if n_passes is not None:
        return Fabrication(images, limit, np.asarray(errors))
    warnings.warn(
        f"modelling error {errors[-1]:.4g} still above r = {r:.4g} after {limit} passes; "
        "returning the last fabricated iterate.",
        FabricationWarning,
        stacklevel=2,
    )
    return Fabrication(images, None, np.asarray(errors))


def fabricate_partitioned(
    Y,
    Y_noisy,
    n_components: int,
    *,
    r_source: str = "passes",
    r_value: float | int | None = None,
    cluster_on: str = "noisy",
    block_size: int = 1000,
    s_rule: str = "round",
    min_cluster_size: int | None = None,
    partition=None,
    random_state=None,
    max_passes: int = 100,
    min_range: float | None = 1e-3,
    n_init: int = 1,
    kmeans_dims: int | None = KMEANS_DIMS,
) -> tuple[np.ndarray, np.ndarray, list[int | None]]:
    """Big-data fabrication of Remark 4: fabricate each k-means subset on its own.

    See docs/algorithm.md#big-data-fabrication.

    Y : (N, p) original private rows (used only for ``r_s`` and, with
    ``cluster_on="original"``, the partition); Y_noisy : (N, p) their noisy rows, aligned.
    r_source : "passes" (a fixed M̃ = r_value, default :data:`DEFAULT_PASSES`), "threshold"
    (``r_s = r_value · N_s``, a public per-row error) or "private" (``r_s`` from the subset's
    original rows, the paper; leaks).
    partition : optional (N,) labels replacing the k-means step; n_init, kmeans_dims: that
    step's settings (:func:`~kahm_dask.partition.kmeans_partition`).

    Returns Ỹ (N, p) with row i fabricated from row i of Y_noisy, the (N,) subset labels and
    the M̃ of each subset (None where r was not reached).
    """
    Y = as_data_matrix(Y, "Y", min_rows=2)
    Y_noisy = as_data_matrix(Y_noisy, "Y_noisy", min_rows=2)
    if Y.shape != Y_noisy.shape:
        raise ValueError(f"Y {Y.shape} and Y_noisy {Y_noisy.shape} must have the same shape.")
    _check_fabrication_options(r_source, r_value, cluster_on)
    if partition is None:
        S = n_branches(Y.shape[0], block_size, s_rule)
        labels = kmeans_partition(
            Y if cluster_on == "original" else Y_noisy,
            S,
            min_cluster_size=min_cluster_size or default_min_cluster_size(n_components),
            random_state=random_state,
            n_init=n_init,
            kmeans_dims=kmeans_dims,
        )
        ids = np.unique(labels)
    else:
        labels, ids = check_partition(partition, Y.shape[0])
    fabricated = np.empty_like(Y_noisy)
    passes: list[int | None] = []
    for s in ids:
        rows = labels == s
        check_n_rows(int(rows.sum()), 2, f"subset {s}")
        result = fabricate_subset(
            Y[rows], Y_noisy[rows], n_components, r_source=r_source, r_value=r_value,
            max_passes=max_passes, min_range=min_range,
        )
        fabricated[rows] = result.data
        passes.append(result.n_passes)
    return fabricated, labels, passes


def fabricate_subset(
    Y_s: np.ndarray | None,
    Y_noisy_s: np.ndarray,
    n_components: int,
    *,
    r_source: str = "passes",
    r_value: float | int | None = None,
    max_passes: int = 100,
    min_range: float | None = 1e-3,
) -> Fabrication:
    """Fabricate one subset with the threshold chosen by ``r_source`` (see above).

    ``Y_s`` (the subset's original rows) is read only for ``r_source="private"``; pass None
    otherwise, so the private rows need not be loaded at all.
    """
    if r_source == "passes":
        n_passes = DEFAULT_PASSES if r_value is None else int(r_value)
        return fabricate(Y_noisy_s, n_components, n_passes=n_passes, min_range=min_range)
    if r_source == "private":
        if Y_s is None:
            raise ValueError("r_source='private' needs the subset's original rows Y_s.")
        r = modelling_error(Y_s, n_components, min_range=min_range)
    else:
        r = float(r_value) * Y_noisy_s.shape[0]
    return fabricate(Y_noisy_s, n_components, r, max_passes=max_passes, min_range=min_range)


def _check_fabrication_options(r_source: str, r_value: float | int | None, cluster_on: str) -> None:
    check_params({"r_source": r_source, "r_value": r_value, "cluster_on": cluster_on}, "fabricate_partitioned")
