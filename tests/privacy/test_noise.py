"""The release mechanism of kahm_dask.privacy.noise: exact discrete Laplace noise on a public grid.

Property tests of the samplers (law by chi-square, fast path against the exact rational path,
exact Bernoulli), of the accounting (``laplace_ratio`` in exact arithmetic, ``epsilon_used``,
the pmf ratio of neighbouring grid indices, the sensitivity of the grid index), and of the
release (public grid, clipping, dtype, bounded memory, chunk-invariant reproducible noise,
fresh secure noise). See docs/privacy.md for the mechanism.
"""

from __future__ import annotations

import math
import pickle
import tracemalloc
import warnings
from decimal import Decimal, localcontext
from fractions import Fraction
from itertools import pairwise

import numpy as np
import pytest
from scipy import stats

import kahm_dask.privacy.noise as noise_mod
from kahm_dask.privacy.noise import (
    BLOCK_ROWS,
    DEFAULT_RESOLUTION,
    GridLaplace,
    bernoulli,
    discrete_laplace,
    geometric,
    laplace_ratio,
)
from kahm_dask.privacy.randomness import (
    InsecureSeededRandom,
    PrivacyLeakWarning,
    SecureRandom,
    as_noise_source,
)

DIGITS_RATIO = laplace_ratio(2.0, DEFAULT_RESOLUTION + 1)  # the ratio of a digits fit at ε = 2


