"""Worker plugins and BLAS limits: one BLAS thread per Dask thread, and worker processes that
leave Ctrl-C to the client (the reasons and measurements are in :mod:`kahm_dask.pipeline.cluster`)."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin
from threadpoolctl import threadpool_limits

__all__ = ["BLAS_ENV", "SingleThreadedBLAS", "IgnoreInterrupts", "blas_limited_here"]

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
