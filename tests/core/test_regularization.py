"""λ* fixed point of Theorem 1 (docs/algorithm.md#krls, docs/algorithm.md#lambda-star).

Oracles: the λ* oracles of docs/oracles.md, docs/oracles.md#oracle-lambda-range to
docs/oracles.md#oracle-mse-identity.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from scipy.linalg import eigh
from sklearn.exceptions import ConvergenceWarning

from benchmarks.naive import direct_R, gaussian_kernel, kahm_reference
from kahm_dask import KAHM
from kahm_dask.regularization import (
    LambdaFixedPoint,
    regularized_training_mse,
    solve_lambda,
    solve_lambda_spectral,
)


def _problem(seed: int, N: int = 40, p: int = 6, d: int = 3, offset: float = 0.7):
    """Random KRLS problem: inputs X (N, d), Gaussian K with the 1/(2d) factor, targets Y
    with a non-zero mean (s is uncentred)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, d))
    K = gaussian_kernel(X, X, 2 * d)
    Y = rng.normal(size=(N, p)) + offset
    return X, K, Y


def _spectral(K, Y):
    N, p = Y.shape
    mu, U = eigh(K)
    mu = np.maximum(mu, 0.0)
    C = U.T @ Y
    return mu, np.einsum("ij,ij->i", C, C), float(np.sum(Y * Y)) / (p * N), p * N


SEEDS = [0, 1, 2]


