"""Where the work runs: a LocalCluster, a running scheduler, or a cluster config file.

:func:`connect` turns the ``cluster`` section of a pipeline config into a
``distributed.Client``, by priority:

1. ``scheduler`` — connect to a running scheduler by address;
2. ``config`` — build the cluster a ``cluster_configs/*.yaml`` file describes
   (:func:`load_cluster_config`, :func:`build_cluster`);
3. otherwise a ``LocalCluster(n_workers, threads_per_worker, memory_limit, processes)``
   (:func:`local_cluster`; optionally with resources per worker).

**TLS.** A ``tls`` section (:mod:`kahm_dask.pipeline.security`) makes the connection to a
``tls://`` scheduler mutual TLS (``Client(address, security=...)``), or the local cluster's
scheduler, workers and client talk mutual TLS on loopback. :func:`connect_address` connects
to an address with a ready ``distributed.security.Security``.

:func:`compute` runs a dask collection on the client, each task retried up to twice.

**One BLAS thread per Dask thread.** Several BLAS threads inside each Dask thread oversubscribe
the cores (measured on a 2-core machine: per-cluster tasks twice as slow, ``eigh(1000)`` 6-9 s
instead of 0.1 s). Measured with distributed 2026.8: ``LocalCluster(env=...)`` does *not* work
for this — the nanny sets those variables in the worker after NumPy has loaded OpenBLAS — while
``distributed.nanny.pre-spawn-environ`` does, but a variable already set in the client's
environment overrides it. So:

* clusters started here get ``OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = MKL_NUM_THREADS = 1``
  through ``distributed.nanny.pre-spawn-environ`` (set before the worker process starts);
* every worker *process* (local, remote, SSH, SLURM, Kubernetes) also gets the
  :class:`SingleThreadedBLAS` worker plugin, which loads NumPy's and SciPy's BLAS and limits
  them to one thread with threadpoolctl — this also covers workers this module did not start
  and environments that override the variables. On a remote scheduler the plugin stays
  registered after disconnecting (one BLAS thread per Dask thread is Dask's own default);
* a threaded LocalCluster (``processes: false``) runs in the client's process, so
  :func:`connect` limits BLAS there for as long as the client is open, then restores it.

**Logs.** The scheduler and nannies of a local cluster run in the client's process and log
through its ``distributed`` loggers; its workers log at Dask's configured level
``logging.distributed`` (the ``silence_logs`` of the cluster; default WARNING, as
``LocalCluster``'s).
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar, Literal

import dask
from distributed import Client, LocalCluster, Nanny, Scheduler, SpecCluster, Worker
from distributed.deploy import Cluster
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.security import Security
from threadpoolctl import threadpool_limits

from kahm_dask.pipeline.config import (
    ADDRESS,
    DASHBOARD,
    DASHBOARD_RULE,
    MEMORY,
    ClusterConfig,
    ConfigError,
    Section,
    bound,
    dashboard_is_local,
    invalid_value,
    load_yaml,
)
from kahm_dask.pipeline.progress import Progress, as_progress
from kahm_dask.pipeline.security import ALL_ROLES, TLS_PROTOCOL, TLSConfig, check_address, to_security
from kahm_dask.privacy.randomness import PrivacyLeakWarning

__all__ = [
    "BLAS_ENV",
    "DEFAULT_TIMEOUT",
    "ClusterConnectionError",
    "SingleThreadedBLAS",
    "IgnoreInterrupts",
    "LocalSpec",
    "RemoteSpec",
    "SSHSpec",
    "SlurmSpec",
    "KubernetesResources",
    "KubernetesSpec",
    "ClusterSpec",
    "load_cluster_config",
    "local_cluster",
    "build_cluster",
    "connect",
    "connect_address",
    "compute",
]

logger = logging.getLogger(__name__)

BLAS_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
DEFAULT_TIMEOUT = 10.0  # seconds to wait for a scheduler address to answer


class ClusterConnectionError(ConnectionError):
    """The scheduler named by an address did not answer in time."""


# --------------------------------------------------------------------------- BLAS threads


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

    Ctrl-C in a terminal reaches every process of its foreground group, so each worker process
    printed its own traceback. The client process alone handles it now (one line), and closing
    the cluster stops the workers.
    """

    name = "kahm-dask-ignore-interrupts"

    def setup(self, worker: Any) -> None:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():  # signals are set there only
            signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def _blas_limited_here() -> Iterator[None]:
    """Limit this process's BLAS to one thread (for workers running in this process)."""
    _load_blas()
    with threadpool_limits(limits=1, user_api="blas"):
        yield


