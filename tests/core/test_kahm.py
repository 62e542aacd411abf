"""The KAHM A_{Y,n} (docs/algorithm.md#kahm, docs/algorithm.md#distance).

Oracles: the KAHM oracles of docs/oracles.md (docs/oracles.md#oracle-batch-equals-weights
to docs/oracles.md#oracle-batch-chunk-invariance), docs/oracles.md#oracle-definition-1 and
docs/oracles.md#oracle-guards (the caps of docs/algorithm.md#kahm-guards and
docs/algorithm.md#denominator-guard).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.stats import ortho_group
from sklearn.exceptions import NotFittedError

import kahm_dask.kahm as kahm_module
from benchmarks.naive import affine_residual, explicit_images, kahm_reference, sq_dists
from kahm_dask import KAHM, DegenerateWeightsWarning
from kahm_dask.kahm import PrincipalSubspace, principal_subspace
from kahm_dask.kernel import shifted_query_kernel
from kahm_dask.regularization import solve_lambda

EPS = np.finfo(np.float64).eps


def _data(seed: int, N: int = 100, p: int = 15, offset: float = 0.5) -> np.ndarray:
    """Correlated Gaussian data with a non-zero mean."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(N, p)) @ (np.eye(p) + 0.3 * rng.normal(size=(p, p))) + offset


def _near_far(Y: np.ndarray, rng: np.random.Generator, m_near: int, m_far: int, far: float = 50.0):
    """Queries of docs/oracles.md#oracle-batch-equals-weights: training rows + 0.3·sd·N(0, I) and
    the mean + far·sd·N(0, I)."""
    N, p = Y.shape
    sd = Y.std()
    near = Y[rng.integers(0, N, m_near)] + 0.3 * sd * rng.normal(size=(m_near, p))
    farq = Y.mean(axis=0) + far * sd * rng.normal(size=(m_far, p))
    return near, farq


def _model_query_d2(model: KAHM, Yq: np.ndarray) -> np.ndarray:
    """Squared distances of the query codes to the model's training codes, computed in the test."""
    Zq = (Yq - model.mean_) @ model.components_.T / np.sqrt(model.explained_variance_)
    return sq_dists(Zq, model.codes_)


@pytest.fixture(scope="module")
def fitted():
    """Setting of docs/oracles.md#oracle-batch-equals-weights,
    docs/oracles.md#oracle-stabilised-equals-naive and docs/oracles.md#oracle-theorem-bounds:
    N = 100, p = 15, n = 4."""
    Y = _data(0)
    model = KAHM(n_components=4).fit(Y)
    assert model.n_components_ == 4
    K, codes = kahm_reference(Y, model.components_)
    return Y, model, K, codes


# --------------------------------------------------------------------------- Definition 1
def test_definition1_encoding_and_theta(fitted):
    """docs/oracles.md#oracle-definition-1 (steps 1–2 of docs/algorithm.md#kahm-definition): rows
    of P are the top-n unit eigenvectors of Σ_Y, θ = diag(σ_1..σ_n), the codes are whitened, and K
    has a unit diagonal and is symmetric positive definite."""
    Y, model, K, _ = fitted
    n = model.n_components_
    sigma, V = np.linalg.eigh(np.cov(Y, rowvar=False))
    sigma, V = sigma[::-1], V[:, ::-1]
    np.testing.assert_allclose(model.explained_variance_, sigma[:n], rtol=1e-10)
    P = model.components_
    np.testing.assert_allclose(P @ P.T, np.eye(n), atol=1e-12)
    np.testing.assert_allclose(np.abs(P @ V[:, :n]), np.eye(n), atol=1e-8)
    theta = np.cov(Y @ P.T, rowvar=False)
    np.testing.assert_allclose(theta, np.diag(sigma[:n]), rtol=1e-10, atol=1e-10 * sigma[0])
    np.testing.assert_allclose(np.cov(model.codes_, rowvar=False), np.eye(n), atol=1e-10)
    np.testing.assert_allclose(np.diag(K), 1.0)
    assert np.allclose(K, K.T)
    mu = np.linalg.eigvalsh(K)
    assert mu.min() > 0
    np.testing.assert_allclose(np.sort(model.kernel_eigenvalues_), mu, atol=1e-10)


