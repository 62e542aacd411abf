"""Connecting to where the work runs: a running scheduler by address, a cluster config file, or
a LocalCluster (the priority and the BLAS and logging rules are in
:mod:`kahm_dask.pipeline.cluster`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager

from distributed import Client
from distributed.security import Security

from kahm_dask.pipeline.cluster.build import build_cluster, local_cluster
from kahm_dask.pipeline.cluster.plugins import blas_limited_here, register_worker_plugins
from kahm_dask.pipeline.cluster.security import TLS_PROTOCOL, check_address, to_security, warn_unencrypted
from kahm_dask.pipeline.config.cluster_files import ClusterSpec, LocalSpec, RemoteSpec, load_cluster_config
from kahm_dask.pipeline.config.sections import ClusterConfig

__all__ = ["DEFAULT_TIMEOUT", "ClusterConnectionError", "connect", "connect_address"]

logger = logging.getLogger("kahm_dask.pipeline.cluster")

DEFAULT_TIMEOUT = 10.0  # seconds to wait for a scheduler address to answer


class ClusterConnectionError(ConnectionError):
    """The scheduler named by an address did not answer in time."""



def _spec_for(cfg: ClusterConfig) -> ClusterSpec:
    """The cluster spec the pipeline's ``cluster`` section selects (see :func:`connect`)."""
    if cfg.scheduler is not None:
        return RemoteSpec(address=cfg.scheduler, tls=cfg.tls)
    if cfg.config is not None:
        return load_cluster_config(cfg.config)
    return LocalSpec(
        n_workers=cfg.n_workers,
        threads_per_worker=cfg.threads_per_worker,
        memory_limit=cfg.memory_limit,
        processes=cfg.processes,
        tls=cfg.tls,
        dashboard_address=cfg.dashboard_address,
    )


def _client_for_address(address: str, timeout: float, security: Security | None = None) -> Client:
    try:
        return Client(address, timeout=timeout, security=security)
    except OSError as exc:
        tls_hint = (" With TLS, also check that the scheduler uses TLS and that this client's "
                    "certificate is signed by the CA the scheduler trusts (and its CA file by "
                    "the scheduler's).") if address.startswith(TLS_PROTOCOL) else ""
        raise ClusterConnectionError(
            f"cannot reach the Dask scheduler at {address} within {timeout:g} s ({exc}). "
            "Check that a scheduler runs there (`dask scheduler`) and that host and port are "
            f"right, or remove cluster.scheduler to start a local cluster.{tls_hint}"
        ) from exc


@contextmanager
def connect_address(
    address: str,
    *,
    security: Security | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    address_key: str = "scheduler",
    security_key: str = "security",
) -> Iterator[Client]:
    """A client on the running scheduler at ``address``, closed on exit (the scheduler and its
    workers keep running): the ``remote`` case of :func:`connect`, for callers that hold a
    ``distributed.security.Security`` instead of TLS settings (the estimator).

    ``security`` is needed for, and only for, a ``tls://`` address
    (:func:`~kahm_dask.pipeline.cluster.security.check_address`; ``address_key`` and ``security_key``
    name the two in its error); any other address warns
    (:func:`~kahm_dask.pipeline.cluster.security.warn_unencrypted`). :class:`ClusterConnectionError`
    if the scheduler does not answer within ``timeout`` seconds or refuses this client. The workers run one BLAS thread
    per Dask thread (module docstring).
    """
    check_address(address, security is not None, address_key=address_key, tls_key=security_key)
    warn_unencrypted(address, stacklevel=4)
    with _client_for_address(address, timeout, security) as client:
        register_worker_plugins(client)
        logger.info("Dask dashboard: %s", client.dashboard_link)
        yield client


@contextmanager
def connect(
    cluster_cfg: ClusterConfig,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    worker_resources: Sequence[Mapping[str, float]] | None = None,
) -> Iterator[Client]:
    """A client on the cluster ``cluster_cfg`` selects; everything is closed on exit.

    Priority: ``scheduler`` address (``timeout`` seconds to answer, else
    :class:`ClusterConnectionError` naming the address), then the ``config`` file, then a
    LocalCluster (:func:`local_cluster`, whose worker ``w`` advertises
    ``worker_resources[w]`` if given; with a scheduler or a config file the workers advertise
    their own resources, and ``worker_resources`` is an error). Clusters started here are
    closed on exit, also after an exception; a remote scheduler only loses this client. The
    dashboard link is logged at INFO and is ``client.dashboard_link``. BLAS runs one thread
    per Dask thread (module docstring). With ``tls`` settings (``cluster_cfg.tls`` or the config
    file's), the client connects to the ``tls://`` scheduler with mutual TLS, or the local
    cluster runs mutual TLS on loopback (:mod:`kahm_dask.pipeline.cluster.security`). A
    Ctrl-C (``KeyboardInterrupt``) in the block closes a cluster started here with its logging
    off, and is raised again.
    """
    if worker_resources is not None and (cluster_cfg.scheduler or cluster_cfg.config):
        raise ValueError("worker_resources apply to a local cluster started from "
                         "n_workers; this cluster config names a scheduler or a config file.")
    spec = _spec_for(cluster_cfg)
    if isinstance(spec, RemoteSpec):
        security = None if spec.tls is None else to_security(spec.tls)
        with connect_address(spec.address, security=security, timeout=timeout) as client:
            yield client
        return
    in_process = isinstance(spec, LocalSpec) and not spec.processes
    with ExitStack() as stack:
        if in_process:
            stack.enter_context(blas_limited_here())
        cluster = stack.enter_context(
            local_cluster(spec, worker_resources) if isinstance(spec, LocalSpec) else build_cluster(spec)
        )
        client = stack.enter_context(Client(cluster))
        if not in_process:
            register_worker_plugins(client, ignore_interrupts=True)
        logger.info("Dask dashboard: %s", client.dashboard_link)
        try:
            yield client
        except KeyboardInterrupt:
            with logging_off():  # the cluster's closing after Ctrl-C is not news (IgnoreInterrupts)
                stack.close()
            raise


@contextmanager
def logging_off() -> Iterator[None]:
    """All logging of this process off in the block; the previous setting back afterwards."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)
