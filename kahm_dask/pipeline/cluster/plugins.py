"""Worker plugins and BLAS limits: one BLAS thread per Dask thread, glibc's allocator keeping
freed memory for reuse, worker processes that leave Ctrl-C to the client, and the task code
imported when a worker joins (the reasons and measurements are in
:mod:`kahm_dask.pipeline.cluster`)."""

from __future__ import annotations

import importlib
import logging
import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache, partial
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin
from threadpoolctl import threadpool_limits
from tornado.ioloop import PeriodicCallback

__all__ = [
    "BLAS_ENV",
    "MALLOC_THRESHOLDS",
    "MIN_MEMORY_LIMIT",
    "SingleThreadedBLAS",
    "ReusedHeap",
    "IgnoreInterrupts",
    "TASK_MODULES",
    "TaskCode",
    "blas_limited_here",
    "register_worker_plugins",
    "prepare_workers",
    "current_worker",
    "is_small_worker",
    "set_malloc_thresholds",
    "release_free_memory",
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

#: Above this share of its memory limit, a worker with :class:`ReusedHeap` hands its free heap
#: memory back to the OS: below Dask's spill (0.7) and pause (0.8) fractions.
TRIM_FRACTION = 0.5

#: How often (milliseconds) :class:`ReusedHeap` compares the worker's memory with that share.
TRIM_INTERVAL_MS = 200

#: The smallest worker memory limit :class:`ReusedHeap` changes the thresholds for. Below it the
#: memory a heap keeps (up to 64 MiB at the top of each of several arenas, and the holes between
#: live blocks) is a large share of the limit: on 1 GiB workers of the 4 GiB run it kept the
#: workers paused near Dask's 80 % pause fraction and made the run slower.
MIN_MEMORY_LIMIT = 4 * 2**30


@cache
def _libc() -> Any | None:
    """glibc, loaded once (None elsewhere): the periodic check calls into it every 200 ms."""
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def set_malloc_thresholds() -> bool:
    """Set :data:`MALLOC_THRESHOLDS` in this process with glibc's ``mallopt``; False where the
    C library is not glibc (nothing is changed there)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    return all(libc.mallopt(param, value) == 1 for param, value in MALLOC_THRESHOLDS.values())


def release_free_memory() -> int:
    """Return this process's free heap memory to the OS (glibc ``malloc_trim(0)``, every
    arena); 1 if memory was released, 0 if none was or the C library is not glibc."""
    libc = _libc()
    return int(libc.malloc_trim(0)) if libc is not None and hasattr(libc, "malloc_trim") else 0


def current_worker() -> Any | None:
    """The Dask worker running the caller, or None outside a worker."""
    from distributed import get_worker

    try:
        return get_worker()
    except ValueError:
        return None


def is_small_worker(worker: Any, min_memory_limit: int = MIN_MEMORY_LIMIT) -> bool:
    """Whether ``worker`` has a memory limit below ``min_memory_limit`` (default
    :data:`MIN_MEMORY_LIMIT`): the rule by which :class:`ReusedHeap`, :class:`TaskCode` and the
    trained models' cache (:func:`~kahm_dask.pipeline.stores.model.remember_trained_cluster`)
    leave its memory to its tasks."""
    limit = worker.memory_manager.memory_limit
    return bool(limit) and limit < min_memory_limit


class _LargeWorkerPlugin(WorkerPlugin):
    """A worker plugin that leaves alone a worker with a memory limit below ``min_memory_limit``
    (default :data:`MIN_MEMORY_LIMIT`, :func:`is_small_worker`)."""

    def __init__(self, min_memory_limit: int = MIN_MEMORY_LIMIT) -> None:
        self.min_memory_limit = int(min_memory_limit)

    def _is_small(self, worker: Any) -> bool:
        return is_small_worker(worker, self.min_memory_limit)


class ReusedHeap(_LargeWorkerPlugin):
    """Worker plugin: glibc's allocator keeps freed blocks of up to 32 MiB for reuse.

    Dask starts its worker processes with ``MALLOC_TRIM_THRESHOLD_=65536``, which also fixes
    glibc's mmap threshold at 128 KiB: every NumPy temporary above that (a 1000 × 1000 kernel
    matrix, a chunk being decompressed) is a fresh ``mmap`` whose pages fault in again, and is
    unmapped when freed. On a worker with no memory limit or a limit of at least
    ``min_memory_limit`` bytes (default :data:`MIN_MEMORY_LIMIT`) this plugin sets
    :data:`MALLOC_THRESHOLDS` instead (glibc only); smaller workers keep Dask's setting.

    Memory kept for reuse counts as the worker's unmanaged memory. So that it never pushes a
    worker towards Dask's spill and pause fractions, the plugin checks a worker with a limit
    every :data:`TRIM_INTERVAL_MS` and returns the free memory (:func:`release_free_memory`)
    while the process holds more than :data:`TRIM_FRACTION` of the limit.
    """

    name = "kahm-dask-reused-heap"

    def setup(self, worker: Any) -> None:
        """Set the thresholds in the worker's process and start the check against its limit."""
        if self._is_small(worker):
            return
        limit = worker.memory_manager.memory_limit
        if not set_malloc_thresholds():
            logger.debug("not glibc: the allocator's thresholds are left as they are")
            return
        if limit:
            check = PeriodicCallback(partial(_release_above, worker, int(TRIM_FRACTION * limit)), TRIM_INTERVAL_MS)
            worker.periodic_callbacks[self.name] = check
            check.start()

    def teardown(self, worker: Any) -> None:
        """Stop the check (the thresholds stay: the process is ending or keeps its heap)."""
        check = worker.periodic_callbacks.pop(self.name, None)
        if check is not None:
            check.stop()


