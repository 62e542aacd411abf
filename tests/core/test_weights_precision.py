"""Weights in the data's precision (docs/algorithm.md#weights-precision).

A KAHM fitted on float32 rows rounds its weights β = (K + λI)^{-1}[Y | 1] to float32 once, at
the end of the fit; everything else (the subspace, the codes, λ*, the evaluation) is float64.
These tests check where the rounding happens, that it happens for float32 rows only, and that
the distances of the rounded model are within the error bound that rounding β implies.
"""

from __future__ import annotations

import numpy as np
import pytest

from kahm_dask import KAHM, KAHMClassifier
from kahm_dask.deep import DeepKAHM, WideKAHM
from kahm_dask.kernel import kernel_scale

RNG = np.random.default_rng(11)
U32 = 2.0**-24  # unit roundoff of float32 (round to nearest)
U64 = 2.0**-53


def _rows(N: int = 400, p: int = 30, rank: int = 8) -> np.ndarray:
    """Float32 rows near a ``rank``-dimensional subspace."""
    Y = RNG.normal(size=(N, rank)) @ RNG.normal(size=(rank, p)) + 0.05 * RNG.normal(size=(N, p))
    return Y.astype(np.float32)


def _is_float32_valued(a: np.ndarray) -> bool:
    return a.dtype == np.float64 and np.array_equal(a.astype(np.float32), a)


@pytest.mark.parametrize("make", [
    lambda: KAHM(6),
    lambda: DeepKAHM(6, 3),
    lambda: WideKAHM(6, 2, block_size=150, random_state=0),
])
def test_float32_rows_give_float32_valued_weights_and_float64_rows_do_not(make):
    Y32 = _rows()
    for est, dtype_rounded in ((make().fit(Y32), True), (make().fit(Y32.astype(np.float64)), False)):
        kahms = [est] if isinstance(est, KAHM) else [
            layer for branch in getattr(est, "branches_", [est]) for layer in branch.layers_
        ]
        for kahm in kahms:
            assert _is_float32_valued(kahm.beta_) is dtype_rounded
            assert _is_float32_valued(kahm.codes_) is False  # only β is rounded
            assert kahm.to_state()[0]["beta"].dtype == (np.float32 if dtype_rounded else np.float64)


def test_rounding_beta_moves_each_distance_by_at_most_its_error_bound():
    """Fit the same values twice, as float32 and as float64 rows: the subspace, codes and λ* are
    the same, and the two models differ only in β's rounding, |δβ| ≤ u|β| elementwise.

    For a query with kernel weights k (k_j = exp(−‖z_q − z_j‖²/(2n)), any common scale),
    O = kβ changes by |δO| ≤ (u + 2γ_N)·A with A = k|β| (the rounding, and each model's float64
    GEMM error γ_N = N·u₆₄/(1 − N·u₆₄)); the image x = O_{:p}/O_p then moves by at most
    e·(A_{:p} + |x|·A_p)/(|O_p| − e·A_p) componentwise, e = u + 2γ_N, and Γ = ‖y − x‖ by at
    most that vector's norm (plus the norms' own rounding, 2p·u₆₄·Γ)."""
    Y32 = _rows()
    rounded, exact = KAHM(6).fit(Y32), KAHM(6).fit(Y32.astype(np.float64))
    np.testing.assert_array_equal(rounded.codes_, exact.codes_)
    assert rounded.lambda_ == exact.lambda_
    Q = np.concatenate([Y32[:50].astype(np.float64) + 0.1 * RNG.normal(size=(50, 30)),
                        3.0 * RNG.normal(size=(20, 30))])

    zq = (Q - exact.mean_) @ exact.whitening_
    d2 = ((zq[:, None, :] - exact.codes_[None, :, :]) ** 2).sum(axis=2)
    k = np.exp(-kernel_scale(exact.n_components_) * (d2 - d2.min(axis=1, keepdims=True)))
    A = k @ np.abs(exact.beta_)
    out = k @ exact.beta_
    images = out[:, :-1] / out[:, -1:]
    N, p = exact.beta_.shape[0], Q.shape[1]
    e = U32 + 2 * N * U64 / (1 - N * U64)
    moved = e * (A[:, :-1] + np.abs(images) * A[:, -1:]) / (np.abs(out[:, -1:]) - e * A[:, -1:])
    gamma = exact.distance(Q)
    bound = np.linalg.norm(moved, axis=1) + 2 * p * U64 * gamma

    change = np.abs(rounded.distance(Q) - gamma)
    assert np.all(change <= bound), np.max(change / bound)
    assert np.any(change > 0)  # the rounding is there, and the bound is not vacuous:
    assert np.all(bound <= 1e-4 * gamma)


def test_the_classifier_keeps_float32_rows_and_their_release_in_float32():
    """KAHMClassifier on float32 rows: class models with float32-valued weights, and the DP rows
    (the release, in the data's dtype like the Dask pipeline's) in float32; fabricated rows are
    made in float64, and stay float64 with their models' weights."""
    X = np.concatenate([_rows(120), _rows(120) + 3.0])
    y = np.repeat([0, 1], 120)
    clf = KAHMClassifier(n_components=4, random_state=0).fit(X, y)
    assert all(_is_float32_valued(layer.beta_) for m in clf.models_ for b in m.branches_ for layer in b.layers_)
    dp = KAHMClassifier(n_components=4, epsilon=2.0, bounds=(-20.0, 20.0), random_state=0).fit(X, y)
    assert all(rows.dtype == np.float32 for rows in dp.dp_data_.values())
    assert all(_is_float32_valued(layer.beta_) for m in dp.models_ for b in m.branches_ for layer in b.layers_)
    fab = KAHMClassifier(n_components=4, epsilon=2.0, bounds=(-20.0, 20.0), dp_data="fabricated", max_passes=2,
                         random_state=0).fit(X, y)
    assert all(rows.dtype == np.float64 for rows in fab.dp_data_.values())  # made in float64, kept so
    assert not any(_is_float32_valued(layer.beta_) for m in fab.models_ for b in m.branches_ for layer in b.layers_)


def test_the_smoother_threshold_of_float32_rows_is_their_float64_modelling_error():
    """r of eq. 101 (the paper's private stopping threshold) is computed in float64 for float32
    rows too: a threshold, not a stored model, so its KAHM's β is not rounded."""
    from kahm_dask.privacy.fabrication import modelling_error

    Y32 = _rows()
    assert modelling_error(Y32, 6) == KAHM(6).fit(Y32.astype(np.float64)).training_error_
    assert modelling_error(Y32, 6) != KAHM(6).fit(Y32).training_error_  # the rounded model's r differs
