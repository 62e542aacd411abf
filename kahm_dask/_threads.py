"""Threads for the in-memory estimator, in scikit-learn's ``n_jobs`` convention.

The work inside (LAPACK ``eigh``, BLAS GEMMs, scikit-learn's k-means) releases the GIL, so
threads share one copy of the data and scale with the cores. Each thread must then run its
BLAS and OpenMP single-threaded: two threads each driving a 2-thread OpenBLAS pool on two
cores stall each other (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from joblib import Parallel, delayed, effective_n_jobs
from threadpoolctl import threadpool_limits

__all__ = ["in_threads"]

T = TypeVar("T")
R = TypeVar("R")


def in_threads(fn: Callable[[T], R], items: Iterable[T], n_jobs: int | None) -> list[R]:
    """``[fn(item) for item in items]``, on ``n_jobs`` threads (joblib: None → 1, −1 → all
    cores), in order.

    With more than one thread, BLAS and OpenMP are limited to one thread each for the
    duration of the call (``threadpool_limits(1)``, process-wide); with one, nothing is changed.

    >>> in_threads(lambda x: x * x, range(5), n_jobs=2)
    [0, 1, 4, 9, 16]
    """
    n = effective_n_jobs(n_jobs)
    if n == 1:
        return [fn(item) for item in items]
    with threadpool_limits(limits=1):
        return Parallel(n_jobs=n, prefer="threads")(delayed(fn)(item) for item in items)
