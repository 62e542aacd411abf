"""Where the work runs: a LocalCluster, a running scheduler, or a cluster config file.

:func:`connect` turns the ``cluster`` section of a pipeline config into a
``distributed.Client``, by priority:

1. ``scheduler`` — connect to a running scheduler by address;
2. ``config`` — build the cluster a ``cluster_configs/*.yaml`` file describes
   (:func:`load_cluster_config`, :func:`build_cluster`);
3. otherwise a ``LocalCluster(n_workers, threads_per_worker, memory_limit, processes)``
   (:func:`local_cluster`; optionally with resources per worker).

**TLS.** A ``tls`` section (:mod:`kahm_dask.pipeline.cluster.security`) makes the connection to a
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

**Freed memory reused.** Dask starts worker processes with ``MALLOC_TRIM_THRESHOLD_=65536``,
which pins glibc's mmap threshold at 128 KiB: each NumPy temporary larger than that is mapped
afresh, page-faulted in and unmapped when freed. Every worker process of a cluster reached through
:func:`connect` gets the :class:`ReusedHeap` plugin. On workers with at least 4 GiB of memory limit
(or none), it sets glibc's thresholds to the ceilings of glibc's own adaptive rule (mmap above
32 MiB, trim above 64 MiB), and returns the free memory to the OS whenever the process holds more
than half its limit. Smaller workers keep Dask's setting: on the 1 GiB workers of the
larger-than-memory run, the memory kept for reuse held a worker paused above Dask's 80 % pause
fraction, and the run never finished.

Measured on MNIST (60 per-cluster tasks, 2 workers × 1 thread, one sitting), the tasks' summed
time fell from 29.5 s to 24.7 s and the fit from 20.4 s to 17.6 s. A process pool given Dask's
setting reproduced the loss.

**Task code loaded up front.** Every worker process reached through :func:`connect` gets the
:class:`TaskCode` plugin, which imports the pipeline's task modules (Zarr, dask.array, training
and prediction) when the worker joins. Without it each worker imported them in its first task
(0.7–0.9 s here), inside the first stage of the first fit, with the other workers waiting at the
stage's end. The modules take about 90 MiB, so workers with less than 4 GiB of memory limit
import them on first use, as before.

**The user's own client.** A ``Client`` the user started (``Client(n_workers=2)``, a cluster
reached by address) and handed to the estimator, or found as the current client, gets the same
plugins once (:func:`prepare_workers`, called by the estimator before it computes there): without
them its worker processes keep Dask's allocator setting. Workers running in the client's own
process (``processes=False``) are left as they are.

**Logs.** The scheduler and nannies of a local cluster run in the client's process and log
through its ``distributed`` loggers; its workers log at Dask's configured level
``logging.distributed`` (the ``silence_logs`` of the cluster; default WARNING, as
``LocalCluster``'s).
"""

from kahm_dask.pipeline.cluster.build import build_cluster, local_cluster, warn_exposed_dashboard
from kahm_dask.pipeline.cluster.compute import compute
from kahm_dask.pipeline.cluster.connect import DEFAULT_TIMEOUT, ClusterConnectionError, connect, connect_address
from kahm_dask.pipeline.cluster.plugins import (
    BLAS_ENV,
    IgnoreInterrupts,
    ReusedHeap,
    SingleThreadedBLAS,
    TaskCode,
    blas_limited_here,
    prepare_workers,
    register_worker_plugins,
)
from kahm_dask.pipeline.config.cluster_files import (
    ClusterSpec,
    KubernetesResources,
    KubernetesSpec,
    LocalSpec,
    RemoteSpec,
    SlurmSpec,
    SSHSpec,
    load_cluster_config,
)

__all__ = [
    "BLAS_ENV",
    "DEFAULT_TIMEOUT",
    "ClusterConnectionError",
    "SingleThreadedBLAS",
    "ReusedHeap",
    "IgnoreInterrupts",
    "TaskCode",
    "blas_limited_here",
    "prepare_workers",
    "register_worker_plugins",
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
    "warn_exposed_dashboard",
    "connect",
    "connect_address",
    "compute",
]
