"""The console of `kahm-dask run`: progress bars and a short summary (the accuracy, marked owner
only, the timings, the privacy spent and the folders); the whole report only with
``--full-report``; Dask's INFO lines (its scheduler and nannies in the CLI's process, its worker
processes) only with ``-v``.

The CLI runs as a subprocess on a tiny pipeline with one worker *process*, so the console is
what a user sees, worker processes included.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import dask
import pytest

from kahm_dask.pipeline.cluster import connect
from kahm_dask.pipeline.config import ClusterConfig
from tests._kit import pipeline_file

#: The tiny pipeline (pipeline_file overrides): iris, one worker process.
PIPELINE = {"name": "console", "model.n_components": 2, "model.n_layers": 1, "report.plots": False,
            "cluster.n_workers": 1, "cluster.processes": True}


def _run_cli(tmp_path: Path, *options: str) -> str:
    """`kahm-dask run` on the tiny pipeline; its stdout and stderr (workers included)."""
    cfg = pipeline_file(tmp_path / "console.yaml", **PIPELINE)
    proc = subprocess.run(
        [sys.executable, "-m", "kahm_dask.cli", "run", str(cfg), *options],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
    )
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-3000:]
    return console


def test_default_console_has_no_info_lines(tmp_path):
    console = _run_cli(tmp_path)
    assert not [line for line in console.splitlines() if re.search(r"\bINFO\b", line)]
    assert "owner only: computed on the private rows" in console and "Owner folder" in console  # the results
    assert "| accuracy |" not in console and "## Settings" not in console  # not the whole report
    assert re.search(r"^Timings: ingest [\d.]+ s, fit [\d.]+ s \(", console, re.M)
    assert "Privacy: non-private run" in console and "Full report (owner only" in console
    # named progress for every stage, and the total time (finding 11)
    for stage in ("ingest (private stores)", "partition in worker memory (rows by class, k-means per class)",
                  "predict ", "membership metrics"):
        assert stage in console, stage
    assert re.search(r"train \d+ clusters", console) and re.search(r"done in \d+\.\d s", console)


@pytest.mark.slow  # about 12 s: a whole run; the default console test covers the same command
def test_verbose_console_has_dask_info_lines(tmp_path):
    console = _run_cli(tmp_path, "--no-progress", "-v", "--full-report")
    assert "INFO distributed.scheduler:" in console  # the scheduler, in the CLI's process
    assert re.search(r" - distributed\.worker - INFO - ", console)  # the worker process
    assert "| accuracy |" in console and "## Settings" in console  # the whole report


def test_local_cluster_workers_log_at_dasks_configured_level():
    """The level reaches a local cluster's worker processes through ``logging.distributed``
    (their ``silence_logs``): INFO here, where LocalCluster's default would be WARNING."""
    with (dask.config.set({"logging.distributed": "info"}),
          connect(ClusterConfig(n_workers=1, processes=True)) as client):
        levels = client.submit(_distributed_handler_levels, pure=False).result(timeout=60)
    assert levels == {logging.INFO}


def _distributed_handler_levels() -> set[int]:
    """Runs on a worker: the levels of the handlers of its ``distributed`` logger."""
    return {h.level for h in logging.getLogger("distributed").handlers}
