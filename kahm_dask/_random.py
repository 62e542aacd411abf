"""Seed handling of the randomised steps that are not private (k-means, subsets, LSDD centres and
folds). The DP noise never comes from a seed: see :mod:`kahm_dask.privacy.randomness`.

``random_state`` arguments accept ``None`` (fresh OS entropy), a non-negative ``int``, a
``numpy.random.SeedSequence`` or a ``numpy.random.Generator``. Independent streams are derived
with :func:`child_seed_sequence`, which addresses a child of a seed sequence by its key without
spawning its siblings, so a distributed worker can rebuild exactly the stream it needs.
"""

from __future__ import annotations

import numbers

import numpy as np

__all__ = ["RandomState", "as_generator", "as_seed_sequence", "child_seed_sequence"]

RandomState = None | int | np.random.SeedSequence | np.random.Generator

_ENTROPY_WORDS = 4  # 128 bits of entropy when a seed sequence is drawn from a Generator


def _check_int_seed(random_state: numbers.Integral) -> int:
    if random_state < 0:
        raise ValueError(f"random_state must be a non-negative integer, got {random_state}.")
    return int(random_state)


def _type_error(random_state: object) -> TypeError:
    return TypeError(
        "random_state must be None, a non-negative int, a numpy.random.SeedSequence or a "
        f"numpy.random.Generator, got {type(random_state).__name__}."
    )


def as_generator(random_state: RandomState) -> np.random.Generator:
    """Return a ``numpy.random.Generator`` for ``random_state``.

    A ``Generator`` is returned as is (its state is shared with the caller); ``None``, an int or
    a ``SeedSequence`` seed a new PCG64 generator via ``numpy.random.default_rng``.
    """
    if isinstance(random_state, np.random.Generator):
        return random_state
    if random_state is None or isinstance(random_state, np.random.SeedSequence):
        return np.random.default_rng(random_state)
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        return np.random.default_rng(_check_int_seed(random_state))
    raise _type_error(random_state)


def as_seed_sequence(random_state: RandomState) -> np.random.SeedSequence:
    """Return a ``numpy.random.SeedSequence`` for ``random_state``.

    * ``SeedSequence``: returned as is;
    * ``None`` / int: ``SeedSequence(random_state)`` (``None`` draws fresh OS entropy);
    * ``Generator``: the seed sequence its bit generator was built from
      (``rng.bit_generator.seed_seq``; the generator is not advanced). If it has none, a new
      ``SeedSequence`` is seeded with 128 bits drawn from the generator (which advances it).
    """
    if isinstance(random_state, np.random.SeedSequence):
        return random_state
    if isinstance(random_state, np.random.Generator):
        seed_seq = getattr(random_state.bit_generator, "seed_seq", None)
        if isinstance(seed_seq, np.random.SeedSequence):
            return seed_seq
        words = random_state.integers(0, 2**32, size=_ENTROPY_WORDS, dtype=np.uint64)
        return np.random.SeedSequence([int(w) for w in words])
    if random_state is None:
        return np.random.SeedSequence()
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        return np.random.SeedSequence(_check_int_seed(random_state))
    raise _type_error(random_state)


def child_seed_sequence(root: np.random.SeedSequence, *key: int) -> np.random.SeedSequence:
    """Return the descendant of ``root`` with spawn key ``root.spawn_key + key``.

    This is ``SeedSequence(root.entropy, spawn_key=root.spawn_key + key,
    pool_size=root.pool_size)``. For a single-level key ``(i,)`` it equals the ``i``-th child
    ``root.spawn(i + 1)[i]`` of a fresh ``root``; for ``(i, j)`` it equals
    ``root.spawn(i + 1)[i].spawn(j + 1)[j]``. Unlike ``spawn`` it neither creates the siblings
    nor changes ``root.n_children_spawned``, so the same key always yields the same stream.
    """
    if not isinstance(root, np.random.SeedSequence):
        raise TypeError(f"root must be a numpy.random.SeedSequence, got {type(root).__name__}.")
    for k in key:
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
            raise ValueError(f"every key of child_seed_sequence must be an int >= 0, got {k!r}.")
    return np.random.SeedSequence(
        root.entropy,
        spawn_key=tuple(root.spawn_key) + tuple(int(k) for k in key),
        pool_size=root.pool_size,
    )
