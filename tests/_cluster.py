"""Real ``dask scheduler`` and ``dask worker`` processes on 127.0.0.1 for the tests that submit
work by address (the pipeline equivalence test, the reliability tests)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kahm_dask.pipeline.cluster import BLAS_ENV


@dataclass
class SubprocessCluster:
    address: str
    scheduler: subprocess.Popen
    workers: list[subprocess.Popen]


def _stop(procs: list[subprocess.Popen]) -> None:
    """Terminate the processes this test started (by their own pid), then kill stragglers."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server the test starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_session(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``args`` in a process of its own session (so that its children stop with it), output to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})


def stop_sessions(procs: list[subprocess.Popen], timeout: float = 20) -> None:
    """Terminate the sessions of processes started by :func:`start_session`, then kill what is left
    of each (its own session only)."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


@contextmanager
def subprocess_cluster(
    tmp: Path, n_workers: int = 2, memory_limit: str = "1GiB", *, nanny: bool = False
) -> Iterator[SubprocessCluster]:
    """A scheduler and ``n_workers`` single-threaded worker processes, logging to
    ``tmp/cluster.log``. Without a nanny (the default) a SIGKILLed worker stays dead; with
    ``nanny=True`` the workers run as ``dask worker`` starts them by default."""
    from distributed import Client

    tmp.mkdir(parents=True, exist_ok=True)
    sched_file = tmp / "scheduler.json"
    env = {**os.environ, **BLAS_ENV}
    log = open(tmp / "cluster.log", "ab")
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
         "--no-dashboard", "--scheduler-file", str(sched_file)],
        env=env, stdout=log, stderr=log,
    )
    workers: list[subprocess.Popen] = []
    try:
        wait_for(sched_file.exists, 60, "the scheduler did not start")
        for _ in range(n_workers):
            workers.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(sched_file),
                 "--nthreads", "1", "--nanny" if nanny else "--no-nanny", "--no-dashboard",
                 "--memory-limit", memory_limit],
                env=env, stdout=log, stderr=log,
            ))
        address = json.loads(sched_file.read_text())["address"]
        with Client(address, timeout=30) as client:
            client.wait_for_workers(n_workers, timeout=60)
        yield SubprocessCluster(address, scheduler, workers)
    finally:
        _stop(workers[::-1] + [scheduler])
        log.close()


def wait_for(condition: Callable[[], bool], timeout: float, message: str, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s: {message}")
        time.sleep(interval)
