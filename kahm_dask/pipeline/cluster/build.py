"""Starting the clusters kahm-dask runs on: a local cluster (threads or worker processes, mutual
TLS on loopback if asked, its dashboard on loopback unless told otherwise) and the clusters of the
optional extras (SSH, SLURM, Kubernetes)."""

from __future__ import annotations

import importlib
import logging
import sys
import warnings
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import dask
from distributed import LocalCluster, Nanny, Scheduler, SpecCluster, Worker
from distributed.deploy import Cluster

from kahm_dask.pipeline.cluster.plugins import BLAS_ENV
from kahm_dask.pipeline.cluster.security import ALL_ROLES, TLS_PROTOCOL, to_security
from kahm_dask.pipeline.config.cluster_files import (
    ClusterSpec,
    KubernetesSpec,
    LocalSpec,
    RemoteSpec,
    SlurmSpec,
    SSHSpec,
)
from kahm_dask.pipeline.config.schema import (
    dashboard_is_local,
)
from kahm_dask.privacy.randomness import PrivacyLeakWarning

__all__ = ["local_cluster", "build_cluster", "warn_exposed_dashboard"]

logger = logging.getLogger("kahm_dask.pipeline.cluster")

def _import_extra(module: str, extra: str, kind: str) -> ModuleType:
    """Import an optional dependency, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"cluster kind '{kind}' needs the optional package '{module}', which cannot be "
            f"imported ({exc}); install it with: pip install \"kahm-dask[{extra}]\""
        ) from exc


def _worker_log_level() -> int:
    """The level the workers of a local cluster log at: Dask's ``logging.distributed``
    (a level name or number), WARNING if unset."""
    level = dask.config.get("logging.distributed", "warning")
    return level if isinstance(level, int) else logging.getLevelNamesMapping()[level.upper()]


def local_cluster(
    spec: LocalSpec, worker_resources: Sequence[Mapping[str, float]] | None = None
) -> Cluster:
    """Start the local cluster ``spec`` describes (the caller closes it): one BLAS thread per
    Dask thread, workers logging at :func:`_worker_log_level` (module docstring).

    A ``LocalCluster``; with ``worker_resources`` (one mapping per worker) a cluster of the
    same workers on 127.0.0.1 whose worker ``w`` advertises the resources
    ``worker_resources[w]``.
    """
    silence_logs = _worker_log_level()
    tls = _local_tls(spec)
    warn_exposed_dashboard(spec.dashboard_address)
    environ = {**dask.config.get("distributed.nanny.pre-spawn-environ"), **BLAS_ENV}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
        if worker_resources is None:
            return LocalCluster(
                n_workers=spec.n_workers,
                threads_per_worker=spec.threads_per_worker,
                memory_limit=spec.memory_limit,
                processes=spec.processes,
                silence_logs=silence_logs,
                host="127.0.0.1" if spec.processes else None,  # threads talk in process
                dashboard_address=spec.dashboard_address,
                **tls,
            )
        if len(worker_resources) != spec.n_workers:
            raise ValueError(
                f"got resources for {len(worker_resources)} workers; the cluster has "
                f"{spec.n_workers}."
            )
        security = {"security": tls["security"]} if tls else {}
        options = {"nthreads": spec.threads_per_worker, "memory_limit": spec.memory_limit,
                   "silence_logs": silence_logs, **security}
        workers = {
            f"worker{w}": {"cls": Nanny if spec.processes else Worker,
                           "options": {**options, "resources": dict(resources)}}
            for w, resources in enumerate(worker_resources)
        }
        dashboard = {"dashboard_address": spec.dashboard_address} if spec.dashboard_address else {"dashboard": False}
        scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", **dashboard, **tls}}
        return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=silence_logs, **security)


def warn_exposed_dashboard(address: str | None) -> None:
    """Warn (:class:`~kahm_dask.privacy.randomness.PrivacyLeakWarning`) when a local cluster's
    dashboard would listen beyond this machine's loopback interface."""
    if address is None or dashboard_is_local(address):
        return
    warnings.warn(
        f"the Dask dashboard listens on {address!r}, beyond this machine's loopback interface, with no "
        "authentication: anyone who reaches it sees the run's tasks, progress, timings and worker logs, "
        "computed on private rows. Keep the default 127.0.0.1 and reach it over an SSH tunnel instead.",
        PrivacyLeakWarning,
        stacklevel=3,
    )