# --------------------------------------- docs/oracles.md#oracle-batch-equals-weights
def test_oracle6_batch_image_equals_explicit_weights(fitted):
    """docs/oracles.md#oracle-batch-equals-weights: the batch image equals w(y)ᵀY with w = h/1ᵀh,
    h = (K+λI)^{-1}k(Py) by a linear solve (kernel rows shifted by exp(min_j D²/(2n))), to
    1e-9·max|Y|, at near and far queries; some far queries have every unshifted kernel value
    underflow to 0."""
    Y, model, K, codes = fitted
    n = model.n_components_
    rng = np.random.default_rng(6)
    near, far = _near_far(Y, rng, 200, 200)
    # the stabilisation is exercised: every unshifted kernel value of some far rows is 0
    unshifted = np.exp(-_model_query_d2(model, far) / (2 * n))
    all_zero = np.all(unshifted == 0.0, axis=1)
    assert all_zero.sum() >= 5
    scale = np.abs(Y).max()
    Zy = codes(Y)
    for Yq in (near, far):
        D2 = sq_dists(codes(Yq), Zy)
        Kq = np.exp(-(D2 - D2.min(axis=1, keepdims=True)) / (2 * n))
        ref = explicit_images(K, model.lambda_, Kq, Y)
        out = model.transform(Yq)
        assert np.all(np.isfinite(out))
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-9 * scale)
    # the underflowing rows in particular have a finite image and distance
    img, gam = model.transform_with_distance(far[all_zero])
    assert np.all(np.isfinite(img)) and np.all(np.isfinite(gam))


# ------------------------------------------------ docs/oracles.md#oracle-affine-hull
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_oracle7_image_in_affine_hull(seed):
    """docs/oracles.md#oracle-affine-hull: with N < p (N = 6, p = 20), A(y) − y¹ ∈ span{y^i − y¹};
    the least-squares residual is ≤ 1e-9·scale, for near and far queries."""
    rng = np.random.default_rng(70 + seed)
    Y = rng.normal(size=(6, 20)) + 1.0
    model = KAHM(n_components=3).fit(Y)
    near, far = _near_far(Y, rng, 50, 50, far=5.0)
    Yq = np.vstack([near, far, rng.normal(size=(20, 20))])
    out = model.transform(Yq)
    scale = np.abs(Y).max()
    assert affine_residual(out, Y).max() <= 1e-9 * scale
    # the queries themselves are not in the hull, so the check is not vacuous
    assert affine_residual(Yq, Y).min() > 1e-2 * scale


# ---------------------------------- docs/oracles.md#oracle-small-lambda-interpolates
def test_oracle8_small_lambda_interpolates():
    """docs/oracles.md#oracle-small-lambda-interpolates: on well-conditioned K
    (N = 20, p = 10, n = 5; precondition μ_min(K) > 1e-4), forcing λ = 1e-8 gives A(y^j) ≈ y^j
    (max error ≤ 1e-4·scale); with λ*, ‖y^j − A(y^j)‖ > 0."""
    rng = np.random.default_rng(8)
    Y = rng.normal(size=(20, 10))
    star = KAHM(n_components=5).fit(Y)
    assert star.n_components_ == 5
    K, _ = kahm_reference(Y, star.components_)
    assert np.linalg.eigvalsh(K).min() > 1e-4  # precondition (≫ λ = 1e-8)
    small = KAHM(n_components=5, regularization=1e-8).fit(Y)
    assert small.lambda_ == 1e-8
    scale = np.abs(Y).max()
    assert np.abs(small.transform(Y) - Y).max() <= 1e-4 * scale
    assert np.abs(small.fit_transform(Y) - Y).max() <= 1e-4 * scale
    gam = star.distance(Y)
    assert np.all(gam > 1e-3 * scale)