def _seeded(seed: int) -> InsecureSeededRandom:
    """A reproducible source for law tests (its PrivacyLeakWarning is expected here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        return InsecureSeededRandom(seed)


class ScriptedSource:
    """Hands out the scripted words first, then words of a seeded generator; records all."""

    reproducible = True

    def __init__(self, script=(), seed: int = 0) -> None:
        self.script = [int(w) for w in script]
        self.rng = np.random.default_rng(seed)
        self.given: list[int] = []

    def words(self, n: int) -> np.ndarray:
        take, self.script = self.script[:n], self.script[n:]
        rest = self.rng.integers(0, 2**64, size=n - len(take), dtype=np.uint64, endpoint=False)
        out = np.concatenate([np.array(take, dtype=np.uint64), rest])
        self.given += [int(w) for w in out]
        return out

    def for_block(self, block: int) -> ScriptedSource:
        return self


def _high_precision_exp(x: Fraction, digits: int = 60) -> Decimal:
    with localcontext() as ctx:
        ctx.prec = digits
        return (Decimal(x.numerator) / Decimal(x.denominator)).exp()


def _exceeds_exp(value: Fraction, x: Fraction) -> bool:
    """``value ≥ exp(x)`` decided with a 60-digit exp (its error is far below a float's ulp)."""
    with localcontext() as ctx:
        ctx.prec = 80
        e = _high_precision_exp(x)
        return Decimal(value.numerator) / Decimal(value.denominator) >= e * (1 + Decimal(10) ** -55)


# ---------------------------------------------------------------------------------------------
# the discrete Laplace law, by chi-square
# ---------------------------------------------------------------------------------------------


def _dl_cdf(z: np.ndarray, r: float) -> np.ndarray:
    """P(Z ≤ z) of P(Z = z) = (1 − r)/(1 + r) r^|z| (z integer)."""
    c = (1 - r) / (1 + r)
    z = np.asarray(z, dtype=np.float64)
    return np.where(z < 0, c * r ** (-z) / (1 - r), 1 - c * r ** (z + 1) / (1 - r))


def _chi2_pvalue(samples: np.ndarray, r: float, n_bins: int = 40) -> float:
    """Chi-square p-value of integer samples against the discrete Laplace law of ratio r, on
    about n_bins bins of equal probability (integer edges, fixed before looking at the data)."""
    z_max = int(math.ceil(math.log(1e-12) / math.log(r))) + 1
    zs = np.arange(-z_max, z_max + 1)
    cdf = _dl_cdf(zs, r)
    edges = zs[np.unique(np.searchsorted(cdf, np.linspace(0, 1, n_bins + 1)[1:-1]))]
    probs = np.diff(np.concatenate([[0.0], _dl_cdf(edges, r), [1.0]]))
    observed = np.bincount(np.searchsorted(edges, samples, side="left"), minlength=probs.size)
    assert observed.size == probs.size and probs.min() > 0
    return float(stats.chisquare(observed, probs * samples.size).pvalue)


@pytest.mark.parametrize("ratio", [0.5, 0.9, DIGITS_RATIO])
def test_discrete_laplace_law_chi_square(ratio):
    z = discrete_laplace(1_000_000, ratio, _seeded(11))
    assert z.dtype == np.int64 and z.shape == (1_000_000,)
    assert _chi2_pvalue(z, ratio) > 1e-3
    # the check has power: the same draws fail against a slightly wider law
    assert _chi2_pvalue(z, ratio + 0.02 * (1 - ratio)) < 1e-6


@pytest.mark.parametrize("ratio", [0.5, 0.9, DIGITS_RATIO])
def test_geometric_law_chi_square(ratio):
    g = geometric(1_000_000, ratio, _seeded(12))
    assert g.min() >= 0
    # P(G = g) = (1 − r) r^g, compared on bins of roughly equal probability
    quantiles = np.log1p(-np.linspace(0, 1, 41)[1:-1]) / math.log(ratio)
    edges = np.unique(np.floor(quantiles).astype(np.int64))
    cdf = 1 - ratio ** (edges.astype(np.float64) + 1)
    probs = np.diff(np.concatenate([[0.0], cdf, [1.0]]))
    observed = np.bincount(np.searchsorted(edges, g, side="left"), minlength=probs.size)
    assert stats.chisquare(observed, probs * g.size).pvalue > 1e-3


@pytest.mark.parametrize("ratio, n", [(0.5, 200_000), (0.9, 100_000)])
def test_exact_slow_path_has_the_same_law(ratio, n):
    """margin_rel=1.0 sends every draw through the exact rational comparisons."""
    z = discrete_laplace(n, ratio, _seeded(13), margin_rel=1.0)
    assert _chi2_pvalue(z, ratio, n_bins=30) > 1e-3


@pytest.mark.parametrize("ratio, n", [(0.5, 100_000), (0.9, 30_000), (DIGITS_RATIO, 300)])
def test_fast_path_equals_exact_path_draw_for_draw(ratio, n):
    """Both paths read the same first word per draw; where the fast path is sure, the exact
    path needs no more bits and must find the same G (else the fast path's margin is wrong)."""
    fast = geometric(n, ratio, _seeded(14))
    exact = geometric(n, ratio, _seeded(14), margin_rel=1.0)
    np.testing.assert_array_equal(fast, exact)


def _assert_exact_geometric(N: int, B: int, g: int, ratio: float) -> None:
    """U in (N/2^B, (N+1)/2^B] and G = g mean exactly r^(g+1) < U ≤ r^g for every such U."""
    r = Fraction(ratio)
    assert Fraction(N + 1, 2**B) <= r**g
    assert Fraction(N, 2**B) >= r ** (g + 1)


@pytest.mark.parametrize("ratio, n", [(0.5, 400), (0.9, 200), (DIGITS_RATIO, 60)])
def test_fast_path_results_are_exact_in_rationals(ratio, n):
    src = ScriptedSource(seed=15)
    g = geometric(n, ratio, src)
    assert len(src.given) == n  # no draw needed more bits
    for word, gi in zip(src.given, g, strict=True):
        _assert_exact_geometric(word, 64, int(gi), ratio)


@pytest.mark.parametrize("ratio", [0.5, 0.9, DIGITS_RATIO])
@pytest.mark.parametrize("first", [0, 1, 2**20, 2**40 - 1, 2**63, 2**64 - 1])
def test_exact_path_on_extreme_words(ratio, first):
    """Tiny U (first word below 2**40: more bits drawn) and U next to 1, decided exactly."""
    src = ScriptedSource([first], seed=first % 1000)
    (g,) = geometric(1, ratio, src)
    N, B = 0, 0
    for w in src.given:  # U's bits: the first word, then each refinement
        N, B = (N << 64) | w, B + 64
    _assert_exact_geometric(N, B, int(g), ratio)
    if first < 2**40:
        assert len(src.given) >= 2


def test_geometric_rejects_bad_ratio():
    for bad in (0.0, 1.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="ratio"):
            geometric(3, bad, _seeded(0))


# ---------------------------------------------------------------------------------------------
# exact Bernoulli
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.3, 0.25, 1e-5])
def test_bernoulli_law(p):
    n = 1_000_000
    k = int(bernoulli(n, p, _seeded(16)).sum())
    assert abs(k - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1


def test_bernoulli_zero_never_fires():
    assert not bernoulli(100_000, 0.0, _seeded(0)).any()


@pytest.mark.parametrize("p", [1e-5, 1 / 3 * 2**-20, 0.1 * 2**-11])
@pytest.mark.parametrize("second", [0, 2**63, 2**64 - 1, None])
def test_bernoulli_non_dyadic_at_64_bits_is_decided_exactly(p, second):
    """p·2^64 not an integer: the word ⌊p·2^64⌋ leaves U ≤ p open; more bits decide it, and
    the answer is the exact comparison of U's interval with p."""
    num, den = Fraction(p).numerator, Fraction(p).denominator
    assert (num << 64) % den != 0  # p has bits beyond the 64th
    below = (num << 64) // den
    script = [below] if second is None else [below, second]
    src = ScriptedSource(script, seed=17)
    (out,) = bernoulli(1, p, src)
    N, B = 0, 0
    for w in src.given:
        N, B = (N << 64) | w, B + 64
    assert B >= 128
    if out:
        assert Fraction(N + 1, 2**B) <= Fraction(p)
    else:
        assert Fraction(N, 2**B) >= Fraction(p)
    # the neighbouring words are decided from the first 64 bits alone
    for word, expected in ((below - 1, True), (below + 1, False)):
        src = ScriptedSource([word])
        assert bool(bernoulli(1, p, src)[0]) is expected and len(src.given) == 1


def test_bernoulli_dyadic_boundary_word():
    """p·2^64 an integer m: U in (m/2^64, (m+1)/2^64] is above p, U of word m − 1 is not."""
    p = 0.25
    m = 2**62
    assert bool(bernoulli(1, p, ScriptedSource([m]))[0]) is False
    assert bool(bernoulli(1, p, ScriptedSource([m - 1]))[0]) is True


# ---------------------------------------------------------------------------------------------
# accounting: the ratio, ε used, the pmf ratio of neighbours, the grid index's sensitivity
# ---------------------------------------------------------------------------------------------


_EPS_VALUES = [1e-3, 0.1, 0.5, 1.0, 2.0, math.pi, 8.0, 30.0] + list(
    np.random.default_rng(18).uniform(0.01, 10.0, 12)
)


@pytest.mark.parametrize("k", [1, 2, 1025, 4097])
def test_laplace_ratio_is_an_exact_upper_bound(k):
    for eps in _EPS_VALUES:
        r = laplace_ratio(eps, k)
        assert 0.0 < r < 1.0
        assert _exceeds_exp(Fraction(r), -Fraction(eps) / k), (eps, k)
        # and it is tight: a few ulps above, so no privacy budget is wasted
        assert r <= math.exp(-eps / k) * (1 + 1e-15)


@pytest.mark.parametrize("eps", [0.01, 0.5, 2.0, 9.0])
@pytest.mark.parametrize("resolution", [1, 16, 1024])
def test_epsilon_used_at_most_epsilon(eps, resolution):
    mech = GridLaplace(eps, np.zeros(2), np.ones(2), resolution=resolution)
    assert mech.sensitivity_steps == resolution + 1
    assert mech.epsilon_used <= eps
    assert mech.epsilon_used == pytest.approx(eps, rel=1e-12)
    # exactly: r^Δ ≥ exp(−ε), i.e. Δ·ln(1/r) ≤ ε
    assert _exceeds_exp(Fraction(mech.ratio) ** mech.sensitivity_steps, -Fraction(eps))


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_pmf_ratio_of_neighbouring_grid_indices(eps):
    """q and q' = q + Δ (Δ = 1025 steps, the most one change of d can move q): the pmf of
    q + Z and of q' + Z differ by at most e^ε at every output v, exactly."""
    mech = GridLaplace(eps, np.zeros(1), np.ones(1))
    delta_steps = mech.sensitivity_steps
    r = Fraction(mech.ratio)
    c = (1 - r) / (1 + r)
    q, q2 = 0, delta_steps
    v = np.arange(-4 * delta_steps, 5 * delta_steps + 1)
    # log P(q+Z=v) − log P(q'+Z=v) = (|v − q'| − |v − q|)·ln r: an integer exponent per v
    exponents = np.abs(v - q2) - np.abs(v - q)
    assert exponents.min() == -delta_steps and exponents.max() == delta_steps  # reached
    assert np.all(np.abs(exponents) <= delta_steps)  # everywhere (outside too: constant)
    worst = r ** (-delta_steps)  # the largest ratio, exactly
    assert _exceeds_exp(1 / worst, -Fraction(eps))  # r^Δ ≥ e^-ε, i.e. the ratio ≤ e^ε
    # the pmf itself, exactly, at a few outputs (positive everywhere)
    for vi in (-3000, -1, 0, 1, 512, 1025, 1026, 6000):
        p1, p2 = c * r ** abs(vi - q), c * r ** abs(vi - q2)
        assert p1 > 0 and p2 > 0
        assert max(p1 / p2, p2 / p1) <= worst


def test_pmf_with_delta_atom_satisfies_eps_delta():
    """With δ > 0: P(v) ≤ e^ε P'(v) except at the atom v = q, where the excess is ≤ δ
    (the hockey-stick divergence is at most δ)."""
    eps, delta = 1.0, 0.05
    mech = GridLaplace(eps, np.zeros(1), np.ones(1), delta=delta)
    r, D = mech.ratio, mech.sensitivity_steps
    c = (1 - r) / (1 + r)
    v = np.arange(-20 * D, 21 * D)
    for q, q2 in ((0, D), (D, 0)):
        p = (1 - delta) * c * r ** np.abs(v - q) + delta * (v == q)
        p2 = (1 - delta) * c * r ** np.abs(v - q2) + delta * (v == q2)
        excess = np.maximum(p - math.exp(eps) * p2, 0.0)
        assert excess.sum() <= delta * (1 + 1e-9)
        assert excess[v != q].max() <= 1e-15
        assert excess.sum() > 0.5 * delta  # the atom does need δ: pure ε-DP fails


@pytest.mark.parametrize("resolution", [1, 7, 1024])
def test_grid_index_moves_at_most_k_plus_one_steps(resolution):
    rng = np.random.default_rng(resolution)
    n, p = 20_000, 6
    lower = rng.uniform(-50, 50, p)
    width = np.exp(rng.uniform(-8, 8, p))
    d = width * np.where(rng.random(p) < 0.5, 1.0, rng.uniform(0.01, 1.0, p))
    mech = GridLaplace(1.0, lower, lower + width, d=d, resolution=resolution)
    x = lower + width * rng.uniform(-0.5, 1.5, (n, p))  # also outside the bounds
    u = rng.uniform(-1, 1, (n, p))
    u = np.where(rng.random((n, p)) < 0.3, np.sign(u), u)  # 30 % change by exactly ±d
    x2 = x + u * d
    moved = np.abs(mech.grid_index(x) - mech.grid_index(x2))
    assert moved.max() <= resolution + 1
    assert moved.max() >= resolution  # a change of exactly d does move q by k
    q = mech.grid_index(x)
    assert q.min() == 0 and np.all(q.max(axis=0) == np.rint(width / mech.step))  # clipped


# ---------------------------------------------------------------------------------------------
# the release
# ---------------------------------------------------------------------------------------------


def _grey_levels(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 17, (n, 8)) / 16.0


def test_release_is_on_the_public_grid_and_q_plus_z():
    mech = GridLaplace(2.0, np.full(8, -0.5), np.full(8, 1.5), d=1.0)
    X = _grey_levels(3000, 0)
    X_copy = X.copy()
    out = mech.release(X, _seeded(1))
    np.testing.assert_array_equal(X, X_copy)  # input untouched
    assert out.shape == X.shape and out.dtype == np.float64
    j = np.rint((out - mech.lower) / mech.step).astype(np.int64)
    np.testing.assert_array_equal(mech.lower + j * mech.step, out)  # exactly on the grid
    np.testing.assert_array_equal(j - mech.grid_index(X), mech.noise_steps(3000, _seeded(1)))


def test_release_depends_on_x_only_through_its_grid_index():
    """Two values in the same grid cell give bit-identical releases under the same noise:
    no bit of the output carries the private float beyond its grid index."""
    mech = GridLaplace(1.0, np.zeros(8), np.ones(8))
    X = _grey_levels(500, 2)
    X2 = np.clip(X + np.random.default_rng(3).uniform(-0.3, 0.3, X.shape) * mech.step, 0, 1)
    np.testing.assert_array_equal(mech.grid_index(X), mech.grid_index(X2))
    assert mech.release(X, _seeded(4)).tobytes() == mech.release(X2, _seeded(4)).tobytes()


def test_release_clips_to_the_bounds():
    mech = GridLaplace(1.0, np.zeros(3), np.ones(3))
    X = np.array([[1600.0, -7.0, 0.5]] * 50)
    clipped = np.array([[1.0, 0.0, 0.5]] * 50)
    assert mech.release(X, _seeded(5)).tobytes() == mech.release(clipped, _seeded(5)).tobytes()


def test_release_dtype_float32():
    mech = GridLaplace(2.0, np.zeros(8), np.ones(8))
    X = _grey_levels(1000, 6).astype(np.float32)
    out32 = mech.release(X, _seeded(7), dtype=np.float32)
    assert out32.dtype == np.float32 and out32.shape == X.shape
    out64 = mech.release(X, _seeded(7))
    np.testing.assert_array_equal(out32, out64.astype(np.float32))
    # step 2^-10 and lower 0: the float32 grid is exact here
    np.testing.assert_array_equal(out32.astype(np.float64), out64)


def test_release_noise_law_with_delta():
    mech = GridLaplace(1.0, np.zeros(10), np.ones(10), delta=0.3)
    z = mech.noise_steps(100_000, _seeded(8)).ravel()
    c = (1 - mech.ratio) / (1 + mech.ratio)
    zero = np.count_nonzero(z == 0)
    p0 = 0.3 + 0.7 * c
    assert abs(zero - z.size * p0) <= 5 * math.sqrt(z.size * p0 * (1 - p0))
    # the rest follows the discrete Laplace law (restricted to z ≠ 0)
    nz = z[z != 0]
    assert abs(np.mean(nz > 0) - 0.5) <= 5 * math.sqrt(0.25 / nz.size)
    assert np.abs(nz).mean() == pytest.approx(1 / (1 - mech.ratio), rel=0.02)  # E[|Z| | Z ≠ 0]


def test_bounded_memory_steps_keep_shape_and_law(monkeypatch):
    """Noise is drawn in steps of ENTRIES_PER_STEP entries: with a small step the release
    has the right shape and the right law, and no draw exceeds the step."""
    sizes = []
    real = noise_mod.discrete_laplace

    def spy(n, ratio, source, **kw):
        sizes.append(n)
        return real(n, ratio, source, **kw)

    monkeypatch.setattr(noise_mod, "ENTRIES_PER_STEP", 1000)
    monkeypatch.setattr(noise_mod, "discrete_laplace", spy)
    mech = GridLaplace(0.5, np.zeros(7), np.ones(7), resolution=16)
    X = np.zeros((5000, 7))
    for source in (SecureRandom(), _seeded(9)):
        sizes.clear()
        out = mech.release(X, source)
        assert out.shape == X.shape
        assert max(sizes) <= 1000 and len(sizes) >= 35
        z = np.rint(out / mech.step).astype(np.int64).ravel()
        assert _chi2_pvalue(z, mech.ratio, n_bins=30) > 1e-4


def test_release_memory_is_bounded():
    """A release of 2**22 entries (8 steps) allocates the output plus the work of one step
    (about 40 bytes an entry of the step, kahm_dask.privacy.noise), not arrays the size of the
    data."""
    mech = GridLaplace(2.0, np.zeros(64), np.ones(64))
    X = np.zeros((2**16, 64))
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = mech.release(X)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    extra = peak - out.nbytes
    # 23 MB: less than one float64 array of the data's size (32 MiB)
    assert extra <= 44 * noise_mod.ENTRIES_PER_STEP < X.nbytes, (extra, out.nbytes)


@pytest.mark.parametrize(
    "cuts", [[0, 10_000], [0, 1, 777, 4096, 4097, 8191, 9999, 10_000], [0, 5000, 10_000]]
)
def test_reproducible_source_is_chunk_invariant(cuts):
    mech = GridLaplace(1.0, np.zeros(3), np.ones(3))
    X = np.random.default_rng(10).uniform(size=(10_000, 3))
    whole = mech.release(X, _seeded(2024))
    parts = [mech.release(X[a:b], _seeded(2024), row_offset=a) for a, b in pairwise(cuts)]
    assert np.concatenate(parts).tobytes() == whole.tobytes()
    single = mech.release(X[6543:6544], _seeded(2024), row_offset=6543)
    assert single.tobytes() == whole[6543:6544].tobytes()
    # global row blocks differ from each other, and from another seed
    z = mech.noise_steps(2 * BLOCK_ROWS, _seeded(2024))
    assert not np.array_equal(z[:BLOCK_ROWS], z[BLOCK_ROWS:])
    assert not np.array_equal(z, mech.noise_steps(2 * BLOCK_ROWS, _seeded(2025)))


def test_insecure_source_warns_and_pickles():
    with pytest.warns(PrivacyLeakWarning, match="NOT differentially private"):
        src = InsecureSeededRandom(3)
    with pytest.warns(PrivacyLeakWarning):
        assert isinstance(as_noise_source(3), InsecureSeededRandom)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)  # unpickling does not warn again
        copy = pickle.loads(pickle.dumps(src))
    np.testing.assert_array_equal(copy.words(5), src.words(5))
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(TypeError, match="seed"):
            InsecureSeededRandom(bad)


