"""Where the Dask estimator computes: the client it was given, else the current one, else (for a
fit) a LocalCluster it starts and closes; and computing on it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from distributed import Client, default_client
from joblib import cpu_count

from kahm_dask.pipeline.cluster import compute, connect, prepare_workers
from kahm_dask.pipeline.config.sections import ClusterConfig

__all__ = ["current_client", "fitting_client", "compute_on"]


def current_client(client: Client | None = None) -> Client | None:
    """``client``, else the ``distributed`` client this process uses by default, else None;
    its workers prepared for the pipeline's tasks (:func:`~kahm_dask.pipeline.cluster.prepare_workers`,
    once per client)."""
    if client is None:
        try:
            client = default_client()
        except ValueError:
            return None
    prepare_workers(client)
    return client


@contextmanager
def fitting_client(client: Client | None = None) -> Iterator[Client]:
    """The client a fit runs on (:func:`current_client`); without one, a client on a LocalCluster
    of one single-threaded worker process per usable core (joblib's ``cpu_count``: affinity and
    cgroup quotas; :func:`~kahm_dask.pipeline.cluster.connect`), closed when the fit ends."""
    found = current_client(client)
    if found is not None:
        yield found
        return
    with connect(ClusterConfig(n_workers=cpu_count(), threads_per_worker=1)) as started:
        yield started


def compute_on(job: Any, client: Client | None, *, optimize_graph: bool = True) -> Any:
    """``job`` computed on :func:`current_client` of ``client`` (threads when there is none);
    ``optimize_graph`` as in :func:`~kahm_dask.pipeline.cluster.compute.compute`."""
    return compute(job, current_client(client), optimize_graph=optimize_graph)