# ------------------------------------ docs/oracles.md#oracle-stabilised-equals-naive
def test_oracle9_stabilised_equals_naive(fitted):
    """docs/oracles.md#oracle-stabilised-equals-naive: the stabilised batch formula equals the
    naive w = K_q(K + λI)^{-1} (unshifted, row-normalised) to 1e-10·max|Y| wherever the naive kernel
    does not underflow."""
    Y, model, K, codes = fitted
    n = model.n_components_
    rng = np.random.default_rng(9)
    near, mid = _near_far(Y, rng, 200, 100, far=3.0)
    _, mid2 = _near_far(Y, rng, 0, 100, far=8.0)
    Yq = np.vstack([near, mid, mid2])
    D2 = sq_dists(codes(Yq), codes(Y))
    Kq = np.exp(-D2 / (2 * n))  # unshifted
    ok = Kq.max(axis=1) > 1e-150
    assert ok.sum() >= 300
    assert (Kq.max(axis=1)[ok] < 1e-3).sum() >= 10  # includes rows with tiny kernel values
    W = np.linalg.solve(K + model.lambda_ * np.eye(len(Y)), Kq[ok].T).T
    naive = (W / W.sum(axis=1, keepdims=True)) @ Y
    np.testing.assert_allclose(model.transform(Yq[ok]), naive, rtol=0, atol=1e-10 * np.abs(Y).max())


# ------------------------------------- docs/oracles.md#oracle-permutation-invariance
@pytest.mark.parametrize("seed", [0, 1])
def test_oracle10_permutation_invariance(seed):
    """docs/oracles.md#oracle-permutation-invariance: shuffling the rows of Y leaves A_{Y,n}(y)
    (and λ*) unchanged."""
    rng = np.random.default_rng(10 + seed)
    Y = _data(seed, N=80, p=12)
    perm = rng.permutation(len(Y))
    a = KAHM(n_components=4).fit(Y)
    b = KAHM(n_components=4).fit(Y[perm])
    assert b.lambda_ == pytest.approx(a.lambda_, rel=1e-12)
    near, far = _near_far(Y, rng, 100, 100)
    Yq = np.vstack([near, far])
    np.testing.assert_allclose(b.transform(Yq), a.transform(Yq), rtol=0, atol=1e-10 * np.abs(Y).max())
    np.testing.assert_allclose(b.training_error_, a.training_error_, rtol=1e-10)


# ------------------------------------------- docs/oracles.md#oracle-basis-invariance
@pytest.mark.parametrize("kind", ["orthogonal", "signs"])
def test_oracle11_basis_invariance_reference(fitted, kind):
    """docs/oracles.md#oracle-basis-invariance: with P → QP (random orthogonal Q, or sign flips),
    the kernel matrix built in the test from the QP-codes (θ = covariance of QPy, eq. 36, full
    Mahalanobis metric), λ* from solve_lambda, and the explicit images all equal the model's."""
    Y, model, _, _ = fitted
    n = model.n_components_
    rng = np.random.default_rng(11)
    Q = ortho_group.rvs(n, random_state=rng) if kind == "orthogonal" else np.diag(rng.choice([-1.0, 1.0], n))
    assert not np.allclose(Q, np.eye(n))
    P = Q @ model.components_
    K, codes = kahm_reference(Y, P)
    # K from the model's own whitened codes
    K_model = np.exp(-sq_dists(model.codes_, model.codes_) / (2 * n))
    np.testing.assert_allclose(K, K_model, rtol=0, atol=1e-12)
    lam = solve_lambda(K, Y).lambda_star
    assert lam == pytest.approx(model.lambda_, rel=1e-12)
    near, far = _near_far(Y, rng, 100, 100)
    Yq = np.vstack([near, far])
    D2 = sq_dists(codes(Yq), codes(Y))
    Kq = np.exp(-(D2 - D2.min(axis=1, keepdims=True)) / (2 * n))
    np.testing.assert_allclose(
        explicit_images(K, lam, Kq, Y), model.transform(Yq), rtol=0, atol=1e-9 * np.abs(Y).max()
    )


