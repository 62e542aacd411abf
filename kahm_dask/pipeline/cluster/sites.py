"""The sites of a federated run on a cluster: worker resources that pin every task of site q to
the workers that hold site q (``federation.pin_sites``), a local cluster whose workers hold the
sites, and the check that some worker holds each (docs/federated.md)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dask
from distributed import Client
from distributed.deploy import Cluster

from kahm_dask.pipeline.cluster.build import local_cluster
from kahm_dask.pipeline.cluster.connect import connect
from kahm_dask.pipeline.config.cluster_files import LocalSpec
from kahm_dask.pipeline.config.sections import FederatedPipelineConfig

__all__ = ["site_resource", "site_resources", "site_cluster", "connect_federated", "check_site_resources", "pinned"]


def site_resource(q: int) -> str:
    """Name of the worker resource that marks the workers of site q."""
    return f"site{q}"


def site_resources(n_workers: int, n_sites: int) -> list[dict[str, int]]:
    """The resources of the workers of a local site cluster: worker ``w`` advertises
    ``site{q}: 1`` for every q ≡ w (mod n_workers)."""
    return [{site_resource(q): 1 for q in range(w, n_sites, n_workers)} for w in range(n_workers)]


def site_cluster(
    n_workers: int,
    n_sites: int,
    *,
    threads_per_worker: int = 1,
    memory_limit: str = "auto",
    processes: bool = True,
) -> Cluster:
    """A local cluster (:func:`~kahm_dask.pipeline.cluster.local_cluster`) whose workers hold
    the sites as :func:`site_resources` says (the caller closes it)."""
    spec = LocalSpec(n_workers=n_workers, threads_per_worker=threads_per_worker,
                     memory_limit=memory_limit, processes=processes)
    return local_cluster(spec, site_resources(n_workers, n_sites))


@contextmanager
def connect_federated(cfg: FederatedPipelineConfig) -> Iterator[Client]:
    """A client for a federated run (:func:`~kahm_dask.pipeline.cluster.connect`); everything
    is closed on exit.

    With ``federation.pin_sites`` and no ``cluster.scheduler``/``cluster.config``, the local
    cluster's workers advertise the site resources (:func:`site_resources`); the workers of a
    scheduler or a cluster config file must advertise them themselves (e.g.
    ``dask worker ADDR --resources site0=1``).
    """
    c, fed = cfg.cluster, cfg.federation
    local = fed.pin_sites and c.scheduler is None and c.config is None
    resources = site_resources(c.n_workers, fed.sites) if local else None
    with connect(c, worker_resources=resources) as client:
        yield client


def check_site_resources(client: Client, n_sites: int) -> None:
    """Raise ``ValueError`` unless some worker advertises each resource ``site{q}``."""
    workers = client.scheduler_info(n_workers=-1)["workers"].values()
    have = {name for w in workers for name in (w.get("resources") or {})}
    missing = [site_resource(q) for q in range(n_sites) if site_resource(q) not in have]
    if missing:
        raise ValueError(
            f"federation.pin_sites is set but no worker advertises the resource(s) {missing}; "
            "start workers with e.g. `dask worker ADDR --resources site0=1`, or leave "
            "cluster.scheduler and cluster.config unset to get a local site cluster."
        )


@contextmanager
def pinned(q: int, pin: bool) -> Iterator[None]:
    """Annotate the tasks built inside with the resource of site q (if ``pin``)."""
    if not pin:
        yield
        return
    with dask.annotate(resources={site_resource(q): 1}):
        yield
