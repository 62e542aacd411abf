"""Worker plugins and BLAS limits: one BLAS thread per Dask thread, glibc's allocator keeping
freed memory for reuse, and worker processes that leave Ctrl-C to the client (the reasons and
measurements are in :mod:`kahm_dask.pipeline.cluster`)."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin
from threadpoolctl import threadpool_limits

__all__ = [
    "BLAS_ENV",
    "MALLOC_THRESHOLDS",
    "SingleThreadedBLAS",
    "ReusedHeap",
    "IgnoreInterrupts",
    "blas_limited_here",
    "set_malloc_thresholds",
]

logger = logging.getLogger("kahm_dask.pipeline.cluster")

BLAS_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _load_blas() -> None:
    """Import SciPy's linear algebra so that its BLAS (a separate OpenBLAS in SciPy's wheels)
    is loaded next to NumPy's and threadpoolctl can limit both."""
    importlib.import_module("scipy.linalg")


class SingleThreadedBLAS(WorkerPlugin):
    """Worker plugin: limit the worker process's BLAS libraries to one thread each."""

    name = "kahm-dask-single-threaded-blas"

    def setup(self, worker: Any) -> None:
        """Load NumPy's and SciPy's BLAS and limit them to one thread."""
        _load_blas()
        self._limits = threadpool_limits(limits=1, user_api="blas")

    def teardown(self, worker: Any) -> None:
        """Restore the BLAS thread counts found at setup."""
        self._limits.restore_original_limits()


#: glibc ``mallopt`` parameters and the values :class:`ReusedHeap` sets: blocks up to 32 MiB
#: (glibc's own ceiling for its adaptive mmap threshold on 64-bit) come from the heap, and up to
#: 64 MiB of free memory at the top of a heap stays mapped (twice that, as glibc's adaptive rule).
MALLOC_THRESHOLDS = {"M_MMAP_THRESHOLD": (-3, 32 << 20), "M_TRIM_THRESHOLD": (-1, 64 << 20)}


def set_malloc_thresholds() -> bool:
    """Set :data:`MALLOC_THRESHOLDS` in this process with glibc's ``mallopt``; False where the
    C library is not glibc (nothing is changed there)."""
    try:
        import ctypes

        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(param, value) == 1 for param, value in MALLOC_THRESHOLDS.values())


class ReusedHeap(WorkerPlugin):
    """Worker plugin: glibc's allocator keeps freed blocks of up to 32 MiB for reuse.

    Dask starts its worker processes with ``MALLOC_TRIM_THRESHOLD_=65536``, which also fixes
    glibc's mmap threshold at 128 KiB: every NumPy temporary above that (a 1000 × 1000 kernel
    matrix, a chunk being decompressed) is a fresh ``mmap`` whose pages fault in again, and is
    unmapped when freed. This plugin sets :data:`MALLOC_THRESHOLDS` instead (glibc only). The
    memory it keeps is bounded (64 MiB at the top of each heap), and the training pipeline
    returns it with ``malloc_trim`` before its training tasks.
    """

    name = "kahm-dask-reused-heap"

    def setup(self, worker: Any) -> None:
        """Set the thresholds in the worker's process."""
        if not set_malloc_thresholds():
            logger.debug("not glibc: the allocator's thresholds are left as they are")


class IgnoreInterrupts(WorkerPlugin):
    """Worker plugin for the worker processes of a local cluster: they ignore SIGINT.

    Ctrl-C in a terminal reaches every process of its foreground group; without this plugin
    each worker process would print its own traceback. The client process alone handles it (one
    line), and closing the cluster stops the workers.
    """

    name = "kahm-dask-ignore-interrupts"

    def setup(self, worker: Any) -> None:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():  # signals are set there only
            signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def blas_limited_here() -> Iterator[None]:
    """Limit this process's BLAS to one thread (for workers running in this process)."""
    _load_blas()
    with threadpool_limits(limits=1, user_api="blas"):
        yield