def test_oracle11_sign_flips_in_fit(monkeypatch, fitted):
    """docs/oracles.md#oracle-basis-invariance through the fitting code: flipping the signs of the
    principal directions returned by the PCA (the SVD sign ambiguity) changes neither λ* nor the
    images."""
    Y, model, _, _ = fitted
    signs = np.array([-1.0, 1.0, -1.0, -1.0])
    original = kahm_module.principal_subspace

    def flipped(Yd, n_max, min_range=1e-3):
        sub = original(Yd, n_max, min_range)
        d = sub.directions * signs[: sub.n_cap, None]
        return PrincipalSubspace(sub.mean, d, sub.variances)

    monkeypatch.setattr(kahm_module, "principal_subspace", flipped)
    other = KAHM(n_components=4).fit(Y)
    np.testing.assert_array_equal(other.components_, model.components_ * signs[:, None])
    assert other.lambda_ == pytest.approx(model.lambda_, rel=1e-12)
    rng = np.random.default_rng(111)
    Yq = np.vstack(_near_far(Y, rng, 50, 50))
    np.testing.assert_allclose(other.transform(Yq), model.transform(Yq), rtol=0, atol=1e-10 * np.abs(Y).max())


# --------------------------------------------- docs/oracles.md#oracle-theorem-bounds
def test_oracle12_theorems_2_and_3(fitted):
    """docs/oracles.md#oracle-theorem-bounds: at 1000 near + far queries,
    ‖A(y)‖ < ‖Y‖₂(λ*+μ_max)/(λ*+μ_min) (Thm 2) and
    Γ(y) < (λ*+μ_max)/(λ*+μ_min)·‖[y − y^i]_i‖₂ (Thm 3); both below 1 + pN²/(2‖Y‖_F²)."""
    Y, model, K, _ = fitted
    N, p = Y.shape
    rng = np.random.default_rng(12)
    near, far = _near_far(Y, rng, 500, 300)
    mid = Y.mean(axis=0) + 3 * Y.std() * rng.normal(size=(200, p))
    Yq = np.vstack([near, mid, far])
    assert len(Yq) == 1000
    mu = np.linalg.eigvalsh(K)
    lam = model.lambda_
    ratio = (lam + mu.max()) / (lam + mu.min())
    assert ratio < 1 + p * N**2 / (2 * np.sum(Y**2))
    img, gam = model.transform_with_distance(Yq)
    assert np.all(np.linalg.norm(img, axis=1) < np.linalg.norm(Y, 2) * ratio)
    diff_norms = np.array([np.linalg.norm(y - Y, 2) for y in Yq])  # ‖[y − y^1 … y − y^N]‖₂
    assert np.all(gam < ratio * diff_norms)
    np.testing.assert_allclose(gam, np.linalg.norm(Yq - img, axis=1), rtol=1e-14)


# ------------------------------------------ docs/oracles.md#oracle-distance-monotone
def test_oracle13_distance_monotonicity_on_blob():
    """docs/oracles.md#oracle-distance-monotone: Γ at held-out blob points is smaller than Γ at
    points 10σ away from the centre, for at least 99% of (held-out, far) pairs."""
    rng = np.random.default_rng(13)
    p, sigma = 5, 1.0
    centre = rng.normal(size=p) * 3
    train = centre + sigma * rng.normal(size=(200, p))
    held = centre + sigma * rng.normal(size=(100, p))
    u = rng.normal(size=(100, p))
    far = centre + 10 * sigma * u / np.linalg.norm(u, axis=1, keepdims=True)
    model = KAHM(n_components=3).fit(train)
    g_in, g_out = model.distance(held), model.distance(far)
    assert np.mean(g_in[:, None] < g_out[None, :]) >= 0.99