# --------------------------------------------------------------------------- cluster specs


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
    address needs ``tls`` (this client's certificate; :mod:`kahm_dask.pipeline.security`)."""

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
    ``Nanny`` (e.g. ``nthreads``, ``memory_limit``), ``scheduler_options`` to the scheduler.
    """

    kind: Literal["ssh"] = "ssh"
    hosts: list[str]
    connect_options: dict[str, Any] = field(default_factory=dict)
    worker_options: dict[str, Any] = field(default_factory=dict)
    scheduler_options: dict[str, Any] = field(default_factory=dict)

    def _validate(self) -> None:
        if len(self.hosts) < 2:
            raise invalid_value(
                "hosts", "list the scheduler host first, then at least one worker host "
                "(repeat a host to run both on it)", self.hosts,
            )


@dataclass(frozen=True, kw_only=True)
class SlurmSpec(Section):
    """``kind: slurm`` — ``dask_jobqueue.SLURMCluster`` (extra ``jobqueue``), scaled to
    ``jobs`` batch jobs of ``cores`` cores and ``memory`` each."""

    kind: Literal["slurm"] = "slurm"
    queue: str | None = None
    account: str | None = None
    cores: int = field(metadata=bound(ge=1))
    memory: str = field(metadata=MEMORY)
    walltime: str = "01:00:00"
    jobs: int = field(default=1, metadata=bound(ge=1))
    job_extra_directives: list[str] = field(default_factory=list)
    python: str | None = None

    def _validate(self) -> None:
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


# --------------------------------------------------------------------------- building


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


def _ssh_cluster(spec: SSHSpec) -> Cluster:
    _import_extra("asyncssh", "ssh", spec.kind)  # SSHCluster imports it only when starting
    from distributed.deploy.ssh import SSHCluster

    return SSHCluster(
        hosts=spec.hosts,
        connect_options=spec.connect_options,
        worker_options=spec.worker_options,
        scheduler_options=spec.scheduler_options,
    )


def _slurm_cluster(spec: SlurmSpec) -> Cluster:
    jobqueue = _import_extra("dask_jobqueue", "jobqueue", spec.kind)
    optional = {"python": spec.python} if spec.python is not None else {}
    cluster = jobqueue.SLURMCluster(
        queue=spec.queue,
        account=spec.account,
        cores=spec.cores,
        memory=spec.memory,
        walltime=spec.walltime,
        job_extra_directives=spec.job_extra_directives,
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


# --------------------------------------------------------------------------- connecting


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
    (:func:`~kahm_dask.pipeline.security.check_address`; ``address_key`` and ``security_key``
    name the two in its error). :class:`ClusterConnectionError` if the scheduler does not
    answer within ``timeout`` seconds or refuses this client. The workers run one BLAS thread
    per Dask thread (module docstring).
    """
    check_address(address, security is not None, address_key=address_key, tls_key=security_key)
    with _client_for_address(address, timeout, security) as client:
        client.register_plugin(SingleThreadedBLAS())
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
    cluster runs mutual TLS on loopback (:mod:`kahm_dask.pipeline.security`).
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
            stack.enter_context(_blas_limited_here())
        cluster = stack.enter_context(
            local_cluster(spec, worker_resources) if isinstance(spec, LocalSpec) else build_cluster(spec)
        )
        client = stack.enter_context(Client(cluster))
        if not in_process:
            client.register_plugin(SingleThreadedBLAS())
            client.register_plugin(IgnoreInterrupts())
        logger.info("Dask dashboard: %s", client.dashboard_link)
        yield client


def compute(job: Any, client: Client | None, *, progress: Progress | bool = False, label: str | None = None) -> Any:
    """Compute the dask collection ``job`` on ``client`` (every task retried up to twice) and
    return its result; without a client, on Dask's default scheduler. With a ``label``, the
    ``progress`` (:mod:`kahm_dask.pipeline.progress`; True: the console) shows it as a stage:
    a bar of its tasks on a client, its time without one."""
    progress = as_progress(progress)
    if client is None:
        with progress.stage(label) if label else nullcontext():
            return dask.compute(job)[0]
    futures = client.compute(job, retries=2)
    if label:
        progress.tasks(label, futures, client)
    return client.gather(futures)
