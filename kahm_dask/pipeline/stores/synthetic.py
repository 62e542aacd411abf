"""Synthetic class data generated lazily on the workers: :func:`synthetic_blobs` (Gaussian blobs
whose classes differ by a few thousandths per feature) and :func:`synthetic_directions` (classes
that differ along a few directions, strongly enough to be learnt from DP rows).

The rows never exist whole in memory, and each task's description is a few hundred bytes
whatever the data size: a task regenerates what it needs from the seed (the class and mode
centres are cached once per worker process), instead of carrying the centres and the per-row
labels in its closure. That closure was about 9 MB for 4096 features and 264k rows; workers
keep the description of tasks they have run while their results are still needed, so at
512-row chunks two 1 GiB workers filled with task descriptions, paused, and the ingest
stalled (``tests/pipeline/stores/test_synthetic.py`` checks the size of a task).

The data do not depend on the chunking: rows are drawn in fixed generator blocks of
:data:`GENERATOR_ROWS` rows, block ``g`` from ``child(SeedSequence(seed), 1, g)`` (its labels,
then its modes, then its noise), and a chunk draws the blocks it overlaps.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import dask.array as da
import numpy as np

from kahm_dask._random import child_seed_sequence

__all__ = ["GENERATOR_ROWS", "synthetic_blobs", "blob_labels", "synthetic_directions", "direction_labels"]

#: Rows per generator block (the unit of the random streams; chunks may be any size).
GENERATOR_ROWS = 256
#: The logistic squash's scale: feature = 1 / (1 + exp(-x / SQUASH)).
SQUASH = 4.0


@lru_cache(maxsize=4)
def _centres(seed: int, n_classes: int, modes_per_class: int, n_features: int, separation: float) -> np.ndarray:
    """Mode centres (C, M, p): class centres ``separation`` apart in RMS, modes half as far from
    their class centre; from ``child(SeedSequence(seed), 0)``. Cached per process (read-only)."""
    rng = np.random.default_rng(child_seed_sequence(np.random.SeedSequence(seed), 0))
    scale = separation / np.sqrt(2.0 * n_features)
    centres = rng.standard_normal((n_classes, 1, n_features)) * scale
    centres = centres + rng.standard_normal((n_classes, modes_per_class, n_features)) * (scale / 2)
    centres.setflags(write=False)
    return centres


def _block_rng(seed: int, g: int) -> np.random.Generator:
    return np.random.default_rng(child_seed_sequence(np.random.SeedSequence(seed), 1, g))


def _block_codes(
    rng: np.random.Generator, n: int, n_classes: int, modes_per_class: int
) -> tuple[np.ndarray, np.ndarray]:
    """Labels (n,) and modes (n,) of one generator block: the first two draws of its stream."""
    return rng.integers(0, n_classes, size=n).astype(np.int64), rng.integers(0, modes_per_class, size=n)


def _block_sizes(n_samples: int) -> range:
    return range(0, n_samples, GENERATOR_ROWS)


def blob_labels(n_samples: int, n_classes: int, *, seed: int, modes_per_class: int = 16) -> np.ndarray:
    """The labels (N,) int64 of :func:`synthetic_blobs` with the same arguments, without its rows."""
    parts = [
        _block_codes(_block_rng(seed, g), min(GENERATOR_ROWS, n_samples - start), n_classes, modes_per_class)[0]
        for g, start in enumerate(_block_sizes(n_samples))
    ]
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def _blob_block(g: int, n: int, *, seed: int, n_classes: int, modes_per_class: int, n_features: int,
                separation: float) -> np.ndarray:
    """The (n, p) values before the squash of generator block ``g`` of :func:`synthetic_blobs`:
    Gaussian draws around their mode centre."""
    centres = _centres(seed, n_classes, modes_per_class, n_features, separation)
    rng = _block_rng(seed, g)
    y, mode = _block_codes(rng, n, n_classes, modes_per_class)
    return centres[y, mode] + rng.standard_normal((n, n_features))


def _rows(start: int, stop: int, *, draw: Callable[..., np.ndarray], n_samples: int, n_features: int, dtype: str,
          **params: Any) -> np.ndarray:
    """Rows ``start:stop`` (stop − start, p), squashed into (0, 1): the generator blocks the rows
    overlap, each drawn whole by ``draw(g, n, n_features=…, **params)`` (its values before the
    squash, (n, p)) and cut to the rows asked for."""
    out = np.empty((stop - start, n_features), dtype=dtype)
    for g in range(start // GENERATOR_ROWS, (stop - 1) // GENERATOR_ROWS + 1):  # the few blocks overlapped
        g_start = g * GENERATOR_ROWS
        n = min(GENERATOR_ROWS, n_samples - g_start)
        x = draw(g, n, n_features=n_features, **params)
        lo, hi = max(start, g_start), min(stop, g_start + n)
        out[lo - start : hi - start] = 1.0 / (1.0 + np.exp(-x[lo - g_start : hi - g_start] / SQUASH))
    return out


def _lazy_rows(draw: Callable[..., np.ndarray], n_samples: int, n_features: int, chunk_rows: int, dtype: str,
               **params: Any) -> da.Array:
    """The (N, p) dask array of :func:`_rows` with ``chunk_rows``-row chunks; each task closes over
    ``draw`` (a module function) and scalars only, so it stays small (module docstring)."""
    chunks = tuple(min(chunk_rows, n_samples - a) for a in range(0, n_samples, chunk_rows))
    spec = dict(draw=draw, n_samples=n_samples, n_features=n_features, dtype=str(np.dtype(dtype)), **params)

    def block(block_info=None) -> np.ndarray:
        (start, stop), _ = block_info[None]["array-location"]
        return _rows(start, stop, **spec)

    return da.map_blocks(block, chunks=(chunks, (n_features,)), dtype=np.dtype(dtype), meta=np.empty((0, 0), dtype))


def synthetic_blobs(
    n_samples: int, n_features: int, n_classes: int, *, seed: int, chunk_rows: int = 20_000,
    dtype: str = "float64", separation: float = 6.0, modes_per_class: int = 16,
) -> tuple[da.Array, np.ndarray]:
    """Lazy class data squashed to (0, 1): X (N, p) dask array with ``chunk_rows``-row chunks,
    y (N,) int64.

    Each class is a mixture of ``modes_per_class`` unit-variance Gaussian modes around a class
    centre, so the per-class k-means partition has structure to find; a row is
    ``1 / (1 + exp(-(centre[y, mode] + z) / 4))`` with z ~ N(0, I_p). The same arguments give the
    same rows for every ``chunk_rows`` (module docstring).

    Examples
    --------
    >>> X, y = synthetic_blobs(1000, 8, 3, seed=0, chunk_rows=300)
    >>> X.shape, X.chunks[0], y.shape
    ((1000, 8), (300, 300, 300, 100), (1000,))
    >>> bool((X.compute() == synthetic_blobs(1000, 8, 3, seed=0, chunk_rows=512)[0].compute()).all())
    True
    """
    y = blob_labels(n_samples, n_classes, seed=seed, modes_per_class=modes_per_class)
    X = _lazy_rows(_blob_block, n_samples, n_features, chunk_rows, dtype, seed=seed, n_classes=n_classes,
                   modes_per_class=modes_per_class, separation=float(separation))
    return X, y


# --------------------------------------------------------------------------- class directions


@lru_cache(maxsize=4)
def _directions(seed: int, n_classes: int, n_features: int, n_directions: int) -> tuple[np.ndarray, np.ndarray]:
    """The signal basis B (p, k) with orthonormal columns and the class centres M (C, k) ~ N(0, I_k),
    from ``child(SeedSequence(seed), 2)``; ``n_directions`` ≤ ``n_features`` (checked by
    :func:`synthetic_directions`). Cached per process (read-only)."""
    rng = np.random.default_rng(child_seed_sequence(np.random.SeedSequence(seed), 2))
    basis, _ = np.linalg.qr(rng.standard_normal((n_features, n_directions)))
    centres = rng.standard_normal((n_classes, n_directions))
    basis.setflags(write=False)
    centres.setflags(write=False)
    return basis, centres


def _direction_block_rng(seed: int, g: int) -> np.random.Generator:
    return np.random.default_rng(child_seed_sequence(np.random.SeedSequence(seed), 3, g))


def direction_labels(n_samples: int, n_classes: int, *, seed: int) -> np.ndarray:
    """The labels (N,) int64 of :func:`synthetic_directions` with the same arguments, without its rows."""
    parts = [
        _direction_block_rng(seed, g).integers(0, n_classes, size=min(GENERATOR_ROWS, n_samples - start))
        for g, start in enumerate(_block_sizes(n_samples))
    ]
    return np.concatenate(parts).astype(np.int64) if parts else np.empty(0, np.int64)


def _direction_block(g: int, n: int, *, seed: int, n_classes: int, n_features: int, n_directions: int,
                     amplitude: float) -> np.ndarray:
    """The (n, p) values before the squash of generator block ``g`` of :func:`synthetic_directions`."""
    basis, centres = _directions(seed, n_classes, n_features, n_directions)
    gain = amplitude * np.sqrt(n_features / n_directions)  # a latent unit is `amplitude` per feature (RMS)
    rng = _direction_block_rng(seed, g)
    y = rng.integers(0, n_classes, size=n)  # labels, latent spread, feature noise: in this order
    latent = centres[y] + rng.standard_normal((n, n_directions))
    return gain * (latent @ basis.T) + rng.standard_normal((n, n_features))


def synthetic_directions(
    n_samples: int, n_features: int, n_classes: int, *, seed: int, chunk_rows: int = 20_000,
    dtype: str = "float64", n_directions: int = 16, amplitude: float = 1.0,
) -> tuple[da.Array, np.ndarray]:
    """Lazy class data squashed to (0, 1) whose classes differ along ``n_directions`` directions:
    X (N, p) dask array with ``chunk_rows``-row chunks, y (N,) int64.

    Signal model: a fixed basis B (p, k) with orthonormal columns (k = ``n_directions``) and
    class centres μ_c ~ N(0, I_k) in its coordinates. A row of class y is

        x = 1 / (1 + exp(−t / 4)),   t = a·√(p/k)·B(μ_y + w) + z,   w ~ N(0, I_k), z ~ N(0, I_p),

    with a = ``amplitude``: a class centre (an N(0, I_k) draw) moves every feature by ``a`` (RMS)
    before the squash, the same order as the unit feature noise z when a ≈ 1. The classes overlap
    through w (within-class spread as large as the spread of the centres) and z, so even the best
    classifier stays below 100 %. Two class centres are ≈ a·√(2p)/16 apart after the squash
    (Euclidean over the p features; 1.1 for a = 0.2, p = 4096): a few hundredths per feature, far
    below the noise of ε-DP rows on [0, 1] (s.d. ≈ √2/ε per entry). That noise is independent
    across rows, so a class model fitted on n noisy rows sees it shrunk by √n while the class
    structure stays: the classes are learnable from DP rows when there are many rows.

    Labels, w and z of generator block ``g`` come from ``child(SeedSequence(seed), 3, g)`` (B and
    μ from ``child(SeedSequence(seed), 2)``), so the rows do not depend on the chunking and a task
    carries only scalars (module docstring).

    Examples
    --------
    >>> X, y = synthetic_directions(1000, 64, 3, seed=0, chunk_rows=300, n_directions=4)
    >>> X.shape, X.chunks[0], y.shape
    ((1000, 64), (300, 300, 300, 100), (1000,))
    >>> bool((direction_labels(1000, 3, seed=0) == y).all())
    True
    """
    if n_directions < 1:
        raise ValueError(f"n_directions must be >= 1, got {n_directions}.")
    if not (np.isfinite(amplitude) and amplitude >= 0):
        raise ValueError(f"amplitude must be a finite number >= 0, got {amplitude}.")
    if n_directions > n_features:
        raise ValueError(f"n_directions ({n_directions}) must not exceed n_features ({n_features}).")
    y = direction_labels(n_samples, n_classes, seed=seed)
    X = _lazy_rows(_direction_block, n_samples, n_features, chunk_rows, dtype, seed=seed, n_classes=n_classes,
                   n_directions=int(n_directions), amplitude=float(amplitude))
    return X, y