# ------------------------------------- docs/oracles.md#oracle-batch-chunk-invariance
def test_oracle14_batch_one_by_one_and_chunks(fitted):
    """docs/oracles.md#oracle-batch-chunk-invariance: batch = one-by-one evaluation and
    chunk_size=7 = unchunked, to 1e-12·max|Y| (images) — for near and far queries."""
    Y, model, _, _ = fitted
    rng = np.random.default_rng(14)
    Yq = np.vstack(_near_far(Y, rng, 40, 23))
    tol = 1e-12 * np.abs(Y).max()
    img, gam = model.transform_with_distance(Yq)
    single = np.vstack([model.transform(Yq[i : i + 1]) for i in range(len(Yq))])
    single_g = np.concatenate([model.distance(Yq[i : i + 1]) for i in range(len(Yq))])
    np.testing.assert_allclose(single, img, rtol=0, atol=tol)
    np.testing.assert_allclose(single_g, gam, rtol=0, atol=tol)
    chunked = KAHM(n_components=4, chunk_size=7).fit(Y)
    big = KAHM(n_components=4, chunk_size=10_000).fit(Y)
    img7, gam7 = chunked.transform_with_distance(Yq)
    imgb, gamb = big.transform_with_distance(Yq)
    np.testing.assert_allclose(img7, imgb, rtol=0, atol=tol)
    np.testing.assert_allclose(gam7, gamb, rtol=0, atol=tol)
    np.testing.assert_allclose(imgb, img, rtol=0, atol=tol)


# ----------------------------------------------------- docs/oracles.md#oracle-guards
def test_cap_n_at_N_minus_1_and_p():
    """docs/oracles.md#oracle-guards (docs/algorithm.md#kahm-guards): n ≤ N − 1 and n ≤ p."""
    rng = np.random.default_rng(33)
    m = KAHM(n_components=20).fit(rng.normal(size=(5, 10)))
    assert m.n_components_ == 4
    assert m.components_.shape == (4, 10) and m.codes_.shape == (5, 4)
    m = KAHM(n_components=10).fit(rng.normal(size=(50, 3)))
    assert m.n_components_ == 3
    assert m.components_.shape == (3, 3)
    m = KAHM(n_components=2).fit(rng.normal(size=(50, 3)))
    assert m.n_components_ == 2


@pytest.mark.parametrize("scale", [100.0, 1e8])
def test_cap_relative_eigenvalue_threshold(scale):
    """docs/oracles.md#oracle-guards (docs/decisions.md#decision-eigenvalue-cap): rank-3 data on a
    large scale keep only the true rank (min_range disabled, so the eigenvalue cap alone decides).
    At scale 1e8 the round-off eigenvalues exceed the absolute ε_mach, so only the relative
    threshold ε_mach·max(1, σ₁) rejects them."""
    rng = np.random.default_rng(3)
    Y = scale * (rng.uniform(size=(60, 3)) @ rng.uniform(size=(3, 8))) + scale
    sig = np.linalg.svd(Y - Y.mean(axis=0), compute_uv=False) ** 2 / 59
    if scale == 1e8:
        assert sig[3] > EPS  # an absolute threshold would keep a 4th direction
    m = KAHM(n_components=8, min_range=None).fit(Y)
    assert m.n_components_ == 3
    assert principal_subspace(Y, 8, None).n_cap == 3
    assert np.all(np.isfinite(m.transform(Y[:5] + 1.0)))


def test_min_range_rule_lowers_n():
    """docs/oracles.md#oracle-guards (docs/algorithm.md#kahm-guards): n ← j − 1 for the first code
    coordinate j whose range is below min_range=1e-3 (absolute); min_range=None keeps it."""
    rng = np.random.default_rng(31)
    G = rng.normal(size=(80, 5))
    Y = G * np.array([10.0, 5.0, 1e-5, 1e-6, 1e-7])  # third principal coordinate: range ~1e-4
    codes = (Y - Y.mean(0)) @ np.linalg.svd(Y - Y.mean(0), full_matrices=False)[2].T
    assert np.ptp(codes[:, 2]) < 1e-3 and np.ptp(codes[:, 1]) > 1e-3
    assert KAHM(n_components=4).fit(Y).n_components_ == 2
    assert KAHM(n_components=4, min_range=None).fit(Y).n_components_ == 4
    r = np.ptp(codes, axis=0)
    assert r[3] < r[2]
    # a threshold between the 4th and the 3rd range keeps exactly 3 coordinates
    assert KAHM(n_components=4, min_range=float(np.sqrt(r[2] * r[3]))).fit(Y).n_components_ == 3


