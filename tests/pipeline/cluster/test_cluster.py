"""Where the work runs: LocalCluster, a real remote scheduler, cluster config files, and
one BLAS thread per Dask thread in every worker."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import dask
import pytest
from distributed import Client
from distributed.diagnostics.plugin import WorkerPlugin
from threadpoolctl import threadpool_info, threadpool_limits

from kahm_dask.pipeline.cluster import (
    ClusterConnectionError,
    KubernetesSpec,
    LocalSpec,
    RemoteSpec,
    ReusedHeap,
    SlurmSpec,
    SSHSpec,
    build_cluster,
    connect,
    load_cluster_config,
    local_cluster,
)
from kahm_dask.pipeline.config import ClusterConfig, ConfigError
from tests._kit import CLUSTER_CONFIGS as CONFIG_DIR
from tests._kit import make_authority, start_session, stop_sessions

BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _worker_blas() -> dict:
    """Runs on a worker: the thread count of every BLAS library and the BLAS variables."""
    import scipy.linalg  # noqa: F401 - loads SciPy's own OpenBLAS next to NumPy's

    return {
        "pid": os.getpid(),
        "blas": {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"},
        "env": {name: os.environ.get(name) for name in BLAS_VARS},
    }


def _mmapped_bytes_for_a_4_mib_array() -> int:
    """Runs in a process: how much glibc's mmapped memory grows while a 4 MiB array lives
    (``mallinfo2().hblkhd``); 0 when the block comes from the heap. Skips off glibc."""
    import ctypes

    import numpy as np

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                         "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        pytest.skip("needs glibc 2.33 or newer")
    mallinfo2.restype = MallInfo2
    before = mallinfo2().hblkhd
    block = np.ones(1 << 19)  # 4 MiB
    grown = mallinfo2().hblkhd - before
    del block
    return int(grown)


def _rss_after_freeing_fragments(keep_thresholds_only: bool = False) -> dict:
    """Runs in a process: allocate 600 blocks of 1 MiB, free nine in ten (the freed memory lies
    between live blocks, so glibc keeps it), wait 1 s, and report the resident memory then.
    ``keep_thresholds_only``: set the plugin's thresholds here first (the control: no check)."""
    import numpy as np
    import psutil

    from kahm_dask.pipeline.cluster.plugins import set_malloc_thresholds

    if keep_thresholds_only:
        set_malloc_thresholds()
    blocks = [np.ones(1 << 17) for _ in range(600)]
    peak = psutil.Process().memory_info().rss
    kept = blocks[::10]
    del blocks
    time.sleep(1.0)
    return {"peak": peak, "after": psutil.Process().memory_info().rss, "kept": len(kept)}


def _on_every_worker(client: Client, func) -> dict:
    """Run ``func`` as a task on each worker; results by worker address. Waits for every worker
    the client's cluster started to reach the scheduler first (a worker process can be up before
    its registration has arrived: seen under load, one suite run in several)."""
    if client.cluster is not None and client.cluster.workers:
        client.wait_for_workers(len(client.cluster.workers), timeout=60)
    workers = list(client.scheduler_info(n_workers=-1)["workers"])
    futures = {w: client.submit(func, workers=[w], pure=False) for w in workers}
    return {w: f.result(timeout=60) for w, f in futures.items()}


def _blas_threads_here() -> set[int]:
    return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


# --------------------------------------------------------------------------- LocalCluster


def test_local_threads_run_tasks_with_single_threaded_blas(caplog):
    with threadpool_limits(limits=2, user_api="blas"):
        caplog.set_level(logging.INFO, logger="kahm_dask.pipeline.cluster")
        with connect(ClusterConfig(n_workers=2, processes=False)) as client:
            assert client.submit(sum, [1, 2, 3]).result() == 6
            results = _on_every_worker(client, _worker_blas)
            assert len(results) == 2
            assert all(set(r["blas"].values()) == {1} for r in results.values())
            assert f"Dask dashboard: {client.dashboard_link}" in caplog.text
        assert _blas_threads_here() == {2}  # the client's process is restored on exit


def test_local_processes_run_tasks_with_blas_env_set_before_spawn():
    with connect(ClusterConfig(n_workers=2, processes=True)) as client:
        assert client.submit(sum, [1, 2, 3]).result() == 6
        results = _on_every_worker(client, _worker_blas)
    assert len({r["pid"] for r in results.values()}) == 2
    assert {r["pid"] for r in results.values()}.isdisjoint({os.getpid()})
    for r in results.values():
        assert r["env"] == dict.fromkeys(BLAS_VARS, "1")
        assert len(r["blas"]) >= 2  # NumPy's and SciPy's OpenBLAS
        assert set(r["blas"].values()) == {1}


