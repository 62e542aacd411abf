"""Computing a dask collection on the client: every task retried up to twice, progress shown."""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any

import dask
from distributed import Client

from kahm_dask.pipeline.cluster.progress import Progress, as_progress

__all__ = ["compute"]

logger = logging.getLogger("kahm_dask.pipeline.cluster")

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
    if label:
        progress.tasks(label, futures, client)
    return client.gather(futures)