def _release_above(worker: Any, threshold: int) -> None:
    if worker.monitor.get_process_memory() > threshold:
        release_free_memory()


class IgnoreInterrupts(WorkerPlugin):
    """Worker plugin for the worker processes of a local cluster: they leave Ctrl-C to the client.

    Ctrl-C in a terminal reaches every process of its foreground group. Without this plugin
    each worker process would print its own traceback. With it, SIGINT raises nothing in a
    worker; it turns the worker's logging off (:func:`quiet_after_interrupt`). The client
    process alone handles the interrupt (one line) and closes the cluster, and the log lines
    that closing causes (heartbeats to a scheduler that is gone, tasks cancelled) stay off the
    console. A normal close can cause one too: a heartbeat in flight when the closing worker
    shuts its connections logs an ERROR with three tracebacks (distributed's
    ``Worker.heartbeat``; seen under load at the end of ``kahm-dask train``); the plugin drops
    that record while its worker is closing (:class:`_HeartbeatWhileClosing`).
    """

    name = "kahm-dask-ignore-interrupts"

    def setup(self, worker: Any) -> None:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():  # signals are set there only
            signal.signal(signal.SIGINT, quiet_after_interrupt)
        logging.getLogger("distributed.worker").addFilter(_HeartbeatWhileClosing(worker))


class _HeartbeatWhileClosing(logging.Filter):
    """Drops distributed's "Failed to communicate with scheduler during heartbeat." record once
    ``worker`` is closing or closed (its connections are being shut on purpose); the same record
    while the worker runs is kept. Holds the worker weakly."""

    MESSAGE = "Failed to communicate with scheduler during heartbeat"

    def __init__(self, worker: Any) -> None:
        import weakref

        super().__init__()
        self._worker = weakref.ref(worker)

    def filter(self, record: logging.LogRecord) -> bool:
        from distributed.core import Status

        if not record.getMessage().startswith(self.MESSAGE):
            return True
        worker = self._worker()
        return worker is not None and worker.status not in (Status.closing, Status.closing_gracefully, Status.closed)


def quiet_after_interrupt(signum: int, frame: Any) -> None:
    """SIGINT handler of a local worker process: no KeyboardInterrupt; logging off for good,
    as the client is closing the cluster (:class:`IgnoreInterrupts`)."""
    logging.disable(logging.CRITICAL)


#: The modules the pipeline's tasks run: imported by :class:`TaskCode` when a worker joins.
TASK_MODULES = (
    "dask.array",
    "zarr",
    "kahm_dask.pipeline.training.layout",
    "kahm_dask.pipeline.training.partition",
    "kahm_dask.pipeline.training.tasks",
    "kahm_dask.pipeline.predict",
)


class TaskCode(_LargeWorkerPlugin):
    """Worker plugin: import :data:`TASK_MODULES` when the worker joins, not in its first task.

    A fresh worker process has Dask, NumPy, SciPy and scikit-learn loaded; the pipeline's task
    code (Zarr, dask.array, the training and prediction modules) took another 0.7–0.9 s to import
    on this machine, and every worker paid it inside the first task of its first stage, while
    the other workers waited at that stage's end. Registered by :func:`connect`, the plugin
    imports them in every worker at once while the cluster starts.

    The modules take about 90 MiB of the worker's memory from the start (214 → 303 MiB here),
    which on a small worker is a share of its limit the run may need: a worker with a limit
    below ``min_memory_limit`` (default :data:`MIN_MEMORY_LIMIT`, as :class:`ReusedHeap`) keeps
    importing them on first use, when a task needs them.
    """

    name = "kahm-dask-task-code"

    def setup(self, worker: Any) -> None:
        """Import the task modules in the worker's process (not on a small worker)."""
        if self._is_small(worker):
            return
        for module in TASK_MODULES:
            importlib.import_module(module)


@contextmanager
def blas_limited_here() -> Iterator[None]:
    """Limit this process's BLAS to one thread (for workers running in this process)."""
    _load_blas()
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def register_worker_plugins(client: Any, *, ignore_interrupts: bool = False) -> None:
    """Register the worker plugins every worker process of the pipeline gets on ``client``'s
    cluster: :class:`SingleThreadedBLAS`, :class:`ReusedHeap` and :class:`TaskCode` (and
    :class:`IgnoreInterrupts` for the worker processes of a local cluster started here). The
    scheduler keeps them for workers that join later; :func:`prepare_workers` then leaves
    ``client`` alone."""
    _PREPARED.add(client)
    client.register_plugin(SingleThreadedBLAS())
    client.register_plugin(ReusedHeap())
    if ignore_interrupts:
        client.register_plugin(IgnoreInterrupts())
    client.register_plugin(TaskCode())


#: The clients :func:`prepare_workers` has prepared (or found running workers in this process).
_PREPARED: weakref.WeakSet = weakref.WeakSet()


def prepare_workers(client: Any) -> None:
    """Give the workers of a client the pipeline did not start (the user's own ``Client(...)``)
    the plugins of :func:`register_worker_plugins`, once per client.

    Without them a worker computes with Dask's allocator setting (``MALLOC_TRIM_THRESHOLD_``,
    see :class:`ReusedHeap`): measured on MNIST, one cluster's fit took 0.31–0.33 s in such a
    worker against 0.25–0.27 s with the plugins (docs/performance.md#the-users-client).
    Workers that run in this process (a threaded cluster, ``Client(processes=False)``) are left
    alone: the plugins would change this process's BLAS threads and allocator.
    """
    if client in _PREPARED:
        return
    _PREPARED.add(client)
    if os.getpid() in client.run(os.getpid).values():
        return
    register_worker_plugins(client)