def test_secure_source_never_repeats():
    src = SecureRandom()
    assert src.reproducible is False and as_noise_source(None) == src
    words = np.concatenate([src.words(50_000), pickle.loads(pickle.dumps(src)).words(50_000)])
    assert words.dtype == np.uint64 and np.unique(words).size == words.size
    assert src.for_block(3) is src
    mech = GridLaplace(2.0, np.zeros(4), np.ones(4))
    X = np.full((2000, 4), 0.5)
    a, b = mech.release(X), mech.release(X)
    assert np.mean(a != b) > 0.99  # fresh noise every release
    assert not np.array_equal(mech.noise_steps(100, src), mech.noise_steps(100, src))


# ---------------------------------------------------------------------------------------------
# parameters and description
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"epsilon": 0.0}, ValueError, "epsilon"),
        ({"epsilon": -1.0}, ValueError, "epsilon"),
        ({"epsilon": np.inf}, ValueError, "epsilon"),
        ({"epsilon": np.nan}, ValueError, "epsilon"),
        ({"epsilon": "1"}, TypeError, "epsilon"),
        ({"delta": -0.1}, ValueError, "delta"),
        ({"delta": 1.0}, ValueError, "delta"),
        ({"delta": "0.1"}, TypeError, "delta"),
        ({"upper": np.zeros(3)}, ValueError, "upper must exceed lower"),
        ({"upper": np.array([1.0, np.inf, 1.0])}, ValueError, "finite"),
        ({"d": 0.0}, ValueError, "d must"),
        ({"d": -2.0}, ValueError, "d must"),
        ({"d": np.inf}, ValueError, "d must"),
        ({"resolution": 0}, ValueError, "resolution"),
    ],
)
def test_parameter_checks(kwargs, error, match):
    args = {"epsilon": 1.0, "lower": np.zeros(3), "upper": np.ones(3)} | kwargs
    with pytest.raises(error, match=match):
        GridLaplace(**args)


