"""The release mechanism: exact discrete Laplace noise on a public grid (docs/privacy.md).

The paper's optimal noise (Kumar, Moser, Fischer 2024, Result 1) is Laplace(0, d/ε), with an atom
of mass δ at 0, added to every entry of the data matrix. Sampled as written, through a
floating-point inverse CDF, its output bits reveal the private value (Mironov 2012). This module
releases the same law restricted to a data-independent grid, sampled exactly:

1. Clip each entry to the public bounds ``[lower_j, upper_j]`` of its feature.
2. Quantise: ``q = rint((x − lower_j) / γ_j)`` with the grid step ``γ_j = d_j / k``
   (``k = resolution`` steps per d). A change of one entry by at most ``d_j`` moves ``q`` by at
   most ``k`` steps, ``k + 1`` with the floating-point rounding of the quotient: the
   sensitivity in steps is ``Δ = k + 1``.
3. Add ``Z``, two-sided geometric (discrete Laplace): ``P(Z = z) = (1 − r)/(1 + r) · r^|z|``
   with ``r ≥ exp(−ε/Δ)``; with ``δ > 0``, ``Z = 0`` with probability δ (the paper's atom).
4. Release ``lower_j + (q + Z) γ_j``, a deterministic function of the integer ``q + Z``.

Guarantee: the integer release is (ε, δ)-DP for entries that change by at most ``d_j``, since
``P(q + Z = v) / P(q' + Z = v) ≤ r^{−|q − q'|} ≤ r^{−Δ} ≤ e^ε`` for the geometric part and the
atom adds at most δ (the argument of Result 1). Step 4 is post-processing, so the float carries no
more than the integer: every in-bounds private value can produce every grid point.

Exactness: ``r`` is a float, hence a dyadic rational, rounded *up* from ``exp(−ε/Δ)`` (the used
ε is ``Δ·ln(1/r) ≤ ε``). A geometric variable with ``P(G ≥ g) = r^g`` is ``G = ⌊ln U / ln r⌋``
for a uniform real ``U``. Each ``U`` starts as 64 random bits; the fast path evaluates the floor
in float64 and accepts it only where a margin larger than every rounding error in the formula
shows that all reals ``U`` consistent with the bits give the same ``G``. The rest (the words
below 2^40 and about ``2^-36·s ≈ 1.5·10⁻⁸/ε`` of the draws, ``s`` the scale: under one draw in
10⁷ at ε ≥ 1, more at small ε, see *Small ε*) are decided exactly: comparisons
``U ≤ r^g`` by interval arithmetic on Python integers (*Exact comparisons*), drawing more bits
of ``U`` only while ``r^g`` lies strictly inside U's interval. The noise is thus *exactly* the
discrete Laplace law, with no truncated tail.

Exact comparisons: U lies in ``I = (N/2^B, (N+1)/2^B]`` (its B bits so far) and ``r = R/2^k``
(a float). A number is a pair of ints ``(m, e)``, the value ``m·2^e``; an enclosure of ``x > 0``
is a pair of numbers ``lo ≤ x ≤ hi``. ``1`` and ``r`` are enclosed exactly (``lo = hi``). The
enclosure of a product ``x·y`` is ``[lo_x·lo_y rounded down, hi_x·hi_y rounded up]`` to P
significant bits (the integer product is exact; rounding drops its low bits, and adds one
when rounding up and a dropped bit was set). It is valid: all four bounds are ≥ 0, so
``lo_x·lo_y ≤ x·y ≤ hi_x·hi_y``, and rounding down only lowers a lower bound, rounding up only
raises an upper one. By induction over the products that form them, every enclosure of
``r^g`` is valid: a table of ``r^(d·256^j)`` (d < 256, cached per ratio and precision), their
product over the base-256 digits ``d_j`` of g (square-and-multiply above 1024 bits), and
``r^(g+1)`` as ``r^g·r``. A comparison with ``lo ≤ r^g ≤ hi`` then concludes

* ``U ≤ r^g`` for every U in I when ``(N+1)/2^B ≤ lo``;
* ``U > r^g`` for every U in I when ``hi ≤ N/2^B``;
* ``r^g`` strictly inside I when ``N/2^B < lo`` and ``hi < (N+1)/2^B``: some U in I lie above
  ``r^g``, some not, so no precision can decide; 64 more bits of U are drawn;
* nothing otherwise: P is doubled and ``r^g`` enclosed again.

Each conclusion follows from ``lo ≤ r^g ≤ hi``, so it is the one the exact rational comparison
(``(N+1)·2^(kg) ≤ R^g·2^B``, and so on) reaches, and a draw is refined exactly when that
comparison would refine it: the same G and the same words drawn as the exact path that
forms ``R**g`` and ``2**(kg)`` in full (kept in ``benchmarks/_noise_reference.py``;
the tests compare the two draw for draw). Termination: at fixed B, doubling P ends. Each
rounding moves a bound by a factor below ``1 + 2^(1−P)``, so ``hi/lo ≤ (1 + 2^(1−P))^W`` where W
counts the roundings that form the enclosure, each as often as its result enters a product:
W depends on g, not on P, and the width tends to 0 (measured: a relative width of about
``g·2^-P``). So if ``r^g`` is not an endpoint of I, the width falls below the gap between
them; if it is one, then once P > 1024 and ``P ≥ 53·g`` (square-and-multiply, whose exact
products have at most ``53·g`` bits), nothing is rounded, ``lo = hi = r^g`` and one of the
first three cases holds. A refinement picks one of 2^64 sub-intervals, of which at most one
has ``r^g`` strictly inside: it is followed by another with probability at most 2^-64. The
steps from the first guess ``⌊ln U / ln r⌋ − 1`` (floats) down, then up, are finitely many:
the step down stops at g = 0 at the latest, and ``U > N/2^B > 0`` exceeds ``r^g`` for g
large. So every draw ends with probability 1, after finitely many words in expectation.
Cost: the first P is ``B + bitlen(g) + 40`` bits rounded up to whole words (192 at
g ≈ 10^12), which leaves the comparison undecided (P doubled) about once in 2^37; a comparison
takes one product of P-bit integers a base-256 digit of g, the next one (g + 1) one product:
``O(log g · M(P))``, against ``O(M(53·g))`` for ``R**g`` (g ≈ Δ/ε).

Small ε: the scale ``s = −1/ln r`` is about ``Δ/ε``, and the fast path's margin
``2^-38·(s + t)`` grows with it (``t ≈ s`` leaves float64 fewer bits after the point), so the
share of draws sent to the exact path grows like ``2^-36·s``: 1.5·10⁻⁵ at ε = 10⁻³, 0.15 %
at 10⁻⁵, 15 % at 10⁻⁷ and every draw at 10⁻⁹. The law does not change; the exact path takes
about 10 µs a draw whatever ε (where ``R**g`` took 0.8 s at ε = 10⁻² and 23 s at ε = 10⁻³),
so a release at ε ≤ 10⁻⁹ takes about 10 s a million entries instead of 0.07 s. The smallest
ε served is :func:`smallest_epsilon` (Δ), 2.8e-13 at Δ = 1025: below it ``exp(−ε/Δ)``, rounded
up, is 1.0 in float64, there is no law to sample, and :class:`GridLaplace` refuses such ε.
Just above it r is coarse (``1 − r`` is a multiple of 2^-53): ``epsilon_used`` (≤ ε, in the
statement) falls to 0.4 ε there, i.e. the noise is wider than asked, never narrower.

As ``k → ∞`` the released value tends to the paper's Laplace(d/ε) noise; at the default
``k = 1024`` the grid step is d/1024, far below the noise scale d/ε.

Memory: the noise of at most :data:`ENTRIES_PER_STEP` entries is drawn at once (about 40 bytes
an entry beyond the output: 21 MB), whatever the size of the array noised.

Examples
--------
>>> import numpy as np
>>> from kahm_dask.privacy.noise import GridLaplace
>>> mech = GridLaplace(epsilon=2.0, lower=np.zeros(3), upper=np.ones(3))
>>> released = mech.release(np.array([[0.0, 0.5, 1.0]]))
>>> released.shape
(1, 3)
>>> steps = (released - mech.lower) / mech.step   # every released value is on the public grid
>>> bool(np.all(steps == np.rint(steps)))
True
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from kahm_dask._validation import check_positive_float, check_positive_int, check_probability
from kahm_dask.privacy.bounds import public_bounds
from kahm_dask.privacy.randomness import NoiseSource, SecureRandom

__all__ = [
    "GridLaplace",
    "DEFAULT_RESOLUTION",
    "ENTRIES_PER_STEP",
    "geometric",
    "discrete_laplace",
    "bernoulli",
    "laplace_ratio",
    "smallest_epsilon",
]

#: Grid steps per d (k): the grid step is d / k.
DEFAULT_RESOLUTION = 1024
#: Entries whose noise is drawn at once (bounds the memory of a release: about 40 B an entry).
ENTRIES_PER_STEP = 1 << 19
#: Global row blocks of a reproducible (seeded, test-only) source.
BLOCK_ROWS = 4096

_TWO64 = 2.0**64
_FAST_MIN_WORD = np.uint64(1 << 40)  # below: the U interval is too wide for the fast path
# Fast-path margin: ≥ 2**8 × the bound on the float error of t = ln(U)/ln(r) (docs/privacy.md).
_MARGIN_REL = 2.0**-38
_MARGIN_ABS = 2.0**-50


def laplace_ratio(epsilon: float, sensitivity: int) -> float:
    """The ratio ``r`` of the discrete Laplace noise: a float ``≥ exp(−ε/Δ)``.

    ``exp`` is within one ulp in float64, so two steps up make ``r`` an upper bound of the
    exact value: the noise is at least as wide as ε asks.
    """
    r = math.exp(-float(epsilon) / int(sensitivity))
    return math.nextafter(math.nextafter(r, 1.0), 1.0)


@lru_cache(maxsize=16)
def smallest_epsilon(sensitivity: int) -> float:
    """The smallest ε the mechanism serves at sensitivity Δ: the least float ε with
    ``laplace_ratio(ε, Δ) < 1`` (about ``2.5·2^-53·Δ``: 2.8e-13 at the default Δ = 1025).

    Below it ``exp(−ε/Δ)``, rounded up, is 1.0: float64 has no ratio between ``1 − 2^-53`` and 1,
    and at r = 1 the law is no law (infinitely wide). Found by bisection on the floats.

    >>> eps = smallest_epsilon(1025)
    >>> laplace_ratio(eps, 1025) < 1.0 == laplace_ratio(math.nextafter(eps, 0.0), 1025)
    True
    """
    lo, hi = _float_bits(0.0), _float_bits(float(sensitivity) * 2.0**-40)  # r = 1.0 at lo, r < 1 at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if laplace_ratio(_bits_float(mid), sensitivity) < 1.0:
            hi = mid
        else:
            lo = mid
    return _bits_float(hi)


def _float_bits(x: float) -> int:
    """The bits of a float ≥ 0 as an int: in the order of the floats."""
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _bits_float(i: int) -> float:
    return struct.unpack("<d", struct.pack("<q", i))[0]


# ---------------------------------------------------------------- exact samplers


def _refine(N: int, B: int, source: NoiseSource) -> tuple[int, int]:
    """64 more bits of a uniform U known to lie in (N/2^B, (N+1)/2^B]."""
    return (N << 64) | int(source.words(1)[0]), B + 64


def _at_most(N: int, B: int, num: int, den: int, source: NoiseSource) -> tuple[bool, int, int]:
    """Decide ``U ≤ num/den`` exactly for U in (N/2^B, (N+1)/2^B], refining U as needed."""
    while True:
        if (N + 1) * den <= num << B:
            return True, N, B
        if N * den >= num << B:
            return False, N, B
        N, B = _refine(N, B, source)


# Interval arithmetic on dyadic numbers m·2^e (ints m ≥ 0 and e): enclosures of r^g, so that the
# exact path compares U with r^g at a cost that grows like log g, not like g (module docstring).

#: r^g is the product of the table entries r^(d·256^j) over the base-256 digits d of g.
_DIGIT_BITS = 8
#: Working precision P = B + bitlen(g) + guard bits, rounded up to whole 64-bit words: the
#: enclosure is then narrower than 2^-(B + 38), and leaves U ≤ r^g open (P doubled) for about
#: one comparison in 2^37.
_GUARD_BITS = 40
#: Above this precision (reached only by doubling, with probability about 2^-P), r^g is formed
#: by square-and-multiply: no table of 256 entries per digit at that precision.
_TABLE_PRECISION = 1024


def _floor_to(m: int, e: int, P: int) -> tuple[int, int]:
    """``m·2^e`` rounded down to at most P significant bits: ``(m', e')``, ``m'·2^e' ≤ m·2^e``."""
    x = m.bit_length() - P
    return (m >> x, e + x) if x > 0 else (m, e)


def _ceil_to(m: int, e: int, P: int) -> tuple[int, int]:
    """``m·2^e`` rounded up to P significant bits (P + 1 on a carry): ``m'·2^e' ≥ m·2^e``."""
    x = m.bit_length() - P
    return (-(-m >> x), e + x) if x > 0 else (m, e)


def _times(a: tuple[int, int, int, int], b: tuple[int, int, int, int], P: int) -> tuple[int, int, int, int]:
    """``(lo_m, lo_e, hi_m, hi_e)`` of a product: ``[lo_a·lo_b rounded down, hi_a·hi_b rounded up]``.

    For enclosures ``0 ≤ lo_a ≤ x ≤ hi_a`` and ``0 ≤ lo_b ≤ y ≤ hi_b`` it encloses ``x·y``.
    """
    return _floor_to(a[0] * b[0], a[1] + b[1], P) + _ceil_to(a[2] * b[2], a[3] + b[3], P)


def _ratio_bounds(ratio: float) -> tuple[int, int, int, int]:
    """r itself, exactly: ``r = R/2^k`` (a float), so ``lo = hi = R·2^-k``."""
    R, D = ratio.as_integer_ratio()
    return (R, 1 - D.bit_length(), R, 1 - D.bit_length())


@lru_cache(maxsize=32)
def _digit_table(ratio: float, P: int, n_digits: int) -> tuple[tuple[tuple[int, int, int, int], ...], ...]:
    """Row j, column d: an enclosure of ``r^(d·256^j)`` at P bits (j < n_digits, d < 256)."""
    base = _ratio_bounds(ratio)  # r^(256^0), exact
    rows = []
    for _ in range(n_digits):
        row = [(1, 0, 1, 0)]  # r^0 = 1, exact
        for _ in range(1, 1 << _DIGIT_BITS):
            row.append(_times(row[-1], base, P))
        rows.append(tuple(row))
        base = _times(row[-1], base, P)  # r^(255·256^j) · r^(256^j) = r^(256^(j+1))
    return tuple(rows)


def _power_bounds(ratio: float, g: int, P: int) -> tuple[int, int, int, int]:
    """``(lo_m, lo_e, hi_m, hi_e)`` with ``lo_m·2^lo_e ≤ r^g ≤ hi_m·2^hi_e`` (g ≥ 0), at P bits."""
    bounds = (1, 0, 1, 0)
    if P > _TABLE_PRECISION:  # square-and-multiply
        square = _ratio_bounds(ratio)  # r^(2^i)
        while g:
            if g & 1:
                bounds = _times(bounds, square, P)
            g >>= 1
            if g:
                square = _times(square, square, P)
        return bounds
    for row in _digit_table(ratio, P, -(-g.bit_length() // _DIGIT_BITS)):
        d = g & ((1 << _DIGIT_BITS) - 1)
        g >>= _DIGIT_BITS
        if d:
            bounds = _times(bounds, row[d], P)
    return bounds


def _leq(a: int, ea: int, b: int, eb: int) -> bool:
    """``a·2^ea ≤ b·2^eb`` for ints a, b ≥ 0, exactly."""
    return a <= b << (eb - ea) if eb >= ea else a << (ea - eb) <= b


def _precision(B: int, g: int) -> int:
    """The first working precision of a comparison of U (B bits) with r^g: ≥ 64 bits."""
    return max(64, -(-(B + g.bit_length() + _GUARD_BITS) // 64) * 64)


def _at_most_power(
    N: int, B: int, g: int, ratio: float, source: NoiseSource, memo: dict | None = None
) -> tuple[bool, int, int]:
    """Decide ``U ≤ r^g`` exactly for U in (N/2^B, (N+1)/2^B], refining U as needed.

    The decisions and refinements of ``_at_most(N, B, R**g, D**g, source)`` (``r = R/D``), from
    an enclosure ``lo ≤ r^g ≤ hi`` at P bits: true when ``(N+1)/2^B ≤ lo``, false when
    ``hi ≤ N/2^B``; U refined when ``N/2^B < lo`` and ``hi < (N+1)/2^B`` (r^g strictly inside
    U's interval: no precision decides); else P doubled. ``memo`` (one draw's): enclosures by
    ``(g, P)``; that of r^g is then that of r^(g−1) times r when known (one product, not one a
    digit).
    """
    if g == 0:
        return True, N, B  # r^0 = 1 ≥ (N + 1)/2^B
    memo = {} if memo is None else memo
    P = 0
    while True:
        P = max(P, _precision(B, g))
        bounds = memo.get((g, P))
        if bounds is None:
            below = memo.get((g - 1, P))
            bounds = _power_bounds(ratio, g, P) if below is None else _times(below, _ratio_bounds(ratio), P)
            memo[(g, P)] = bounds
        lo_m, lo_e, hi_m, hi_e = bounds
        if _leq(N + 1, -B, lo_m, lo_e):
            return True, N, B
        if _leq(hi_m, hi_e, N, -B):
            return False, N, B
        if not _leq(lo_m, lo_e, N, -B) and not _leq(N + 1, -B, hi_m, hi_e):
            N, B = _refine(N, B, source)
        else:
            P *= 2


def _geometric_exact(word: int, ratio: float, source: NoiseSource) -> int:
    """``max{g : U ≤ r^g}`` for the uniform U whose first 64 bits are ``word``."""
    N, B = int(word), 64
    while N < 1 << 40:
        N, B = _refine(N, B, source)
    g = max(0, int(math.floor((math.log(N) - B * math.log(2.0)) / math.log(ratio))) - 1)
    memo: dict = {}
    while g > 0:  # step down until U ≤ r^g is certain
        ok, N, B = _at_most_power(N, B, g, ratio, source, memo)
        if ok:
            break
        g -= 1
    while True:  # then up while U ≤ r^(g+1)
        ok, N, B = _at_most_power(N, B, g + 1, ratio, source, memo)
        if not ok:
            return g
        g += 1


def geometric(n: int, ratio: float, source: NoiseSource, *, margin_rel: float = _MARGIN_REL) -> np.ndarray:
    """``n`` i.i.d. geometric variables with ``P(G ≥ g) = ratio^g`` exactly → int64 (n,).

    ``margin_rel`` only moves draws from the fast to the exact path (tests force the exact path
    with a large value); it never changes the law.
    """
    if not 0.0 < ratio < 1.0:
        raise ValueError(f"ratio must lie in (0, 1), got {ratio}.")
    words = source.words(n)
    scale = -1.0 / math.log(ratio)  # s: t = −s ln U
    # t = −s ln((w + 1/2) / 2^64), margin = margin_rel (s + t) + abs, computed in place
    # (the same operations in the same order: about 33 bytes a draw at the peak)
    t = words.astype(np.float64)
    t += 0.5
    t /= _TWO64
    np.log(t, out=t)
    t *= -scale
    margin = t + scale
    margin *= margin_rel
    margin += _MARGIN_ABS
    lo = t - margin
    np.floor(lo, out=lo)
    t += margin  # now t + margin
    del margin
    np.floor(t, out=t)
    certain = lo == t
    del t
    certain &= words >= _FAST_MIN_WORD
    out = lo.astype(np.int64)
    del lo
    for i in np.flatnonzero(~certain):  # words < 2**40 and t near an integer: about 2**-36 s of the draws
        out[i] = _geometric_exact(int(words[i]), ratio, source)
    return out


def _sign_bits(n: int, source: NoiseSource) -> np.ndarray:
    words = source.words(-(-n // 64))
    return np.unpackbits(words.view(np.uint8))[:n].astype(bool)


def discrete_laplace(n: int, ratio: float, source: NoiseSource, **kw) -> np.ndarray:
    """``n`` i.i.d. two-sided geometric variables, ``P(Z = z) = (1−r)/(1+r) r^|z|`` → int64 (n,).

    A sign and a geometric magnitude, with (−, 0) redrawn so that 0 is not counted twice.
    """
    out = geometric(n, ratio, source, **kw)
    negative = _sign_bits(n, source)
    np.negative(out, out=out, where=negative)
    todo = np.flatnonzero(negative & (out == 0))
    while todo.size:  # the redraws (about (1 − r)/2 of the draws), in index order
        g = geometric(todo.size, ratio, source, **kw)
        negative = _sign_bits(todo.size, source)
        np.negative(g, out=g, where=negative)
        out[todo] = g
        todo = todo[negative & (g == 0)]
    return out


def bernoulli(n: int, p: float, source: NoiseSource) -> np.ndarray:
    """``n`` i.i.d. exact Bernoulli(p) draws (p a float in [0, 1)) → bool (n,)."""
    if p == 0.0:
        return np.zeros(n, dtype=bool)
    num, den = float(p).as_integer_ratio()
    below = (num << 64) // den  # ⌊p 2^64⌋ < 2^64
    words = source.words(n)
    out = words < np.uint64(below)  # U ≤ (m+1)/2^64 ≤ p
    if (num << 64) % den:  # p 2^64 is not an integer: m = ⌊p 2^64⌋ is undecided
        for i in np.flatnonzero(words == np.uint64(below)):
            out[i] = _at_most(int(words[i]), 64, num, den, source)[0]
    return out


# ---------------------------------------------------------------- the mechanism


@dataclass(frozen=True, eq=False)
class GridLaplace:
    """Exact (ε, δ)-DP release of a data matrix with public bounds (module docstring).

    Parameters
    ----------
    epsilon : float ≥ :func:`smallest_epsilon` (Δ) (2.8e-13 at the default resolution)
    lower, upper : (p,) public bounds of each feature; entries are clipped to them.
    delta : float in [0, 1), default 0 (pure ε-DP). The probability of the atom at 0.
    d : (p,) or float or None
        Adjacency bound per feature; None: the bound width ``upper − lower``.
    resolution : int, default 1024
        Grid steps per d (k).
    """

    epsilon: float
    lower: np.ndarray
    upper: np.ndarray
    delta: float = 0.0
    d: np.ndarray | float | None = None
    resolution: int = DEFAULT_RESOLUTION
    step: np.ndarray = field(init=False)
    ratio: float = field(init=False)

    def __post_init__(self) -> None:
        check_positive_float(self.epsilon, "epsilon")
        check_probability(self.delta, "delta", allow_zero=True)  # any real (numpy floats too)
        check_positive_int(self.resolution, "resolution")
        n_features = max(np.size(self.lower), np.size(self.upper))
        lower, upper = public_bounds((self.lower, self.upper), n_features)
        d = upper - lower if self.d is None else np.broadcast_to(np.asarray(self.d, dtype=np.float64), lower.shape)
        if not (np.isfinite(d).all() and np.all(d > 0)):
            raise ValueError(f"d must be finite and > 0, got {self.d!r}.")
        set_ = object.__setattr__
        set_(self, "lower", lower)
        set_(self, "upper", upper)
        set_(self, "d", np.array(d, dtype=np.float64))
        set_(self, "delta", float(self.delta))
        set_(self, "step", self.d / self.resolution)
        ratio = laplace_ratio(self.epsilon, self.sensitivity_steps)
        if not ratio < 1.0:
            smallest = smallest_epsilon(self.sensitivity_steps)
            raise ValueError(
                f"epsilon = {self.epsilon!r} is below the smallest supported epsilon, {smallest:.4g} at "
                f"resolution {self.resolution} (sensitivity {self.sensitivity_steps} steps): the noise ratio "
                f"r = exp(-epsilon/{self.sensitivity_steps}), rounded up to a float64, is 1.0 at this epsilon, and "
                "at r = 1 there is no discrete Laplace law to sample (its scale is infinite). Use "
                f"epsilon >= {smallest!r} (or a smaller resolution)."
            )
        set_(self, "ratio", ratio)

    @property
    def n_features(self) -> int:
        return self.lower.shape[0]

    @property
    def sensitivity_steps(self) -> int:
        """Δ = k + 1 grid steps (k for a change of d, one for the rounding of the quotient)."""
        return self.resolution + 1

    @property
    def epsilon_used(self) -> float:
        """``Δ · ln(1/r) ≤ ε``: the privacy loss of the noise actually drawn."""
        return self.sensitivity_steps * -math.log(self.ratio)

    @property
    def noise_sd(self) -> np.ndarray:
        """(p,) standard deviation of each feature's noise in its units: ``γ_j·√((1 − δ)·2r)/(1 − r)``
        (the discrete Laplace variance ``2r/(1 − r)²`` in grid steps, 0 with probability δ);
        about ``√2·(1 + 1/k)·d_j/ε`` for small ε/Δ.

        >>> mech = GridLaplace(epsilon=1e-3, lower=np.zeros(2), upper=np.ones(2))
        >>> float(np.round(mech.noise_sd[0]))
        1416.0
        """
        return self.step * math.sqrt((1.0 - self.delta) * 2.0 * self.ratio) / (1.0 - self.ratio)

    def grid_index(self, X: np.ndarray) -> np.ndarray:
        """``rint((clip(X) − lower) / γ)`` → int64, same shape as X (n, p)."""
        X = np.clip(np.asarray(X, dtype=np.float64), self.lower, self.upper)
        return np.rint((X - self.lower) / self.step).astype(np.int64)

    def noise_steps(self, n_rows: int, source: NoiseSource, *, row_offset: int = 0) -> np.ndarray:
        """The integer noise Z (n_rows, p) of the rows ``[row_offset, row_offset + n_rows)``.

        A secure source draws fresh noise in steps of :data:`ENTRIES_PER_STEP` entries. A
        reproducible (test) source draws global row block b of :data:`BLOCK_ROWS` rows from
        ``source.for_block(b)``, so the noise of a row does not depend on the chunking.
        """
        p = self.n_features
        if not source.reproducible:
            return self._draw(n_rows * p, source).reshape(n_rows, p)
        out = np.empty((n_rows, p), dtype=np.int64)
        stop = row_offset + n_rows
        for b in range(row_offset // BLOCK_ROWS, -(-stop // BLOCK_ROWS)):
            lo, hi = max(b * BLOCK_ROWS, row_offset), min((b + 1) * BLOCK_ROWS, stop)
            block = self._draw(BLOCK_ROWS * p, source.for_block(b)).reshape(BLOCK_ROWS, p)
            out[lo - row_offset : hi - row_offset] = block[lo - b * BLOCK_ROWS : hi - b * BLOCK_ROWS]
        return out

    def _draw(self, n: int, source: NoiseSource) -> np.ndarray:
        if n <= ENTRIES_PER_STEP:  # one step: no second array of the step's size
            return self._draw_step(n, source)
        z = np.empty(n, dtype=np.int64)
        for a in range(0, n, ENTRIES_PER_STEP):
            m = min(ENTRIES_PER_STEP, n - a)
            z[a : a + m] = self._draw_step(m, source)
        return z

    def _draw_step(self, m: int, source: NoiseSource) -> np.ndarray:
        z = discrete_laplace(m, self.ratio, source)
        if self.delta:
            z[bernoulli(m, self.delta, source)] = 0
        return z

    def release(
        self,
        X,
        source: NoiseSource | None = None,
        *,
        row_offset: int = 0,
        dtype: np.dtype | type = np.float64,
    ) -> np.ndarray:
        """The DP release of X (n, p) → (n, p) of ``dtype``; X is never modified.

        ``source``: :class:`~kahm_dask.privacy.randomness.SecureRandom` when None.
        ``row_offset``: the global index of X's first row (matters for a reproducible source).
        """
        source = SecureRandom() if source is None else source
        X = np.asarray(X)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(
                f"X must have shape (n, {self.n_features}) to match the bounds, got {X.shape}."
            )
        if X.dtype.kind not in "fiu":
            raise ValueError("X must hold finite numbers (no NaN or inf) to be released.")
        out = np.empty(X.shape, dtype=dtype)
        rows_per_step = max(1, ENTRIES_PER_STEP // max(self.n_features, 1))
        for a in range(0, X.shape[0], rows_per_step):
            b = min(a + rows_per_step, X.shape[0])
            if not np.isfinite(X[a:b]).all():  # checked a step at a time: memory stays bounded
                raise ValueError("X must hold finite numbers (no NaN or inf) to be released.")
            steps = self.grid_index(X[a:b])
            steps += self.noise_steps(b - a, source, row_offset=row_offset + a)
            values = steps * self.step
            del steps
            values += self.lower
            out[a:b] = values
            del values
        return out

    def describe(self) -> dict:
        """The mechanism's public parameters, for the privacy statement and the ledger."""
        return {
            "mechanism": "discrete Laplace on a public grid (exact sampling)",
            "epsilon": float(self.epsilon),
            "epsilon_used": self.epsilon_used,
            "delta": self.delta,
            "d": _compact(self.d),
            "lower": _compact(self.lower),
            "upper": _compact(self.upper),
            "grid_step": _compact(self.step),
            "resolution": self.resolution,
            "sensitivity_steps": self.sensitivity_steps,
        }


def _compact(a: np.ndarray) -> float | list[float]:
    """One number when every feature has the same value, else the list."""
    return float(a[0]) if a.size and np.all(a == a[0]) else [float(v) for v in a]
