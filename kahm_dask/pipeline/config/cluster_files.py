"""The schema of the cluster config files (``cluster_configs/*.yaml``): one section per
``kind`` (local, remote, ssh, slurm, kubernetes), validated like a pipeline file
(:mod:`kahm_dask.pipeline.config.schema`); :func:`load_cluster_config` reads one."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from kahm_dask.pipeline.config.schema import (
    ADDRESS,
    DASHBOARD,
    DASHBOARD_RULE,
    MEMORY,
    ConfigError,
    Section,
    bound,
    invalid_value,
    load_yaml,
)
from kahm_dask.pipeline.config.sections import TLSConfig, check_address

__all__ = [
    "LocalSpec", "RemoteSpec", "SSHSpec", "SlurmSpec", "KubernetesResources", "KubernetesSpec", "ClusterSpec",
    "load_cluster_config",
]


@dataclass(frozen=True, kw_only=True)
class LocalSpec(Section):
    """``kind: local`` — a LocalCluster on this machine; with ``tls``, its scheduler, workers
    and client talk mutual TLS on loopback, all presenting ``tls.cert`` (signed by
    ``tls.ca_file``), so no other local user can connect to it."""

    kind: Literal["local"] = "local"
    n_workers: int = field(default=2, metadata=bound(ge=1))
    threads_per_worker: int = field(default=1, metadata=bound(ge=1))
    memory_limit: str = field(default="auto", metadata=MEMORY)
    processes: bool = True
    tls: TLSConfig | None = None
    dashboard_address: str | None = field(default=DASHBOARD, metadata=DASHBOARD_RULE)


@dataclass(frozen=True, kw_only=True)
class RemoteSpec(Section):
    """``kind: remote`` — a scheduler that is already running, by address; a ``tls://``
    address needs ``tls`` (this client's certificate; :mod:`kahm_dask.pipeline.cluster.security`)."""

    kind: Literal["remote"] = "remote"
    address: str = field(metadata=ADDRESS)
    tls: TLSConfig | None = None

    def _validate(self) -> None:
        check_address(self.address, self.tls is not None, address_key="address", tls_key="tls")


@dataclass(frozen=True, kw_only=True)
class SSHSpec(Section):
    """``kind: ssh`` — ``distributed.deploy.ssh.SSHCluster`` (extra ``ssh``: asyncssh).

    ``hosts[0]`` runs the scheduler, every further entry one worker process (repeat a host
    to put the scheduler and a worker on it). The option mappings go unchanged to
    SSHCluster: ``connect_options`` to ``asyncssh.connect``, ``worker_options`` to each
    ``Nanny`` (e.g. ``nthreads``, ``memory_limit``), ``scheduler_options`` to the scheduler
    (its dashboard stays on 127.0.0.1 unless ``dashboard_address`` says otherwise). ``python``:
    the interpreter on the hosts (an environment with kahm-dask), null for the client's own path.
    """

    kind: Literal["ssh"] = "ssh"
    hosts: list[str]
    connect_options: dict[str, Any] = field(default_factory=dict)
    worker_options: dict[str, Any] = field(default_factory=dict)
    scheduler_options: dict[str, Any] = field(default_factory=dict)
    python: str | None = None

    def _validate(self) -> None:
        if len(self.hosts) < 2:
            raise invalid_value(
                "hosts", "list the scheduler host first, then at least one worker host "
                "(repeat a host to run both on it)", self.hosts,
            )


@dataclass(frozen=True, kw_only=True)
class SlurmSpec(Section):
    """``kind: slurm`` — ``dask_jobqueue.SLURMCluster`` (extra ``jobqueue``), scaled to
    ``jobs`` batch jobs of ``cores`` cores and ``memory`` each, ``processes`` worker processes per
    job. The scheduler runs where the pipeline runs; ``scheduler_options`` go to it unchanged (e.g.
    ``host``: the address the compute nodes reach it at; its dashboard stays on 127.0.0.1 unless
    ``dashboard_address`` says otherwise); ``worker_extra_args`` are added to each job's
    ``dask worker`` command (e.g. ``["--interface", "ib0"]``). ``log_directory``: where the jobs' output files go
    (SLURM's working directory if null); they hold worker logs, so keep them on the owner's side."""

    kind: Literal["slurm"] = "slurm"
    queue: str | None = None
    account: str | None = None
    cores: int = field(metadata=bound(ge=1))
    memory: str = field(metadata=MEMORY)
    walltime: str = "01:00:00"
    jobs: int = field(default=1, metadata=bound(ge=1))
    job_extra_directives: list[str] = field(default_factory=list)
    python: str | None = None
    processes: int = field(default=1, metadata=bound(ge=1))
    scheduler_options: dict[str, Any] = field(default_factory=dict)
    worker_extra_args: list[str] = field(default_factory=list)
    log_directory: str | None = None

    def _validate(self) -> None:
        if self.processes > self.cores:
            raise invalid_value("processes", f"at most cores ({self.cores}) worker processes per job", self.processes)
        if self.memory == "auto":
            raise invalid_value("memory", "give the memory of one job, e.g. '16GB'", self.memory)
        if not re.fullmatch(r"(\d+-)?\d+(:\d\d){0,2}", self.walltime):
            raise invalid_value(
                "walltime", "expected a SLURM time such as '01:00:00' or '2-00:00:00'", self.walltime
            )


@dataclass(frozen=True, kw_only=True)
class KubernetesResources(Section):
    """``resources`` of a Kubernetes worker pod: used as both requests and limits."""

    _key: ClassVar[str] = "resources"
    cpu: str | int | float
    memory: str


@dataclass(frozen=True, kw_only=True)
class KubernetesSpec(Section):
    """``kind: kubernetes`` — ``dask_kubernetes.operator.KubeCluster`` (extra
    ``kubernetes``); needs the Dask operator in the cluster and an ``image`` with
    kahm-dask installed."""

    kind: Literal["kubernetes"] = "kubernetes"
    image: str
    n_workers: int = field(default=2, metadata=bound(ge=1))
    resources: KubernetesResources | None = None
    namespace: str | None = None


ClusterSpec = LocalSpec | RemoteSpec | SSHSpec | SlurmSpec | KubernetesSpec
_SPECS: dict[str, type[Section]] = {
    "local": LocalSpec,
    "remote": RemoteSpec,
    "ssh": SSHSpec,
    "slurm": SlurmSpec,
    "kubernetes": KubernetesSpec,
}


def load_cluster_config(path: str | os.PathLike[str]) -> ClusterSpec:
    """Load and strictly validate a ``cluster_configs/*.yaml`` file."""
    raw = load_yaml(path)
    try:
        return _spec_from_mapping(raw)
    except ConfigError as exc:
        raise exc.located(os.fspath(path)) from None


def _spec_from_mapping(raw: Any) -> ClusterSpec:
    if not isinstance(raw, dict):
        raise ConfigError("wrong top-level type", f": expected a mapping, got {raw!r}")
    kinds = ", ".join(_SPECS)
    if "kind" not in raw:
        raise ConfigError("missing required key 'kind'", f"; one of {kinds}", key="kind")
    if raw["kind"] not in _SPECS:
        raise invalid_value("kind", f"expected one of {kinds}", raw["kind"])
    return _SPECS[raw["kind"]].from_mapping(raw)
