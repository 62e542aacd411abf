"""Interrupted runs: kill ``kahm-dask run`` mid-training, rerun the same command
(docs/reliability.md §3).

The rerun must resume — reuse the data stores, the stored noisy rows (never drawn again), the
k-means seed and every complete cluster, recompute only the missing clusters — and give the
same model and predictions, bit for bit, as an uninterrupted run from the same noisy rows (the
run folder starts from a copy of the baseline's: ``start_from_noise_of``). Between the kill and
the rerun no half-written cluster may be readable. Two ways to die: SIGKILL of the whole process
group (client, scheduler, nannies and workers at once, as when a batch job is killed) and SIGTERM
of the main process only (the LocalCluster's workers are orphaned and must go away by themselves).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zarr

from kahm_dask.pipeline.cluster import BLAS_ENV
from kahm_dask.pipeline.stores.dataset import open_dataset
from kahm_dask.pipeline.stores.model import load_cluster
from tests._kit import (
    SYNTHETIC_RUN,
    RowScanner,
    assert_same_fingerprint,
    complete_clusters,
    ledger_of,
    leftovers,
    n_planned_clusters,
    pipeline_file,
    run_fingerprint,
    run_stores,
    staged_model,
    start_from_noise_of,
    wait_for,
)

pytestmark = pytest.mark.slow


def _command(cfg: Path) -> list[str]:
    return [sys.executable, "-m", "kahm_dask.cli", "run", str(cfg), "--no-progress"]


def _alive_in_group(pgid: int) -> list[int]:
    """Live (non-zombie) processes of the process group ``pgid``."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(entry))
    return alive


@pytest.mark.parametrize("how", ["SIGKILL the process group", "SIGTERM the main process"])
def test_killed_run_resumes_to_the_same_model(tmp_path, how, baseline_run, baseline_fingerprint):
    # SIGKILL case: `seed: null`, the default of real runs (the k-means seed is drawn once, kept
    # in <output>/owner/work/kmeans_seed.json and reused on resume). The file is planted with
    # the baseline's seed so that the result can be compared with the baseline.
    drawn_seed = how.startswith("SIGKILL")
    start_from_noise_of(baseline_run, tmp_path / "run")
    cfg = pipeline_file(tmp_path / "p.yaml", **{**SYNTHETIC_RUN, "seed": None if drawn_seed else 11},
                        output=tmp_path / "run")
    seed_file = tmp_path / "run" / "owner" / "work" / "kmeans_seed.json"
    if drawn_seed:
        seed_file.write_text(json.dumps({"seed": 11}))
    model, pred = run_stores(tmp_path / "run")
    staged = staged_model(tmp_path / "run")  # where the clusters are written until the run completes
    noisy = tmp_path / "run" / "owner" / "work" / "X_noisy" / "_COMPLETE.json"
    noise_marker = noisy.read_text()
    env = {**os.environ, **BLAS_ENV}
    with open(tmp_path / "first.log", "wb") as log:
        proc = subprocess.Popen(_command(cfg), cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own process group: pgid == pid
    try:
        wait_for(lambda: complete_clusters(staged) >= 2 or proc.poll() is not None, 600, "no cluster finished")
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-2000:]
        if how.startswith("SIGKILL"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        t_kill = time.monotonic()
        wait_for(lambda: not _alive_in_group(proc.pid), 120, "orphaned worker processes kept running",
                 interval=0.2)
        print(f"\n{how}: every process of the run gone {time.monotonic() - t_kill:.1f} s after the kill")
    finally:
        if _alive_in_group(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)

    planned, done = n_planned_clusters(staged), complete_clusters(staged)
    print(f"{how}: {done}/{planned} clusters complete at the kill")
    assert 1 <= done < planned, "the kill did not land mid-training"
    assert not model.exists()  # nothing half-made where it may be published
    assert seed_file.exists() == drawn_seed
    temporaries = []
    for d in (staged / "clusters").iterdir():  # nothing half-written is readable
        if d.name.startswith("."):  # a writer's temporary directory (its marker may be written)
            temporaries.append(d.name)
        elif not (d / "_COMPLETE.json").exists():
            raise AssertionError(f"{d.name} is visible but incomplete")
        if not (d / "_COMPLETE.json").exists():
            with pytest.raises(FileNotFoundError):
                load_cluster(d)
    print(f"{len(temporaries)} temporary cluster directories left by the killed writers")

    with open(tmp_path / "second.log", "wb") as log:
        rerun = subprocess.run(_command(cfg), cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                               timeout=900)
    assert rerun.returncode == 0, (tmp_path / "second.log").read_text()[-3000:]
    report = json.loads((tmp_path / "run" / "owner" / "report.json").read_text())
    assert report["n_clusters_resumed"] == done and report["n_clusters"] == planned
    resumed = run_fingerprint(model, pred)
    assert leftovers(model / "clusters") == []  # the killed writers' directories are not published

    # nothing publishable (leftovers of the killed writers included) holds a training row
    train = zarr.open_array(str(tmp_path / "run" / "owner" / "data" / "train.zarr" / "X"), mode="r")[...]
    scanner = RowScanner(train)
    assert scanner.in_tree(tmp_path / "run" / "public") == {}

    assert_same_fingerprint(baseline_fingerprint, resumed)
    assert noisy.read_text() == noise_marker  # the noisy rows were never redrawn
    ledger = ledger_of(open_dataset(tmp_path / "run" / "owner" / "data" / "train.zarr"))
    assert [e["release_id"] for e in ledger.entries] == [report["privacy"]["release_id"]]  # charged once
    if drawn_seed:
        assert json.loads(seed_file.read_text()) == {"seed": 11}
        assert report["seed"] == 11