def _local_tls(spec: LocalSpec) -> dict[str, Any]:
    """The ``security`` and ``protocol`` arguments of a local cluster with ``spec.tls`` (mutual
    TLS on loopback: every role presents ``spec.tls.cert``), else none."""
    if spec.tls is None:
        return {}
    return {"security": to_security(spec.tls, ALL_ROLES), "protocol": TLS_PROTOCOL}


def _scheduler_options(options: dict[str, Any]) -> dict[str, Any]:
    """A started cluster's scheduler options, its dashboard on loopback unless they say otherwise
    (warned: :func:`warn_exposed_dashboard`)."""
    options = {"dashboard_address": "127.0.0.1:0", **options}
    warn_exposed_dashboard(options["dashboard_address"])
    return options


def _ssh_cluster(spec: SSHSpec) -> Cluster:
    _import_extra("asyncssh", "ssh", spec.kind)  # SSHCluster imports it only when starting
    from distributed.deploy.ssh import SSHCluster

    # SSHCluster learns the remote scheduler's and workers' addresses from their INFO log lines
    # ("Scheduler at: ..."), and passes them this process's Dask config: a console set to
    # warnings (kahm_dask.cli) would silence those lines and the start would wait forever
    with dask.config.set({"logging.distributed": "info"}):
        return SSHCluster(
            hosts=spec.hosts,
            connect_options=spec.connect_options,
            worker_options=spec.worker_options,
            scheduler_options=_scheduler_options(spec.scheduler_options),
            remote_python=spec.python or sys.executable,
        )


def _slurm_cluster(spec: SlurmSpec) -> Cluster:
    jobqueue = _import_extra("dask_jobqueue", "jobqueue", spec.kind)
    optional = {"python": spec.python} if spec.python is not None else {}
    if spec.log_directory is not None:
        optional["log_directory"] = spec.log_directory
    cluster = jobqueue.SLURMCluster(
        queue=spec.queue,
        account=spec.account,
        cores=spec.cores,
        processes=spec.processes,
        memory=spec.memory,
        walltime=spec.walltime,
        job_extra_directives=spec.job_extra_directives,
        # one BLAS thread per Dask thread in every job, as in a local cluster
        job_script_prologue=[f"export {name}={value}" for name, value in BLAS_ENV.items()],
        scheduler_options=_scheduler_options(spec.scheduler_options),
        worker_extra_args=spec.worker_extra_args,
        **optional,
    )
    cluster.scale(jobs=spec.jobs)
    return cluster


def _kubernetes_cluster(spec: KubernetesSpec) -> Cluster:
    operator = _import_extra("dask_kubernetes.operator", "kubernetes", spec.kind)
    resources = None
    if spec.resources is not None:
        amounts = {"cpu": str(spec.resources.cpu), "memory": spec.resources.memory}
        resources = {"requests": amounts, "limits": dict(amounts)}
    return operator.KubeCluster(
        image=spec.image, n_workers=spec.n_workers, resources=resources, namespace=spec.namespace
    )


_BUILDERS = {
    LocalSpec: local_cluster,
    SSHSpec: _ssh_cluster,
    SlurmSpec: _slurm_cluster,
    KubernetesSpec: _kubernetes_cluster,
}


def build_cluster(spec: ClusterSpec) -> Cluster:
    """Start the cluster ``spec`` describes (the caller closes it).

    The optional library of a kind is imported only here; if it is missing, an ImportError
    names the extra to install. A ``remote`` spec has no cluster to build: use
    :func:`connect`.
    """
    if isinstance(spec, RemoteSpec):
        raise ValueError(
            f"a remote spec names a running scheduler ({spec.address}); there is no cluster "
            "to build: connect to it with kahm_dask.pipeline.cluster.connect"
        )
    return _BUILDERS[type(spec)](spec)