def test_min_range_floor_is_one():
    """docs/oracles.md#oracle-guards (docs/decisions.md#decision-rank-floor): if even the first
    coordinate's range is below 1e-3 (but σ₁ passes the eigenvalue cap), n = 1, not 0; the model
    still maps into the hull."""
    rng = np.random.default_rng(32)
    Y = 1e-6 * rng.normal(size=(40, 4)) + 0.25
    sub = principal_subspace(Y, 4)
    assert sub.n_cap == 1
    m = KAHM(n_components=4).fit(Y)
    assert m.n_components_ == 1
    out = m.transform(Y[:10] + 1e-6)
    assert np.all(np.isfinite(out))
    assert np.abs(out - 0.25).max() < 1e-4


@pytest.mark.parametrize(
    "Y",
    [np.tile([1.0, -2.0, 3.0], (10, 1)), np.array([[0.5, 2.0, -1.0]]), np.zeros((7, 3))],
    ids=["equal-rows", "N=1", "all-zero"],
)
def test_rank0_data_map_to_mean(Y):
    """docs/oracles.md#oracle-guards (docs/decisions.md#decision-rank-zero): all rows equal,
    or N = 1 → n_components_ = 0, and transform returns the mean for any query (near or far);
    Γ(y) = ‖y − ȳ‖."""
    m = KAHM(n_components=3).fit(Y)
    assert m.n_components_ == 0
    assert m.components_.shape == (0, 3)
    rng = np.random.default_rng(0)
    Yq = np.vstack([Y[:1], rng.normal(size=(5, 3)), 1e6 * rng.normal(size=(5, 3))])
    img, gam = m.transform_with_distance(Yq)
    scale = max(np.abs(Y).max(), 1.0)
    np.testing.assert_allclose(img, np.broadcast_to(Y.mean(axis=0), img.shape), rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(gam, np.linalg.norm(Yq - Y.mean(axis=0), axis=1), rtol=1e-12, atol=1e-12 * scale)
    assert m.training_error_ <= 1e-12 * scale * len(Y)


# --------------------------------------------------------------------------- training images
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_transform_equals_transform_and_training_error(seed):
    """docs/oracles.md#oracle-guards (docs/algorithm.md#training-images): fit_transform
    (H-formula) = fit().transform on the training rows to 1e-10·scale; training_error_ r = Σ_i
    Γ(y^i) to 1e-9 relative."""
    Y = _data(seed, N=90, p=12) * (1 + seed)
    a = KAHM(n_components=5)
    ft = a.fit_transform(Y)
    b = KAHM(n_components=5).fit(Y)
    scale = np.abs(Y).max()
    np.testing.assert_allclose(ft, b.transform(Y), rtol=0, atol=1e-10 * scale)
    assert a.training_error_ == pytest.approx(b.distance(Y).sum(), rel=1e-9)
    assert a.training_error_ > 0


# ------------------------------------------- docs/oracles.md#oracle-guards (denominator guard)
def test_denominator_guard(fitted):
    """docs/oracles.md#oracle-guards (docs/algorithm.md#denominator-guard,
    docs/decisions.md#decision-denominator-guard): a query whose weight sum |Σ h^i| is below
    1e-12·max_i|B_{i,p}| gets Γ = +inf, a NaN image and a DegenerateWeightsWarning; other rows are
    unaffected. The case is built by projecting the denominator weights B[:, p] orthogonal to that
    query's (shifted) kernel row."""
    Y, fitted_model, _, _ = fitted
    model = KAHM(n_components=4).fit(Y)
    p = Y.shape[1]
    rng = np.random.default_rng(34)
    Yq = np.vstack(_near_far(Y, rng, 5, 2))
    Zq = (Yq - model.mean_) @ model.whitening_
    kq = shifted_query_kernel(Zq[2:3], model.codes_, model.codes_sq_norms_, model.n_components_)[0]
    beta = model.beta_.copy()
    b = beta[:, p]
    beta[:, p] = b - (kq @ b) / (kq @ kq) * kq
    assert abs(kq @ beta[:, p]) < 1e-12 * np.abs(beta[:, p]).max()  # precondition
    model.beta_ = beta
    with pytest.warns(DegenerateWeightsWarning, match="1 query row"):
        img, gam = model.transform_with_distance(Yq)
    assert gam[2] == np.inf
    assert np.all(np.isnan(img[2]))
    others = np.arange(len(Yq)) != 2
    assert np.all(np.isfinite(gam[others])) and np.all(np.isfinite(img[others]))
    with pytest.warns(DegenerateWeightsWarning):
        assert np.all(np.isnan(model.transform(Yq[2:3])))
    # the unmodified model gives a finite result for the same row, silently
    with warnings.catch_warnings():
        warnings.simplefilter("error", DegenerateWeightsWarning)
        assert np.isfinite(fitted_model.distance(Yq[2:3]))[0]


# --------------------------------------------------------------------------- validation
def test_input_1d_raises():
    """1-D input is rejected with a message naming the expected 2-D shape."""
    with pytest.raises(ValueError, match="2-D array"):
        KAHM(2).fit(np.arange(10.0))


@pytest.mark.parametrize("bad,match", [(np.nan, "NaN"), (np.inf, "infinity")])
def test_input_nonfinite_raises(bad, match):
    """NaN / inf in training data or queries raise ValueError naming the value."""
    Y = np.random.default_rng(0).normal(size=(20, 3))
    Y[4, 1] = bad
    with pytest.raises(ValueError, match=match):
        KAHM(2).fit(Y)
    model = KAHM(2).fit(np.random.default_rng(1).normal(size=(20, 3)))
    with pytest.raises(ValueError, match=match):
        model.transform(Y)


@pytest.mark.parametrize(
    "value,exc",
    [(0, ValueError), (-3, ValueError), (2.0, TypeError), (2.5, TypeError), (True, TypeError)],
)
def test_invalid_n_components_raises(value, exc):
    """n_components must be an int >= 1 (the table's rule; 0, negative, float and bool raise
    scikit-learn's InvalidParameterError, both a ValueError and a TypeError)."""
    with pytest.raises(exc, match="'n_components' parameter of KAHM must be an int >= 1"):
        KAHM(n_components=value).fit(np.random.default_rng(0).normal(size=(20, 3)))


@pytest.mark.parametrize("reg", [0.0, -1.0, np.inf])
def test_invalid_regularization_raises(reg):
    """The forced λ (override hook) must be a finite number > 0."""
    with pytest.raises(ValueError, match="regularization"):
        KAHM(2, regularization=reg).fit(np.random.default_rng(0).normal(size=(20, 3)))


def test_wrong_feature_count_raises():
    """Queries with another feature count than the training data raise ValueError."""
    model = KAHM(2).fit(np.random.default_rng(0).normal(size=(20, 3)))
    with pytest.raises(ValueError, match="X has 4 features, but KAHM is expecting 3 features"):
        model.transform(np.zeros((2, 4)))
    with pytest.raises(ValueError, match="features"):
        model.distance(np.zeros((2, 2)))


def test_unfitted_raises():
    """Using an unfitted model raises NotFittedError."""
    with pytest.raises(NotFittedError, match="KAHM instance is not fitted yet"):
        KAHM(2).transform(np.zeros((2, 3)))
    with pytest.raises(NotFittedError, match="not fitted yet"):
        KAHM(2).distance(np.zeros((2, 3)))


def test_non_numeric_raises():
    """Non-numeric data raise TypeError."""
    with pytest.raises(TypeError, match="must hold numbers"):
        KAHM(2).fit(np.array([["a", "b"], ["c", "d"]]))
