"""The exact path of kahm_dask.privacy.noise before interval arithmetic: the one kept copy.

Until the change that introduced ``_at_most_power``, the exact path decided ``U ≤ r^g`` with
the full rationals ``R**g / D**g`` (``r = R/D``): exact, but ``R**g`` has about 53·g bits, and
at small ε (g ≈ Δ/ε) one draw took seconds to hours. This module keeps that code verbatim, as
the reference of ``benchmarks/bench_noise_small_eps.py`` (old against new in the same run) and
of the draw-for-draw agreement tests in ``tests/privacy/test_noise.py``. Do not use it for a
release.

:func:`old_exact_path` swaps it into :mod:`kahm_dask.privacy.noise` for the duration of a block,
so that ``GridLaplace.release`` runs exactly as before (the fast path did not change).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import kahm_dask.privacy.noise as noise_mod
from kahm_dask.privacy.randomness import NoiseSource

__all__ = ["refine", "at_most", "geometric_exact", "old_exact_path"]


def refine(N: int, B: int, source: NoiseSource) -> tuple[int, int]:
    """64 more bits of a uniform U known to lie in (N/2^B, (N+1)/2^B]."""
    return (N << 64) | int(source.words(1)[0]), B + 64


def at_most(N: int, B: int, num: int, den: int, source: NoiseSource) -> tuple[bool, int, int]:
    """Decide ``U ≤ num/den`` exactly for U in (N/2^B, (N+1)/2^B], refining U as needed."""
    while True:
        if (N + 1) * den <= num << B:
            return True, N, B
        if N * den >= num << B:
            return False, N, B
        N, B = refine(N, B, source)


def geometric_exact(word: int, ratio: float, source: NoiseSource) -> int:
    """``max{g : U ≤ r^g}`` for the uniform U whose first 64 bits are ``word``."""
    R, D = ratio.as_integer_ratio()
    N, B = int(word), 64
    while N < 1 << 40:
        N, B = refine(N, B, source)
    g = max(0, int(math.floor((math.log(N) - B * math.log(2.0)) / math.log(ratio))) - 1)
    while g > 0:  # step down until U ≤ r^g is certain
        ok, N, B = at_most(N, B, R**g, D**g, source)
        if ok:
            break
        g -= 1
    while True:  # then up while U ≤ r^(g+1)
        ok, N, B = at_most(N, B, R ** (g + 1), D ** (g + 1), source)
        if not ok:
            return g
        g += 1


@contextmanager
def old_exact_path():
    """Run :mod:`kahm_dask.privacy.noise` with the old exact path inside the block."""
    new = noise_mod._geometric_exact
    noise_mod._geometric_exact = geometric_exact
    try:
        yield
    finally:
        noise_mod._geometric_exact = new
