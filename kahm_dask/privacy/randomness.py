"""Where the randomness of a DP release comes from.

The noise of a release must be unpredictable to anyone who sees the release, the code and
every argument the owner passed: it is drawn from the operating system's cryptographically
secure generator (``os.urandom``: ``getrandom(2)`` on Linux), never from ``random_state``.
``random_state`` seeds only what is not private (k-means initialisations, cross-validation).

A noise source hands out uniform 64-bit words. :class:`SecureRandom` (the default, and the only
one a release should use) draws each word from OS entropy and keeps no state: two fits, two
ε values, two runs, two sites never share noise. :class:`InsecureSeededRandom` reproduces the
noise from a seed, which voids the guarantee (whoever knows the seed regenerates the noise and
subtracts it); it exists for tests that compare two code paths on the same noise, and warns
with :class:`PrivacyLeakWarning` when it is made.

Examples
--------
>>> from kahm_dask.privacy.randomness import SecureRandom
>>> words = SecureRandom().words(4)
>>> words.dtype, words.shape
(dtype('uint64'), (4,))
"""

from __future__ import annotations

import os
import warnings
from typing import Protocol

import numpy as np

from kahm_dask._random import child_seed_sequence

__all__ = [
    "PrivacyLeakWarning",
    "NoiseSource",
    "SecureRandom",
    "InsecureSeededRandom",
    "as_noise_source",
]


class PrivacyLeakWarning(UserWarning):
    """A setting weakens or voids the DP guarantee (named in the privacy statement).

    Raised for bounds taken from the private data, the paper's private stopping threshold,
    k-means on the private rows, and a seeded (reproducible) noise source.
    """


class NoiseSource(Protocol):
    """Hands out uniform 64-bit words for one release."""

    def words(self, n: int) -> np.ndarray:
        """``n`` independent uniform ``uint64`` words."""

    def for_block(self, block: int) -> NoiseSource:
        """The source for global row block ``block`` (see :func:`kahm_dask.privacy.noise`)."""

    @property
    def reproducible(self) -> bool:
        """True when the words can be regenerated (not a secure source)."""


class SecureRandom:
    """Uniform words from OS entropy (``os.urandom``); stateless and picklable.

    Every call returns fresh words; there is no seed to store, leak or reuse.
    """

    reproducible = False

    def words(self, n: int) -> np.ndarray:
        return np.frombuffer(os.urandom(8 * int(n)), dtype=np.uint64).copy()

    def for_block(self, block: int) -> SecureRandom:
        return self

    def __repr__(self) -> str:
        return "SecureRandom()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecureRandom)

    def __hash__(self) -> int:
        return hash(SecureRandom)


class InsecureSeededRandom:
    """Reproducible words from ``seed`` (PCG64). **Voids the DP guarantee**: for tests only.

    Global row block ``b`` draws from ``child_seed_sequence(SeedSequence(seed), b)``, so the
    noise of a row does not depend on how the rows are chunked (in-memory and Dask runs get the
    same noise). Making one warns with :class:`PrivacyLeakWarning`.
    """

    reproducible = True

    def __init__(self, seed: int, *, _block: tuple[int, ...] = (), _warn: bool = True) -> None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise TypeError(f"the insecure noise seed must be an int >= 0, got {seed!r}.")
        self.seed = int(seed)
        self._block = _block
        self._rng = np.random.default_rng(child_seed_sequence(np.random.SeedSequence(self.seed), *_block))
        if _warn:
            warnings.warn(
                "noise drawn from a fixed seed: anyone who knows the seed can regenerate the noise "
                "and remove it. The release is NOT differentially private (tests only).",
                PrivacyLeakWarning,
                stacklevel=3,
            )

    def words(self, n: int) -> np.ndarray:
        return self._rng.integers(0, 2**64, size=int(n), dtype=np.uint64, endpoint=False)

    def for_block(self, block: int) -> InsecureSeededRandom:
        return InsecureSeededRandom(self.seed, _block=(int(block),), _warn=False)

    def __reduce__(self):
        return (_unpickle_insecure, (self.seed, self._block))

    def __repr__(self) -> str:
        return f"InsecureSeededRandom({self.seed})"


def _unpickle_insecure(seed: int, block: tuple[int, ...]) -> InsecureSeededRandom:
    return InsecureSeededRandom(seed, _block=block, _warn=False)


def as_noise_source(insecure_seed: int | None) -> NoiseSource:
    """The noise source of a release: secure unless a test passes ``insecure_seed``."""
    return SecureRandom() if insecure_seed is None else InsecureSeededRandom(insecure_seed)
