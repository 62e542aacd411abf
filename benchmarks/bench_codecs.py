"""Zarr's zstd at level 3 (its default) against level 1 on one chunk of rows, in one process.

Writes and reads one 2048 × 4096 float32 chunk (32 MiB, the 4 GiB run's chunk) into an
in-memory Zarr store, best of ``--repeat``, for two kinds of rows: features in (0, 1) like the
4 GiB run's private rows, and the same rows after the library's release (the secure discrete
Laplace mechanism at ε = 2 per entry on the public bounds [0, 1], whose values lie on its
grid). Records the write and read rates and the compression ratio of each level
(``benchmarks/results/codecs.md``); the rule it backs is ``kahm_dask/storage/codecs.py``'s.

    python -m benchmarks.bench_codecs [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

import dask.array as da
import numpy as np
import zarr
from zarr.codecs import ZstdCodec

from benchmarks._harness import blas_threads, machine_facts, markdown_table, write_report
from kahm_dask.pipeline.training import noisy_array
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import SecureRandom

SHAPE = (2048, 4096)
LEVELS = (3, 1)


def private_like_rows(seed: int = 0) -> np.ndarray:
    """Rows with features in (0, 1), as the 4 GiB run's generator squashes them."""
    z = np.random.default_rng(seed).standard_normal(SHAPE)
    return (1.0 / (1.0 + np.exp(-z))).astype(np.float32)


def released_rows(X: np.ndarray, epsilon: float = 2.0) -> np.ndarray:
    """``X`` after the library's release on the public bounds [0, 1] (fresh secure noise)."""
    mechanism = GridLaplace(epsilon, np.zeros(X.shape[1]), np.ones(X.shape[1]))
    return noisy_array(da.from_array(X, chunks=(512, -1)), mechanism, SecureRandom()).compute()


def write_read(X: np.ndarray, level: int, repeat: int) -> tuple[float, float, float]:
    """Best write and read time of ``X`` as one chunk at zstd ``level``, and the stored bytes."""
    best_write = best_read = float("inf")
    for _ in range(repeat):
        store = zarr.storage.MemoryStore()
        arr = zarr.create_array(store, shape=X.shape, chunks=X.shape, dtype=X.dtype,
                                compressors=ZstdCodec(level=level))
        t0 = time.perf_counter()
        arr[...] = X
        t1 = time.perf_counter()
        back = arr[...]
        t2 = time.perf_counter()
        if not np.array_equal(back, X):
            raise AssertionError("the chunk read back differs from the chunk written")
        best_write, best_read = min(best_write, t1 - t0), min(best_read, t2 - t1)
        stored = arr.nbytes_stored()  # the chunk and the array's metadata (under 1 KiB)
    return best_write, best_read, stored


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--name", default="codecs")
    args = ap.parse_args(argv)
    facts = machine_facts(blas=1)
    private = private_like_rows()
    kinds = {"(0, 1) features (private-like)": private,
             "the same, released (ε = 2 per entry)": released_rows(private)}
    rows = []
    with blas_threads(1):
        for kind, X in kinds.items():
            for level in LEVELS:
                w, r, stored = write_read(X, level, args.repeat)
                rows.append([kind, level, f"{X.nbytes / w / 1e6:.0f}", f"{X.nbytes / r / 1e6:.0f}",
                             f"{X.nbytes / stored:.2f}"])
    facts.update({"chunk": f"{SHAPE[0]} × {SHAPE[1]} float32 ({private.nbytes / 2**20:.0f} MiB), one per array",
                  "repeats": f"{args.repeat}, best kept"})
    table = markdown_table(["rows", "zstd level", "write MB/s", "read MB/s", "ratio"], rows)
    path = write_report(args.name, "Zstd level 3 against level 1 on a chunk of rows", facts,
                        [("Rates (one process, in-memory store)", table)])
    print(path.read_text())


if __name__ == "__main__":
    main()
