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
shows that all reals ``U`` consistent with the bits give the same ``G``. The rest (under one draw
in 10⁷) are decided exactly: rational comparisons ``U ≤ r^g`` with Python integers,
drawing more bits of ``U`` until the comparison is decided. The noise is thus *exactly* the
discrete Laplace law, with no truncated tail.

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
from dataclasses import dataclass, field

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


def _geometric_exact(word: int, ratio: float, source: NoiseSource) -> int:
    """``max{g : U ≤ r^g}`` for the uniform U whose first 64 bits are ``word``."""
    R, D = ratio.as_integer_ratio()
    N, B = int(word), 64
    while N < 1 << 40:
        N, B = _refine(N, B, source)
    g = max(0, int(math.floor((math.log(N) - B * math.log(2.0)) / math.log(ratio))) - 1)
    while g > 0:  # step down until U ≤ r^g is certain
        ok, N, B = _at_most(N, B, R**g, D**g, source)
        if ok:
            break
        g -= 1
    while True:  # then up while U ≤ r^(g+1)
        ok, N, B = _at_most(N, B, R ** (g + 1), D ** (g + 1), source)
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
    for i in np.flatnonzero(~certain):  # under 1e-7 of the draws (words < 2**40 and near-integer t)
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
    epsilon : float > 0
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
        set_(self, "ratio", laplace_ratio(self.epsilon, self.sensitivity_steps))

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