# ----------------------------------------------- docs/oracles.md#oracle-lambda-range
@pytest.mark.parametrize("seed", SEEDS)
def test_oracle1_lambda_star_range(seed):
    """docs/oracles.md#oracle-lambda-range: ê ∈ (0, s), λ* = ê + 2s, hence 2s < λ* < 3s."""
    _, K, Y = _problem(seed)
    N, p = Y.shape
    s = np.sum(Y**2) / (p * N)
    res = solve_lambda(K, Y)
    assert isinstance(res, LambdaFixedPoint)
    assert res.converged
    assert res.s == pytest.approx(s, rel=1e-14)
    assert 0.0 < res.e_hat < s
    assert res.lambda_star == pytest.approx(res.e_hat + 2 * s, rel=1e-15, abs=0)
    assert 2 * s < res.lambda_star < 3 * s
    # the spectral entry point on a precomputed eigendecomposition gives the same λ*
    spec = solve_lambda_spectral(*_spectral(K, Y))
    assert spec.lambda_star == pytest.approx(res.lambda_star, rel=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_oracle1b_kahm_uses_lambda_star(seed):
    """docs/oracles.md#oracle-kahm-uses-lambda-star: a fitted KAHM's λ equals solve_lambda on its
    own K_{YPᵀ} and Y (1e-12 rel); 2s < λ < 3s; the fixed-point residual by the direct formula is ≤
    1e-8·s. K is rebuilt in the test from Y and P with θ = covariance of the uncentred codes Py
    (eq. 36)."""
    rng = np.random.default_rng(100 + seed)
    N, p, n = 100, 15, 4
    Y = rng.normal(size=(N, p)) @ rng.normal(size=(p, p)) + 2.0
    model = KAHM(n_components=n).fit(Y)
    assert model.n_components_ == n
    K, _ = kahm_reference(Y, model.components_)
    s = np.sum(Y**2) / (p * N)
    ref = solve_lambda(K, Y)
    assert model.lambda_ == pytest.approx(ref.lambda_star, rel=1e-12)
    assert 2 * s < model.lambda_ < 3 * s
    e_hat = model.lambda_ - 2 * s
    assert model.e_hat_ == pytest.approx(e_hat, rel=1e-9)
    assert abs(direct_R(K, Y, e_hat, 2 * s) - e_hat) <= 1e-8 * s


# ------------------------------------------------ docs/oracles.md#oracle-fixed-point
@pytest.mark.parametrize("seed", SEEDS)
def test_oracle2_fixed_point_direct_formula(seed):
    """docs/oracles.md#oracle-fixed-point: |R(ê, 2s) − ê| ≤ 1e-8·s with R by the direct formula
    (scipy.linalg.solve)."""
    _, K, Y = _problem(seed)
    res = solve_lambda(K, Y)
    s = res.s
    assert abs(direct_R(K, Y, res.e_hat, 2 * s) - res.e_hat) <= 1e-8 * s
    # and the spectral R agrees with the direct R at unrelated points
    mu, c2, s2, pN = _spectral(K, Y)
    for e in (0.1 * s, 0.5 * s, 0.9 * s):
        for tau in (0.5 * s, 2 * s):
            assert regularized_training_mse(e, tau, mu, c2, pN) == pytest.approx(
                direct_R(K, Y, e, tau), rel=1e-10
            )


# ----------------------------------------- docs/oracles.md#oracle-start-independence
def _iterates(mu, c2, s, pN, e0, n_max=200):
    """Reimplementation of the iteration e ← R(e, 2s), returning all iterates."""
    es = [e0]
    for _ in range(n_max):
        es.append(regularized_training_mse(es[-1], 2 * s, mu, c2, pN))
        if abs(es[-1] - es[-2]) <= 1e-14 * s:
            break
    return np.array(es)


@pytest.mark.parametrize("seed", SEEDS)
def test_oracle3_start_value_independence(seed):
    """docs/oracles.md#oracle-start-independence: e0 ∈ {1e-6·s, 0.5·s, 0.999·s} give the same ê to
    1e-8·s."""
    _, K, Y = _problem(seed)
    s = solve_lambda(K, Y).s
    sols = [solve_lambda(K, Y, e0=f * s) for f in (1e-6, 0.5, 0.999)]
    assert all(r.converged for r in sols)
    e = [r.e_hat for r in sols]
    assert max(e) - min(e) <= 1e-8 * s


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("f0", [1e-6, 0.5, 0.999])
def test_oracle3_monotone_geometric_iterates(seed, f0):
    """docs/oracles.md#oracle-start-independence: iterates are monotone (R is increasing) and
    |e_{t+1} − e_t| decreases geometrically; by the mean value theorem the step ratio is below
    2s/(min(e_t, e_{t-1}) + τ)."""
    _, K, Y = _problem(seed)
    mu, c2, s, pN = _spectral(K, Y)
    es = _iterates(mu, c2, s, pN, f0 * s)
    assert len(es) < 100  # converged well before the cap
    ref = solve_lambda(K, Y)
    assert abs(es[-1] - ref.e_hat) <= 1e-8 * s
    steps = np.diff(es)
    big = np.abs(steps) > 1e-12 * s  # ignore steps at round-off level
    signs = np.sign(steps[big])
    assert np.all(signs == signs[0]), "iterates are not monotone"
    # direction: from below the fixed point the iterates increase, from above they decrease
    assert signs[0] == np.sign(ref.e_hat - f0 * s)
    idx = np.flatnonzero(big[1:] & big[:-1]) + 1
    assert idx.size >= 2
    ratio = np.abs(steps[idx]) / np.abs(steps[idx - 1])
    bound = 2 * s / (np.minimum(es[idx], es[idx - 1]) + 2 * s)
    assert np.all(ratio < bound)
    assert np.all(ratio < 1.0)


# ------------------------------------------ docs/oracles.md#oracle-derivative-bounds
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tau_factor", [0.5, 2.0, 5.0])
def test_oracle4_derivative_bounds(seed, tau_factor):
    """docs/oracles.md#oracle-derivative-bounds: ∂R/∂e by central finite differences lies in
    (0, 2s/(e + τ)) at random e, and R(e, τ) ∈ (0, s), for τ ∈ {0.5s, 2s, 5s}."""
    _, K, Y = _problem(seed)
    mu, c2, s, pN = _spectral(K, Y)
    tau = tau_factor * s
    rng = np.random.default_rng(seed + 7)
    es = rng.uniform(0.01, 0.99, size=20) * s
    h = 1e-5 * s
    R = regularized_training_mse(es, tau, mu, c2, pN)
    assert np.all((R > 0) & (R < s))
    dR = (
        regularized_training_mse(es + h, tau, mu, c2, pN)
        - regularized_training_mse(es - h, tau, mu, c2, pN)
    ) / (2 * h)
    assert np.all(dR > 0)
    assert np.all(dR < 2 * s / (es + tau))
    # the finite differences are accurate: compare with the analytic spectral derivative
    lam = es[:, None] + tau
    exact = (2 * lam * mu / (mu + lam) ** 3) @ c2 / pN
    np.testing.assert_allclose(dR, exact, rtol=1e-6)


# ----------------------------------------------- docs/oracles.md#oracle-mse-identity
@pytest.mark.parametrize("seed", SEEDS)
def test_oracle5_mse_identity_explicit_krls(seed):
    """docs/oracles.md#oracle-mse-identity: e(λ) (spectral form, eq. 18) equals the mean squared
    residual of the explicit KRLS predictions f*(x^i) = k_X(x^i)ᵀ(K + λI)^{-1}Y (eq. 13), evaluated
    with the kernel function at each training input."""
    X, K, Y = _problem(seed)
    N, p = Y.shape
    d = X.shape[1]
    mu, c2, s, pN = _spectral(K, Y)
    for lam in (0.01 * s, 0.3 * s, 2.5 * s, 10 * s):
        alpha = np.linalg.solve(K + lam * np.eye(N), Y)
        preds = np.array([gaussian_kernel(X[i : i + 1], X, 2 * d)[0] @ alpha for i in range(N)])
        mse = np.mean((Y - preds) ** 2)
        # e(λ) = R(e, τ) with e + τ = λ
        assert regularized_training_mse(lam - s, s, mu, c2, pN) == pytest.approx(mse, rel=1e-9)
    # at λ*, the training MSE is ê (λ* exceeds the training MSE by exactly 2s)
    res = solve_lambda(K, Y)
    alpha = np.linalg.solve(K + res.lambda_star * np.eye(N), Y)
    mse = np.mean((Y - K @ alpha) ** 2)
    assert abs(mse - res.e_hat) <= 1e-8 * s


# --------------------------------------------------------------------------- errors, options
def test_all_zero_targets_raise():
    """Theorem 1 assumes Y ≠ 0: an all-zero Y raises ValueError."""
    _, K, Y = _problem(0)
    with pytest.raises(ValueError, match="all zeros"):
        solve_lambda(K, np.zeros_like(Y))


@pytest.mark.parametrize("shape", [(39, 39), (40, 39), (41, 41)])
def test_kernel_shape_mismatch_raises(shape):
    """K must be (N, N) for Y (N, p)."""
    _, _, Y = _problem(0)
    with pytest.raises(ValueError, match=r"K must have shape \(40, 40\)"):
        solve_lambda(np.eye(*shape), Y)


def test_non_convergence_warns():
    """max_iter=1 cannot meet the 1e-10·s rule: a ConvergenceWarning, converged=False, and
    the returned λ is still the last iterate + 2s."""
    _, K, Y = _problem(0)
    mu, c2, s, pN = _spectral(K, Y)
    with pytest.warns(ConvergenceWarning, match="did not converge in 1 iterations"):
        res = solve_lambda(K, Y, max_iter=1)
    assert not res.converged
    assert res.n_iter == 1
    e1 = regularized_training_mse(0.5 * s, 2 * s, mu, c2, pN)
    assert res.e_hat == pytest.approx(e1, rel=1e-12)
    assert res.lambda_star == pytest.approx(e1 + 2 * s, rel=1e-12)


def test_non_convergence_warning_reports_last_change():
    """The ConvergenceWarning states the last change of e; with max_iter=1 that is
    |R(s/2) − s/2| > 0, not 0."""
    _, K, Y = _problem(0)
    mu, c2, s, pN = _spectral(K, Y)
    change = abs(regularized_training_mse(0.5 * s, 2 * s, mu, c2, pN) - 0.5 * s)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        solve_lambda(K, Y, max_iter=1)
    msg = str([w for w in rec if issubclass(w.category, ConvergenceWarning)][0].message)
    reported = float(re.search(r"last change ([0-9.eE+-]+)", msg).group(1))
    assert reported == pytest.approx(change, rel=1e-2)


@pytest.mark.parametrize("seed", SEEDS)
def test_lambda_atol_stops_earlier_within_tolerance(seed):
    """docs/decisions.md#decision-lambda-stopping: the author's absolute rule on the change of λ
    (1e-3) stops in fewer iterations than the default 1e-10·s rule, and its λ is within 1e-3 of
    λ*."""
    _, K, Y = _problem(seed)
    tight = solve_lambda(K, Y)
    atol = 1e-3
    loose = solve_lambda(K, Y, lambda_atol=atol)
    assert loose.converged
    assert loose.n_iter < tight.n_iter
    assert abs(loose.lambda_star - tight.lambda_star) <= atol
    assert loose.lambda_star != tight.lambda_star
    # the KAHM passes the option through
    rng = np.random.default_rng(seed)
    Yk = rng.normal(size=(60, 8)) + 1
    a = KAHM(n_components=3).fit(Yk)
    b = KAHM(n_components=3, lambda_atol=atol).fit(Yk)
    assert b.n_iter_ < a.n_iter_
    assert abs(b.lambda_ - a.lambda_) <= atol


def test_invalid_start_value_raises():
    """e0 must lie in (0, s)."""
    _, K, Y = _problem(0)
    s = solve_lambda(K, Y).s
    for e0 in (0.0, s, 2 * s, -1.0):
        with pytest.raises(ValueError, match="e0 must lie in"):
            solve_lambda(K, Y, e0=e0)
