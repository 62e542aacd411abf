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
from benchmarks._noise_reference import at_most as old_at_most
from benchmarks._noise_reference import old_exact_path
from kahm_dask.privacy.noise import (
    BLOCK_ROWS,
    DEFAULT_RESOLUTION,
    GridLaplace,
    bernoulli,
    discrete_laplace,
    geometric,
    laplace_ratio,
    smallest_epsilon,
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
# small ε: the exact path by interval arithmetic, its law, its work, and the smallest ε
# ---------------------------------------------------------------------------------------------

SMALL_RATIO = laplace_ratio(1e-6, DEFAULT_RESOLUTION + 1)  # s = −1/ln r ≈ 1.0e9
_COMPARED_RATIOS = [0.5, 0.9, DIGITS_RATIO, laplace_ratio(1e-3, 1025), SMALL_RATIO, 0.6180339887498949]


def _u_bits(words) -> tuple[int, int]:
    """U's bits (N, B) from the words a draw used: the first word, then each refinement."""
    N, B = 0, 0
    for w in words:
        N, B = (N << 64) | int(w), B + 64
    return N, B


def _both_comparisons(N: int, B: int, g: int, ratio: float, seed: int):
    """(decision, N, B, words drawn) of the old rational comparison and of the new one."""
    R, D = ratio.as_integer_ratio()
    old_src, new_src = ScriptedSource(seed=seed), ScriptedSource(seed=seed)
    old = old_at_most(N, B, R**g, D**g, old_src)
    new = noise_mod._at_most_power(N, B, g, ratio, new_src)
    return (*old, old_src.given), (*new, new_src.given)


@pytest.mark.parametrize("ratio", _COMPARED_RATIOS)
def test_interval_comparison_agrees_with_the_rational_one(ratio):
    """U ≤ r^g on random (N, B, g) where R**g is affordable (g ≤ 4000): the same decision and
    the same refinements (the same words drawn), half of the intervals next to r^g."""
    rng = np.random.default_rng(int(ratio * 1e6))
    R, D = ratio.as_integer_ratio()
    for case in range(150):
        B = int(rng.choice([64, 128, 192, 640]))
        g = int(rng.integers(0, 4001))
        if case % 2:
            N = int.from_bytes(rng.bytes(B // 8), "little")  # a uniform B-bit U
        else:  # an interval next to r^g: the floor of r^g·2^B, ±2
            N = min(max((R**g << B) // D**g + int(rng.integers(-2, 3)), 0), 2**B - 1)
        old, new = _both_comparisons(N, B, g, ratio, seed=case)
        assert new == old, (ratio, N, B, g)


@pytest.mark.parametrize("ratio", [DIGITS_RATIO, SMALL_RATIO, 0.9])
@pytest.mark.parametrize("g", [1, 2, 7, 40, 300])
@pytest.mark.parametrize("extra", [0, 11, 64])
def test_interval_comparison_on_an_endpoint(ratio, g, extra):
    """r^g = M/2^(kg) an endpoint of U's interval (B = kg + extra bits): no enclosure of
    positive width decides, only the exact one (here at the first precision: r^g has at most
    B < P bits). Right endpoint: U ≤ r^g for every U; left endpoint: U > r^g. No word drawn."""
    R, D = ratio.as_integer_ratio()
    k = D.bit_length() - 1
    B = k * g + extra
    M = R**g << extra  # r^g = M / 2^B exactly
    for N, expected in ((M - 1, True), (M, False), (M - 2, True), (M + 1, False)):
        old, new = _both_comparisons(N, B, g, ratio, seed=g)
        assert new == old and new[0] is expected and new[3] == [], (N, B, g)


@pytest.mark.parametrize("ratio", [0.9, DIGITS_RATIO, SMALL_RATIO])
def test_interval_comparison_raises_its_precision_when_undecided(ratio, monkeypatch):
    """With the first precision forced down to 64 bits (too little for most intervals) and
    square-and-multiply above it, the comparison must double P until it decides, and still
    give the rational comparison's answers and refinements."""
    monkeypatch.setattr(noise_mod, "_GUARD_BITS", -(10**6))
    monkeypatch.setattr(noise_mod, "_TABLE_PRECISION", 64)
    precisions = []
    real = noise_mod._power_bounds

    def spy(r, g, P):
        precisions.append(P)
        return real(r, g, P)

    monkeypatch.setattr(noise_mod, "_power_bounds", spy)
    R, D = ratio.as_integer_ratio()
    rng = np.random.default_rng(20)
    for case in range(60):
        B, g = int(rng.choice([64, 128])), int(rng.integers(1, min(3000, 30 / -math.log(ratio)) + 1))
        N = min(max((R**g << B) // D**g + int(rng.integers(-2, 3)), 0), 2**B - 1)
        old, new = _both_comparisons(N, B, g, ratio, seed=case)
        assert new == old, (N, B, g)
    assert min(precisions) == 64 and max(precisions) >= 128  # started too low, and doubled


def test_interval_comparison_refines_when_r_power_is_inside():
    """r^g strictly inside U's 64-bit interval (at ε = 1e-6, g ≈ 7·10^8): more bits are drawn,
    exactly as many as the rational comparison needs, and the answer is exact in Decimal."""
    g = 700_000_123
    with localcontext() as ctx:
        ctx.prec = 80
        power = (Decimal(Fraction(SMALL_RATIO).numerator) / Decimal(Fraction(SMALL_RATIO).denominator)).ln() * g
        N = int((power.exp() * 2**64).to_integral_value(rounding="ROUND_FLOOR"))  # r^g in (N, N+1]/2^64
    for seed in range(5):
        src = ScriptedSource(seed=seed)
        ok, N2, B2 = noise_mod._at_most_power(N, 64, g, SMALL_RATIO, src)
        assert B2 >= 128 and len(src.given) == (B2 - 64) // 64 and N2 >> (B2 - 64) == N
        with localcontext() as ctx:
            ctx.prec = 80
            lo, hi = (Decimal(N2) / Decimal(2) ** B2).ln(), (Decimal(N2 + 1) / Decimal(2) ** B2).ln()
            assert (hi <= power) if ok else (lo >= power)
            assert min(abs(hi - power), abs(lo - power)) > Decimal(10) ** -60  # Decimal decides it


_EXTREME_WORDS = [0, 1, 2**20, 2**40 - 1, 2**40, 2**63, 2**64 - 1]


@pytest.mark.parametrize(
    "ratio, script, n",
    [(0.5, _EXTREME_WORDS, 300), (0.9, _EXTREME_WORDS, 300), (DIGITS_RATIO, _EXTREME_WORDS, 300),
     (laplace_ratio(0.1, 1025), _EXTREME_WORDS[4:], 40)],  # ε = 0.1: ~70 ms a draw for the old path
)
def test_exact_path_equals_the_old_exact_path_draw_for_draw(ratio, script, n):
    """Every draw of geometric() through the exact path (margin_rel=1.0), the extreme words
    included: the same G and the same words drawn as the old rational exact path, so a source
    of words gives the same release as before."""
    new_src, old_src = ScriptedSource(script, seed=19), ScriptedSource(script, seed=19)
    new = geometric(n, ratio, new_src, margin_rel=1.0)
    with old_exact_path():
        old = geometric(n, ratio, old_src, margin_rel=1.0)
    np.testing.assert_array_equal(new, old)
    assert new_src.given == old_src.given
    assert len(new_src.given) > n if script[0] < 2**40 else len(new_src.given) >= n  # small words refine


def _dl_cdf_exact(z, r: float) -> np.ndarray:
    """P(Z ≤ z) of the discrete Laplace law of ratio r, in 50-digit Decimal (then rounded):
    r^(−z)/(1 + r) for z < 0 and 1 − r^(z+1)/(1 + r) for z ≥ 0."""
    with localcontext() as ctx:
        ctx.prec = 50
        rd = Decimal(Fraction(r).numerator) / Decimal(Fraction(r).denominator)
        ln_r = rd.ln()

        def one(zi: int) -> float:
            if zi < 0:
                return float((ln_r * -zi).exp() / (1 + rd))
            return float(1 - (ln_r * (zi + 1)).exp() / (1 + rd))

        return np.array([one(int(zi)) for zi in np.atleast_1d(z)])


def test_small_epsilon_law_through_the_exact_path():
    """ε = 1e-6 (s ≈ 1e9), every draw through the exact path: the empirical law against the
    exact cdf. Two checks at fixed levels, on 30 bins of equal probability with integer edges
    chosen before the draws: chi-square at α = 1e-3 (each bin expects ~6 700 draws: the
    asymptotic law is accurate), and the DKW bound sup|F_n − F| ≤ √(ln(2/α)/2n) at α = 1e-6,
    which holds for every law, so a correct sampler fails it with probability ≤ 1e-6. The
    chi-square has power: the same draws fail against a law 2 % wider (p < 1e-6)."""
    n, r = 200_000, SMALL_RATIO
    z = discrete_laplace(n, r, _seeded(21), margin_rel=1.0)
    s = -1.0 / math.log(r)
    # integer edges at the 1/30 … 29/30 quantiles of the continuous approximation (not data)
    qs = np.linspace(0, 1, 31)[1:-1]
    edges = np.floor(np.where(qs < 0.5, s * np.log(2 * qs), -s * np.log(2 * (1 - qs)))).astype(np.int64)
    cdf = _dl_cdf_exact(edges, r)
    probs = np.diff(np.concatenate([[0.0], cdf, [1.0]]))
    observed = np.bincount(np.searchsorted(edges, z, side="left"), minlength=probs.size)
    assert probs.min() > 0.03 and observed.sum() == n
    assert stats.chisquare(observed, probs * n).pvalue > 1e-3
    empirical = np.cumsum(observed)[:-1] / n
    assert np.abs(empirical - cdf).max() <= math.sqrt(math.log(2 / 1e-6) / (2 * n))
    wider = 1 - 1 / (1.02 * s)  # the ratio of a scale 2 % larger
    probs_w = np.diff(np.concatenate([[0.0], _dl_cdf_exact(edges, wider), [1.0]]))
    assert stats.chisquare(observed, probs_w * n).pvalue < 1e-6
    # exact tail: P(|Z| ≥ m) = 2 r^m / (1 + r), at m = s·ln 10 (about 1/10 of the draws)
    m = int(s * math.log(10.0))
    tail = 2 * _dl_cdf_exact([-m], r)[0]
    k = np.count_nonzero(np.abs(z) >= m)
    assert abs(k - n * tail) <= 5 * math.sqrt(n * tail * (1 - tail))


def test_small_epsilon_exact_path_results_are_exact():
    """Each result g of the exact path at ε = 1e-6 satisfies r^(g+1) < U ≤ r^g for every U of
    its 64 bits, checked in 80-digit Decimal logarithms (independent of the integer code)."""
    src = ScriptedSource(seed=22)
    g = geometric(2000, SMALL_RATIO, src, margin_rel=1.0)
    assert len(src.given) == 2000  # no draw of this seed needed more bits
    with localcontext() as ctx:
        ctx.prec = 80
        ln_r = (Decimal(Fraction(SMALL_RATIO).numerator) / Decimal(Fraction(SMALL_RATIO).denominator)).ln()
        two64 = Decimal(2) ** 64
        tiny = Decimal(10) ** -60
        for word, gi in zip(src.given, g, strict=True):
            assert word >= 2**40
            upper = (Decimal(word + 1) / two64).ln()  # ln of the interval's right end
            lower = (Decimal(word) / two64).ln()
            assert upper <= ln_r * int(gi) - tiny  # U ≤ r^g, decided with room
            assert lower >= ln_r * (int(gi) + 1) + tiny  # U > r^(g+1)


class CountingSource:
    """Fresh seeded words (not reproducible: drawn in one piece like a secure source); counts them."""

    reproducible = False

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def words(self, n: int) -> np.ndarray:
        self.count += int(n)
        return self.rng.integers(0, 2**64, size=n, dtype=np.uint64, endpoint=False)

    def for_block(self, block: int) -> CountingSource:
        return self


def test_work_at_epsilon_1e_minus_9_is_bounded(monkeypatch):
    """ε = 1e-9 (s ≈ 1e12: the fast path's margin rejects every draw, g ≈ 7·10^11) on 10 000
    entries: the work is counted, not timed. Words drawn: the 10 000 magnitudes and 157 words
    of signs, plus at most 16 for redraws and refinements (expected: about 10^-3 in all).
    Integers: every product of the interval arithmetic has at most 2P = 384 bits (P = 192 =
    64·⌈(64 + bitlen g + 40)/64⌉ for g < 2^88), where R**g has 53·g ≈ 4·10^13 bits. Products:
    at most 2·(8 + 3) an entry (lo and hi; one a base-256 digit of g < 2^64, then one per
    step up or down, three at most here) plus the digit tables (2·256 a row, at most 8 rows, at
    most 4 tables: one per digit count and precision used)."""
    n = 10_000
    work = {"products": 0, "bits": 0}
    real = noise_mod._times

    def counting_times(a, b, P):
        work["products"] += 2
        work["bits"] = max(work["bits"], (a[0] * b[0]).bit_length(), (a[2] * b[2]).bit_length())
        return real(a, b, P)

    monkeypatch.setattr(noise_mod, "_times", counting_times)
    noise_mod._digit_table.cache_clear()
    mech = GridLaplace(1e-9, np.zeros(100), np.ones(100))
    src = CountingSource(23)
    out = mech.release(np.full((100, 100), 0.5), src)
    assert np.isfinite(out).all()
    assert n + -(-n // 64) <= src.count <= n + -(-n // 64) + 16
    assert 0 < work["bits"] <= 384
    assert work["products"] <= 2 * (8 + 3) * n + 4 * 8 * 2 * 256


def test_smallest_epsilon_is_where_the_ratio_leaves_one():
    for k in (1, 16, 1024, 4096):
        delta_steps = k + 1
        m = smallest_epsilon(delta_steps)
        assert laplace_ratio(m, delta_steps) < 1.0  # served
        assert laplace_ratio(math.nextafter(m, 0.0), delta_steps) == 1.0  # the float below: not
        assert m == pytest.approx(2.5 * 2.0**-53 * delta_steps, rel=0.05)  # exp(−ε/Δ) ≤ 1 − 2.5·2^-53
    m = smallest_epsilon(DEFAULT_RESOLUTION + 1)
    mech = GridLaplace(m, np.zeros(2), np.ones(2))
    assert 0 < mech.epsilon_used <= m
    assert np.isfinite(mech.release(np.full((3, 2), 0.5), CountingSource(24))).all()


@pytest.mark.parametrize("eps, resolution", [(1e-14, 1024), (1e-13, 1024), (1e-20, 1024), (5e-16, 1)])
def test_too_small_epsilon_is_refused_early_with_the_smallest(eps, resolution):
    smallest = smallest_epsilon(resolution + 1)
    assert eps < smallest
    with pytest.raises(ValueError, match="smallest supported epsilon") as info:
        GridLaplace(eps, np.zeros(2), np.ones(2), resolution=resolution)
    message = str(info.value)
    assert repr(eps) in message and f"{smallest:.4g}" in message and "1.0" in message


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


def test_the_parameter_table_declares_the_largest_epsilon_a_statement_states():
    # Issue 38: ε = 1e6 spent, then the statement's e^ε overflowed. The rule stops at ln(max float).
    from kahm_dask.params import MAX_EPSILON, PARAMS
    from kahm_dask.privacy.bounds import BOUNDS_PUBLIC
    from kahm_dask.privacy.statement import PrivacyStatement

    assert math.isfinite(math.exp(MAX_EPSILON))
    with pytest.raises(OverflowError):
        math.exp(math.nextafter(MAX_EPSILON, math.inf))
    assert PARAMS["epsilon"].range.is_satisfied_by(MAX_EPSILON)
    assert not PARAMS["epsilon"].range.is_satisfied_by(math.nextafter(MAX_EPSILON, math.inf))
    mech = GridLaplace(MAX_EPSILON, np.zeros(3), np.ones(3))
    assert "ε = 709.783 per entry" in PrivacyStatement.from_settings(mech, BOUNDS_PUBLIC, dp_data="noisy").to_markdown()


@pytest.mark.parametrize("eps,delta", [(2.0, 0.0), (0.05, 0.25), (600.0, 0.0)])
def test_noise_sd_is_that_of_the_law(eps, delta):
    # noise_sd from the closed form against the s.d. summed from the pmf (1 − δ)(1 − r)/(1 + r)·r^|z|
    # over |z| < 60·s (the tail beyond is below r^(60 s) ≈ e^-60 of the mass): equal to 1e-9.
    mech = GridLaplace(eps, np.zeros(2), np.array([1.0, 4.0]), delta=delta)
    r = mech.ratio
    z = np.arange(-int(60 / -math.log(r)) - 2, int(60 / -math.log(r)) + 3, dtype=np.float64)
    pmf = (1 - delta) * (1 - r) / (1 + r) * r ** np.abs(z)
    np.testing.assert_allclose(mech.noise_sd, mech.step * math.sqrt(np.sum(pmf * z**2)), rtol=1e-9)


def test_the_parameter_table_declares_the_smallest_epsilon_the_mechanism_serves():
    from kahm_dask.params import MIN_EPSILON, PARAMS
    from kahm_dask.privacy.noise import DEFAULT_RESOLUTION, smallest_epsilon

    assert MIN_EPSILON == smallest_epsilon(DEFAULT_RESOLUTION + 1)
    assert PARAMS["epsilon"].range.is_satisfied_by(MIN_EPSILON)
    assert not PARAMS["epsilon"].range.is_satisfied_by(math.nextafter(MIN_EPSILON, 0.0))
