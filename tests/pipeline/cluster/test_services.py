"""The pipeline on the clusters people run, for real: SLURM batch jobs and hosts over SSH.

CI starts a single-node SLURM (``.ci/slurm.sh``) and these tests start an sshd on loopback
(:mod:`tests._services`). The run is the slow tests' synthetic DP pipeline
(:data:`tests._kit.SYNTHETIC_RUN`), started from the stored noisy rows of the LocalCluster's
baseline run (``start_from_noise_of``: the noise is secure and never drawn twice), so training
and prediction must equal the LocalCluster's bit for bit. The SLURM run also loses a worker job
(``scancel``) mid-training and must finish on the other, and leave no job behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests._kit import (
    SYNTHETIC_RUN,
    assert_same_fingerprint,
    complete_clusters,
    n_planned_clusters,
    pipeline_file,
    run_fingerprint,
    run_stores,
    staged_model,
    start_from_noise_of,
    wait_for,
)
from tests._services import report_service_time, require_slurm, slurm_jobs, sshd

pytestmark = pytest.mark.slow

RUN_TIMEOUT = 900


def _baseline_seconds(baseline_run: Path) -> float:
    return json.loads((Path(baseline_run).parent / "metrics.json").read_text())["wall_seconds"]


def _start_run(cfg: Path, log: Path) -> subprocess.Popen:
    """``kahm-dask run cfg`` as a user starts it, in its own process."""
    return subprocess.Popen([sys.executable, "-m", "kahm_dask.cli", "run", str(cfg), "--no-progress"],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=os.environ.copy())


def _finish(proc: subprocess.Popen, log: Path) -> None:
    try:
        proc.wait(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log.read_text()[-3000:]


def _cluster_file(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_slurm_run_equals_the_local_cluster_and_survives_a_cancelled_job(tmp_path, baseline_run,
                                                                         baseline_fingerprint):
    require_slurm()
    assert not slurm_jobs(), "SLURM jobs of an earlier test are still queued"
    jobs_dir = tmp_path / "jobs"
    cluster = _cluster_file(tmp_path, {
        "kind": "slurm", "queue": None, "cores": 1, "memory": "1GiB", "walltime": "00:30:00", "jobs": 2,
        "python": sys.executable, "scheduler_options": {"host": "127.0.0.1"}, "log_directory": str(jobs_dir),
        "worker_extra_args": ["--host", "127.0.0.1"],  # one machine: every socket on loopback
    })
    start_from_noise_of(baseline_run, tmp_path / "run")
    cfg = pipeline_file(tmp_path / "p.yaml", **{**SYNTHETIC_RUN, "cluster": {"config": str(cluster)}},
                        output=tmp_path / "run")
    staged = staged_model(tmp_path / "run")
    t0 = time.perf_counter()
    proc = _start_run(cfg, tmp_path / "run.log")
    try:
        wait_for(lambda: complete_clusters(staged) >= 1 or proc.poll() is not None, 600, "no cluster finished")
        running = slurm_jobs()
        done, planned = complete_clusters(staged), n_planned_clusters(staged)
        assert len(running) == 2 and proc.poll() is None, (running, (tmp_path / "run.log").read_text()[-2000:])
        subprocess.run(["scancel", running[0]], check=True, timeout=30)
        _finish(proc, tmp_path / "run.log")
    finally:
        if proc.poll() is None:
            proc.kill()
    seconds = time.perf_counter() - t0
    report_service_time(f"SLURM (2 batch jobs × 1 core): the synthetic DP run in {seconds:.1f} s with one job "
                        f"cancelled after {done}/{planned} clusters; the LocalCluster's baseline "
                        f"{_baseline_seconds(baseline_run):.1f} s; models and predictions bit-identical")
    assert 1 <= done < planned, "the cancel did not land mid-training"
    assert_same_fingerprint(baseline_fingerprint, run_fingerprint(*run_stores(tmp_path / "run")))
    wait_for(lambda: not slurm_jobs(), 60, "worker jobs still in squeue after the run", interval=0.5)


def test_ssh_run_equals_the_local_cluster(tmp_path, baseline_run, baseline_fingerprint):
    with sshd(tmp_path / "sshd") as server:
        cluster = _cluster_file(tmp_path, {
            "kind": "ssh", "hosts": ["127.0.0.1", "127.0.0.1", "127.0.0.1"],
            "connect_options": server.connect_options(),
            # one machine: the scheduler and the workers listen on loopback only
            "worker_options": {"nthreads": 1, "memory_limit": "1GiB", "host": "127.0.0.1"},
            "scheduler_options": {"port": 0, "host": "127.0.0.1"}, "python": sys.executable,
        })
        start_from_noise_of(baseline_run, tmp_path / "run")
        cfg = pipeline_file(tmp_path / "p.yaml", **{**SYNTHETIC_RUN, "cluster": {"config": str(cluster)}},
                            output=tmp_path / "run")
        t0 = time.perf_counter()
        _finish(_start_run(cfg, tmp_path / "run.log"), tmp_path / "run.log")
        seconds = time.perf_counter() - t0
    report_service_time(f"SSH (sshd on loopback, 2 workers): the synthetic DP run in {seconds:.1f} s; the "
                        f"LocalCluster's baseline {_baseline_seconds(baseline_run):.1f} s; models and "
                        "predictions bit-identical")
    assert_same_fingerprint(baseline_fingerprint, run_fingerprint(*run_stores(tmp_path / "run")))
