"""Computing a dask collection on the client: every task retried up to twice, progress shown,
and a failed job settled before its error is raised.

A job fails as soon as one task fails for good, while tasks of the job may still run on the
workers' threads (a thread cannot be stopped). A task that writes into a temporary directory
the caller then deletes (an atomic write, :mod:`kahm_dask.storage.atomic`) would write into
it after the delete and leave a partial ``.<name>.tmp-…`` behind. So a failed job is cancelled
(no further task of it starts) and the error is raised once the tasks of it that were running
have finished, or after :data:`SETTLE_TIMEOUT` seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Iterable
from contextlib import nullcontext
from typing import Any

import dask
from distributed import Client

from kahm_dask.pipeline.cluster.progress import Progress, as_progress

__all__ = ["compute", "SETTLE_TIMEOUT"]

logger = logging.getLogger("kahm_dask.pipeline.cluster")

#: Seconds a failed job waits for its running tasks to finish before its error is raised.
SETTLE_TIMEOUT = 60.0

#: Scheduler states of a task that may not have run to its end: a task the failure released
#: (nothing wants its result any more) may still run on its worker.
_UNFINISHED = frozenset({"released", "waiting", "queued", "no-worker", "processing"})

def compute(job: Any, client: Client | None, *, progress: Progress | bool = False, label: str | None = None,
            optimize_graph: bool = True) -> Any:
    """Compute the dask collection ``job`` on ``client`` (every task retried up to twice) and
    return its result; without a client, on Dask's default scheduler. With a ``label``, the
    ``progress`` (:mod:`kahm_dask.pipeline.cluster.progress`; True: the console) shows it as a stage:
    a bar of its tasks on a client, its time without one. ``optimize_graph=False``: the graph is
    computed as built, its annotations kept (:mod:`kahm_dask.pipeline.placement`)."""
    progress = as_progress(progress)
    if client is None:
        with progress.stage(label) if label else nullcontext():
            return dask.compute(job, optimize_graph=optimize_graph)[0]
    futures = client.compute(job, retries=2, optimize_graph=optimize_graph)
    try:
        if label:
            progress.tasks(label, futures, client)
        return client.gather(futures)
    except Exception:
        _settle(client, futures if isinstance(futures, list | tuple) else [futures])
        raise


def _settle(client: Client, futures: list) -> None:
    """Cancel the failed job of ``futures`` and wait (at most :data:`SETTLE_TIMEOUT` s) until
    none of its tasks runs on a worker any more (module docstring)."""
    try:
        unfinished = client.run_on_scheduler(_unfinished_keys, [f.key for f in futures])
        client.cancel(futures)
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while unfinished and time.monotonic() < deadline:
            if not any(client.run(_running_keys, unfinished).values()):
                return
            time.sleep(0.05)
    except Exception as exc:  # a lost scheduler or worker: nothing of the job runs there any more
        logger.info("could not wait for the tasks of a failed job: %s", exc)


def _unfinished_keys(keys: Iterable[Hashable], dask_scheduler=None) -> list:
    """On the scheduler: the keys of the tasks that ``keys`` need (themselves included) that
    have not finished; the search stops at tasks whose result is held (their inputs are done)."""
    todo = [dask_scheduler.tasks[k] for k in keys if k in dask_scheduler.tasks]
    seen, out = set(), []
    while todo:
        ts = todo.pop()
        if ts.key in seen or ts.state == "memory":
            continue
        seen.add(ts.key)
        if ts.state in _UNFINISHED:
            out.append(ts.key)
        todo.extend(ts.dependencies)
    return out


def _running_keys(keys: list, dask_worker=None) -> list:
    """On a worker: which of ``keys`` its threads are running now."""
    wanted = {_hashable(k) for k in keys}
    return [k for k in dask_worker.active_keys if _hashable(k) in wanted]


def _hashable(key: Hashable | list) -> Hashable:
    """A task key as sent (tuple keys may arrive as lists)."""
    return tuple(_hashable(k) for k in key) if isinstance(key, list | tuple) else key