def _task_modules_loaded() -> dict[str, bool]:
    from kahm_dask.pipeline.cluster.plugins import TASK_MODULES

    return {name: name in sys.modules for name in TASK_MODULES}


def test_worker_processes_have_the_task_code_imported_before_their_first_task():
    with connect(ClusterConfig(n_workers=2, processes=True)) as client:
        loaded = _on_every_worker(client, _task_modules_loaded)
    assert len(loaded) == 2
    assert all(all(modules.values()) for modules in loaded.values()), loaded


def test_a_worker_with_a_small_memory_limit_imports_the_task_code_only_when_used():
    """The task modules take about 90 MiB: a 1 GiB worker (below the plugin's minimum) keeps them
    out until a task needs them."""
    with connect(ClusterConfig(n_workers=1, processes=True, memory_limit="1GiB")) as client:
        (loaded,) = _on_every_worker(client, _task_modules_loaded).values()
    assert not all(loaded.values()), loaded


def test_without_the_plugin_a_fresh_worker_process_lacks_the_task_code():
    """The control: a plain LocalCluster's worker has not imported the task modules, so the test
    above sees the plugin's work."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        (loaded,) = _on_every_worker(client, _task_modules_loaded).values()
    assert not all(loaded.values()), loaded


def test_the_users_own_client_gets_the_plugins_once_and_a_threaded_one_none():
    """A LocalCluster the user started (the control above lacks the plugins) gets them when the
    estimator computes there (prepare_workers), once per client; a threaded cluster, whose
    workers run in this process, is left alone (the plugins would change this process)."""
    from distributed import LocalCluster

    from kahm_dask.pipeline.cluster import prepare_workers
    from kahm_dask.pipeline.estimator.clients import current_client

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        assert current_client() is client
        (loaded,) = _on_every_worker(client, _task_modules_loaded).values()
        assert all(loaded.values()), loaded
        (grown,) = _on_every_worker(client, _mmapped_bytes_for_a_4_mib_array).values()
        assert grown == 0  # ReusedHeap's thresholds, not Dask's
        registered = client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.worker_plugins))
        assert {"kahm-dask-reused-heap", "kahm-dask-task-code"} <= set(registered)
        prepare_workers(client)  # a second call registers nothing more
        assert client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.worker_plugins)) == registered
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        prepare_workers(client)
        names = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.worker_plugins))
        assert not [name for name in names if name.startswith("kahm-dask")], names


def test_local_worker_processes_reuse_freed_blocks_instead_of_mapping_each():
    # Dask's MALLOC_TRIM_THRESHOLD_ pins glibc's mmap threshold at 128 KiB; the ReusedHeap
    # plugin raises it to 32 MiB, so a 4 MiB temporary comes from the heap (none is mmapped).
    with connect(ClusterConfig(n_workers=1, processes=True)) as client:
        (grown,) = _on_every_worker(client, _mmapped_bytes_for_a_4_mib_array).values()
    assert grown == 0


def test_a_worker_with_a_small_memory_limit_keeps_dasks_setting():
    # Below MIN_MEMORY_LIMIT the memory a heap keeps is a large share of the limit: the plugin
    # leaves Dask's setting, and the 4 MiB temporary is mapped and unmapped as before.
    with connect(ClusterConfig(n_workers=1, processes=True, memory_limit="1GiB")) as client:
        (grown,) = _on_every_worker(client, _mmapped_bytes_for_a_4_mib_array).values()
    assert grown >= 4 << 20


def test_the_mmap_measure_sees_dasks_setting_map_a_4_mib_array():
    # The control of the test above: in a process started with Dask's variable, the same
    # 4 MiB array is one fresh mmap.
    code = ("from tests.pipeline.cluster.test_cluster import _mmapped_bytes_for_a_4_mib_array as f; "
            "print(f())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         cwd=Path(__file__).parents[3], env={**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536"})
    assert int(out.stdout) >= 4 << 20


def test_memory_kept_for_reuse_is_returned_before_it_nears_the_memory_limit():
    # With a limit, the plugin returns free heap memory while the process holds more than half
    # of it: the 540 MiB freed between live blocks must not stay (it would count as unmanaged
    # memory towards Dask's pause threshold, and a paused worker whose memory is only kept never
    # resumes).
    with connect(ClusterConfig(n_workers=1, processes=True, memory_limit="1GiB")) as client:
        client.register_plugin(ReusedHeap(min_memory_limit=0))  # 1 GiB is below the default minimum
        (r,) = _on_every_worker(client, _rss_after_freeing_fragments).values()
    assert r["peak"] > 600 << 20
    assert r["after"] < r["peak"] - (400 << 20)


def test_the_freed_fragments_stay_without_the_check():
    # The control: the same thresholds without the check keep the freed memory resident.
    code = ("from tests.pipeline.cluster.test_cluster import _rss_after_freeing_fragments as f; "
            "r = f(True); print(r['peak'], r['after'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         cwd=Path(__file__).parents[3])
    peak, after = map(int, out.stdout.split())
    assert after > peak - (100 << 20)


def test_worker_blas_is_limited_even_when_the_environment_says_otherwise(monkeypatch):
    # A variable in the client's environment beats distributed's pre-spawn-environ, and a
    # user's dask config may drop it; the worker plugin still limits BLAS to one thread.
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    with dask.config.set({"distributed.nanny.pre-spawn-environ": {}}):
        with connect(ClusterConfig(n_workers=1, processes=True)) as client:
            (result,) = _on_every_worker(client, _worker_blas).values()
    assert result["env"]["OPENBLAS_NUM_THREADS"] == "2"
    assert set(result["blas"].values()) == {1}


def test_local_workers_advertise_the_given_resources_with_single_threaded_blas():
    resources = [{"site0": 1, "site2": 1}, {"site1": 1}]
    with threadpool_limits(limits=2, user_api="blas"):
        with connect(ClusterConfig(n_workers=2, processes=False), worker_resources=resources) as client:
            workers = client.scheduler_info()["workers"].values()
            assert {w["name"]: w["resources"] for w in workers} == {"worker0": resources[0],
                                                                    "worker1": resources[1]}
            results = _on_every_worker(client, _worker_blas)
            assert all(set(r["blas"].values()) == {1} for r in results.values())
        assert _blas_threads_here() == {2}


def test_worker_resources_need_one_mapping_per_worker_of_a_local_cluster():
    with pytest.raises(ValueError, match="resources for 1 workers; the cluster has 2"):
        local_cluster(LocalSpec(n_workers=2), [{"site0": 1}])
    with pytest.raises(ValueError, match="worker_resources apply to a local cluster"):
        with connect(ClusterConfig(scheduler="tcp://127.0.0.1:8786"), worker_resources=[{}]):
            pass


def test_cluster_and_client_close_on_exception():
    with pytest.raises(RuntimeError, match="boom"):
        with connect(ClusterConfig(n_workers=1, processes=False)) as client:
            cluster = client.cluster
            raise RuntimeError("boom")
    assert client.status == "closed"
    assert cluster.status.name == "closed"


def _logging_disabled_at() -> int:
    """Runs on a worker: the level at and below which its process logs nothing (0: logging on)."""
    return logging.root.manager.disable


def test_a_local_worker_process_survives_ctrl_c_with_its_logging_off():
    # Ctrl-C reaches the worker processes too. A worker must neither raise (a traceback each)
    # nor log the cluster's closing that follows (a heartbeat to the closed scheduler printed
    # an ERROR traceback on CI): logging off until the process ends.
    import signal

    with connect(ClusterConfig(n_workers=1, processes=True)) as client:
        (pid,) = client.run(os.getpid).values()
        assert list(client.run(_logging_disabled_at).values()) == [0]  # the control: on before
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + 30
        while client.run(_logging_disabled_at)[next(iter(client.scheduler_info()["workers"]))] != logging.CRITICAL:
            assert time.monotonic() < deadline, "the worker's logging is still on after SIGINT"
            time.sleep(0.05)
        assert client.submit(sum, [1, 2], pure=False).result() == 3  # the worker still works
        assert list(client.run(os.getpid).values()) == [pid]


#: Logging levels disabled when an in-process worker closed, as _LoggingAtTeardown saw them.
_AT_TEARDOWN: list[int] = []


class _LoggingAtTeardown(WorkerPlugin):
    """Records the logging level disabled when the worker closes, in ``_AT_TEARDOWN`` (the
    plugin reaches the worker as a copy, so a module global, not an attribute)."""

    def teardown(self, worker) -> None:
        _AT_TEARDOWN.append(logging.root.manager.disable)


def test_ctrl_c_closes_the_cluster_with_logging_off_and_is_raised_again():
    _AT_TEARDOWN.clear()
    with pytest.raises(KeyboardInterrupt):
        with connect(ClusterConfig(n_workers=1, processes=False)) as client:
            client.register_plugin(_LoggingAtTeardown())
            raise KeyboardInterrupt
    assert client.status == "closed"
    assert _AT_TEARDOWN == [logging.CRITICAL]  # the cluster closed quietly
    assert logging.root.manager.disable == 0  # and this process logs again


def test_another_error_closes_the_cluster_with_logging_on():
    _AT_TEARDOWN.clear()  # the control of the test above
    with pytest.raises(RuntimeError):
        with connect(ClusterConfig(n_workers=1, processes=False)) as client:
            client.register_plugin(_LoggingAtTeardown())
            raise RuntimeError("boom")
    assert _AT_TEARDOWN == [0]


def test_connect_builds_from_a_cluster_config_file(tmp_path):
    path = tmp_path / "local.yaml"
    path.write_text("kind: local\nn_workers: 1\nprocesses: false\nmemory_limit: 1GiB\n")
    with connect(ClusterConfig(config=path)) as client:
        assert client.submit(sum, [4, 5]).result() == 9
        assert len(client.scheduler_info()["workers"]) == 1


# --------------------------------------------------------------------------- remote




def _wait_for_scheduler_file(path: Path, proc: subprocess.Popen, log: Path) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dask scheduler exited:\n{log.read_text()}")
        if path.exists():
            try:
                return json.loads(path.read_text())["address"]
            except (json.JSONDecodeError, KeyError):
                pass  # being written
        time.sleep(0.1)
    raise TimeoutError(f"no scheduler file after 60 s:\n{log.read_text()}")


@pytest.fixture(scope="module")
def scheduler_address(tmp_path_factory) -> str:
    """A real scheduler and one worker, as subprocesses; always stopped afterwards."""
    tmp = tmp_path_factory.mktemp("remote")
    scheduler_file = tmp / "scheduler.json"
    dask_cli = [sys.executable, "-m", "dask"]
    procs = []
    try:
        log = tmp / "scheduler.log"
        procs.append(start_session(
            [*dask_cli, "scheduler", "--host", "127.0.0.1", "--port", "0",
             "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(scheduler_file)],
            log,
        ))
        address = _wait_for_scheduler_file(scheduler_file, procs[0], log)
        procs.append(start_session(
            [*dask_cli, "worker", "--scheduler-file", str(scheduler_file),
             "--nthreads", "1", "--nworkers", "1", "--no-dashboard"],
            tmp / "worker.log",
        ))
        with Client(address, timeout=30) as client:
            client.wait_for_workers(1, timeout=60)
        yield address
    finally:
        stop_sessions(procs[::-1], timeout=15)


def test_remote_scheduler_by_address(scheduler_address):
    with connect(ClusterConfig(scheduler=scheduler_address)) as client:
        assert client.submit(sum, [1, 2]).result(timeout=30) == 3
        (result,) = _on_every_worker(client, _worker_blas).values()
    assert set(result["blas"].values()) == {1}
    with Client(scheduler_address, timeout=10) as client:  # only our client went away
        assert len(client.scheduler_info()["workers"]) == 1


def test_remote_scheduler_from_a_cluster_config_file(scheduler_address, tmp_path):
    path = tmp_path / "remote.yaml"
    path.write_text(f"kind: remote\naddress: {scheduler_address}\n")
    assert load_cluster_config(path) == RemoteSpec(address=scheduler_address)
    with connect(ClusterConfig(config=path)) as client:
        assert client.submit(pow, 2, 5).result(timeout=30) == 32


def test_unreachable_scheduler_fails_fast_naming_the_address():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
    start = time.monotonic()
    with pytest.raises(ClusterConnectionError, match=f"cannot reach the Dask scheduler at {address}"):
        with connect(ClusterConfig(scheduler=address), timeout=1):
            pass
    assert time.monotonic() - start < 10


# --------------------------------------------------------------------------- config files

SHIPPED = {
    "local.yaml": LocalSpec,
    "remote.yaml": RemoteSpec,
    "ssh.yaml": SSHSpec,
    "slurm.yaml": SlurmSpec,
    "kubernetes.yaml": KubernetesSpec,
}


@pytest.mark.parametrize("name, spec_type", SHIPPED.items())
def test_shipped_cluster_configs_load_and_validate(name, spec_type):
    spec = load_cluster_config(CONFIG_DIR / name)
    assert type(spec) is spec_type
    assert spec.kind == name.removesuffix(".yaml")
    assert spec_type.from_mapping(spec.to_dict()) == spec


def test_shipped_remote_config_address():
    assert load_cluster_config(CONFIG_DIR / "remote.yaml").address == "tcp://127.0.0.1:8786"


def test_shipped_remote_tls_config_loads_with_its_certificates(tmp_path, monkeypatch):
    """remote_tls.yaml names tls/*.pem relative to the working directory; they must exist."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="invalid value for 'tls.ca_file' in .*remote_tls.yaml: no such file"):
        load_cluster_config(CONFIG_DIR / "remote_tls.yaml")
    make_authority(tmp_path / "tls", "example", ("client",))
    spec = load_cluster_config(CONFIG_DIR / "remote_tls.yaml")
    assert type(spec) is RemoteSpec and spec.address == "tls://127.0.0.1:8786"
    assert (spec.tls.ca_file, spec.tls.key) == (tmp_path / "tls" / "ca.pem", tmp_path / "tls" / "client-key.pem")
    assert spec.tls.require_encryption and RemoteSpec.from_mapping(spec.to_dict()) == spec


@pytest.mark.parametrize(
    "text, message",
    [
        ("kind: local\nn_worker: 2\n", "unknown key 'n_worker'.*valid keys: kind, n_workers"),
        ("n_workers: 2\n", "missing required key 'kind'.*one of local, remote, ssh, slurm, kubernetes"),
        ("kind: yarn\n", "invalid value for 'kind'.*one of local, remote"),
        ("kind: local\nprocesses: 'no'\n", "'processes'.*expected bool"),
        ("kind: remote\n", "missing required key 'address'"),
        ("kind: remote\naddress: 127.0.0.1:8786\n", "'address'.*tcp://"),
        ("kind: ssh\nhosts: [a]\n", "'hosts'.*at least one worker host"),
        ("kind: ssh\nhosts: a\n", "'hosts'.*a list of strings"),
        ("kind: slurm\ncores: 4\n", "missing required key 'memory'"),
        ("kind: slurm\ncores: 4\nmemory: 8GB\nwalltime: 2h\n", "'walltime'.*SLURM time"),
        ("kind: slurm\ncores: 4\nmemory: 8GB\njobs: 0\n", "'jobs'.*>= 1"),
        ("kind: slurm\ncores: 1\nmemory: 8GB\nprocesses: 2\n", "'processes'.*at most cores"),
        ("kind: kubernetes\nimage: x\nresources: {cpu: 1, memory: 1Gi, gpu: 1}\n",
         "unknown key 'resources.gpu'"),
        ("- kind: local\n", "expected a mapping"),
    ],
)
def test_cluster_config_validation(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_cluster_config(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "name, module, extra",
    [("ssh.yaml", "asyncssh", "ssh"),
     ("slurm.yaml", "dask_jobqueue", "jobqueue"),
     ("kubernetes.yaml", "dask_kubernetes", "kubernetes")],
)
def test_build_cluster_names_the_missing_extra(monkeypatch, name, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # missing, even where it is installed
    spec = load_cluster_config(CONFIG_DIR / name)
    with pytest.raises(ImportError, match=f'pip install "kahm-dask\\[{extra}\\]"'):
        build_cluster(spec)


def test_build_cluster_rejects_remote_specs():
    with pytest.raises(ValueError, match="no cluster to build"):
        build_cluster(RemoteSpec(address="tcp://127.0.0.1:8786"))


def test_a_heartbeat_failure_is_dropped_only_while_its_worker_closes():
    """The ERROR (with tracebacks) distributed logs when a heartbeat meets the connections a
    closing worker shuts is not shown; the same failure of a running worker, and any other record, are."""
    from distributed.core import Status

    from kahm_dask.pipeline.cluster.plugins import _HeartbeatWhileClosing

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, message, None, None)

    class Worker:  # a stand-in with a worker's status (and a weak reference, as a worker has)
        status = Status.running

    worker = Worker()
    quiet = _HeartbeatWhileClosing(worker)
    heartbeat = record("Failed to communicate with scheduler during heartbeat.")
    assert quiet.filter(heartbeat) and quiet.filter(record("Unexpected exception during heartbeat."))
    for status in (Status.closing, Status.closing_gracefully, Status.closed):
        worker.status = status
        assert not quiet.filter(heartbeat) and quiet.filter(record("Compute Failed"))
