"""Ctrl-C during a run: one line, a clean resume, no partial model where it could be published.

Finding replayed (failed on the code before): Ctrl-C printed two worker tracebacks and
``Aborted!``, and left a model store with 2 of 10 clusters inside ``public/``, which ``load()``
accepted. The test sends SIGINT to the run's whole process group, as a terminal does.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests._kit import pipeline_file

#: A DP run of many small clusters (pipeline_file overrides): digits with public bounds, ε = 2,
#: block_size 20, two worker processes. 300 smoother passes make the training stage last about
#: 5 s, so that the interrupt lands in it (with 8 passes the 17–21 clusters trained in 0.6 s).
PIPELINE = {"name": "interrupted", "data.source": "sklearn:digits", "data.bounds": [0, 16],
            "model.n_components": 10, "model.block_size": 20, "privacy.r_value": 300, "privacy.epsilon": 2.0,
            "evaluate.membership": False, "report.plots": False, "cluster.n_workers": 2}


def _as_a_terminal_job() -> None:
    """SIGINT's default action in the run, as in a terminal's foreground job: a test session
    started in the background of a non-interactive shell (``cmd &``) ignores SIGINT, its children
    inherit that, and Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(cfg) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kahm_dask.cli", "run", str(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_as_a_terminal_job)


@pytest.mark.slow  # about 28 s: a real run, interrupted part way
@pytest.mark.timeout(600)
def test_ctrl_c_prints_one_line_keeps_finished_clusters_and_publishes_nothing(tmp_path):
    cfg = pipeline_file(tmp_path, **PIPELINE)
    staged = tmp_path / "run/owner/work/model.zarr/clusters"
    proc = _start(cfg)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (staged.is_dir() and len(list(staged.iterdir())) >= 3):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the client and every worker process
    out, err = proc.communicate(timeout=120)
    assert not re.search(r"train \d+ clusters \.+ ", err), f"the training finished before the interrupt:\n{err}"
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "Aborted!" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    (line,) = [x for x in err.splitlines() if "Interrupted" in x]
    assert "finished cluster(s) are kept" in line and "rerun the same command to resume" in line
    assert not (tmp_path / "run/public/model.zarr").exists()  # nothing half-made where it may be published
    finished = sum(1 for c in staged.iterdir() if not c.name.startswith(".") and (c / "_COMPLETE.json").is_file())

    rerun = subprocess.run([sys.executable, "-m", "kahm_dask.cli", "run", str(cfg)], capture_output=True, text=True,
                           timeout=600, check=False)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    report = json.loads((tmp_path / "run/owner/report.json").read_text())
    assert report["n_clusters_resumed"] == finished >= 3 and report["privacy"]["noise_reused"]
    assert (tmp_path / "run/public/model.zarr/_COMPLETE.json").is_file() and not staged.exists()