@pytest.mark.parametrize(
    "X, match",
    [
        (np.zeros((4, 2)), "shape"),
        (np.zeros(3), "shape"),
        (np.array([[0.0, np.nan, 1.0]]), "finite"),
    ],
)
def test_release_input_checks(X, match):
    with pytest.raises(ValueError, match=match):
        GridLaplace(1.0, np.zeros(3), np.ones(3)).release(X)


def test_delta_accepts_numpy_floats():
    """The classifier accepts any real δ (numpy floats too); so must the mechanism."""
    mech = GridLaplace(np.float32(1.0), np.zeros(2), np.ones(2), delta=np.float32(0.25))
    assert mech.delta == 0.25 and isinstance(mech.delta, float)
    assert mech.describe()["delta"] == 0.25


def test_describe_and_defaults():
    mech = GridLaplace(2.0, np.zeros(3), np.array([1.0, 2.0, 4.0]))
    assert mech.delta == 0.0 and mech.resolution == DEFAULT_RESOLUTION
    np.testing.assert_array_equal(mech.d, [1.0, 2.0, 4.0])  # d defaults to the bound width
    np.testing.assert_array_equal(mech.step, mech.d / 1024)
    info = mech.describe()
    assert info["epsilon"] == 2.0 and info["delta"] == 0.0 and info["epsilon_used"] <= 2.0
    assert info["d"] == [1.0, 2.0, 4.0] and info["lower"] == 0.0
    assert info["sensitivity_steps"] == 1025 and "discrete Laplace" in info["mechanism"]
    assert GridLaplace(2.0, np.zeros(2), np.ones(2), d=0.5).describe()["d"] == 0.5
    assert mech.release(np.zeros((0, 3))).shape == (0, 3)
