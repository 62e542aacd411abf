"""No original training row in anything a DP run releases (docs/reliability.md §4).

The scanner (:class:`tests._kit.RowScanner`) looks for every training row, as
``p`` consecutive values equal to 1e-9, in raw bytes (float64 at 8 offsets, float32 at 4),
in numbers printed as text, in every *decompressed* Zarr array (C and Fortran order) and in
every array reachable from a Python object. A byte scan alone would miss rows in Zarr chunks,
which are compressed. ``test_scanner_finds_planted_rows`` shows it finds rows in each form.

A run folder is split at the release boundary: ``public/`` (``model.zarr``, ``PRIVACY.md``, the
plot of fabricated rows) may be published; ``owner/`` stays with the data owner (``data/`` and
``work/`` hold private rows by design; the report, predictions and distances are computed on
private rows). The released artefacts are ``public/`` and the run's console log; the owner's
report is scanned too (it must hold statistics, never rows).
tests/system/test_release_boundary.py scans the quickstart run's ``public/`` exhaustively; the
pickled DP estimator is scanned in tests/privacy/test_dp_classifier.py, and what the post-processed
settings read in tests/pipeline/training/test_post_processing.py.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from kahm_dask.datasets import load_bundled
from kahm_dask.pipeline.cluster import BLAS_ENV
from tests._kit import RowScanner, pipeline_file


@pytest.fixture(scope="module")
def scanner(digits):
    return RowScanner(digits.X_train)


def test_scanner_finds_planted_rows(tmp_path, digits, scanner):
    X = digits.X_train
    (tmp_path / "raw.bin").write_bytes(b"xyz" + X[7].tobytes() + b"tail")  # unaligned float64
    (tmp_path / "f32.bin").write_bytes(b"a" + X[8].astype(np.float32).tobytes())
    (tmp_path / "report.json").write_text(json.dumps({"row": X[9].tolist()}))
    (tmp_path / "report.md").write_text(" ".join(repr(v) for v in X[17]))  # np.float64(0.5) ...
    (tmp_path / "log.txt").write_text("INFO first row: " + np.array2string(X[10], precision=17, separator=" "))
    g = zarr.open_group(tmp_path / "s.zarr", mode="w")
    g.create_array("transposed", data=np.ascontiguousarray(X[[11, 12]].T))  # compressed chunks
    g.create_array("flat", data=np.concatenate([[0.5], X[13], [0.25]]))
    (tmp_path / "near.bin").write_bytes((X[14] + 1e-3).tobytes())  # not a training row
    found = scanner.in_tree(tmp_path)
    assert set().union(*found.values()) == {7, 8, 9, 10, 11, 12, 13, 17}
    assert not any(p.endswith("near.bin") for p in found)
    assert scanner.in_object({"a": [X[15] + 0.0]}) == {15}
    assert scanner.in_bytes(pickle.dumps(X[16].copy())) == {16}


def _released(run: Path) -> list[Path]:
    """The publishable folder, the console log and the owner's reports (no rows in any)."""
    owner = run / "owner"
    return [run / "public", run / "run.log"] + [owner / n for n in os.listdir(owner) if n not in ("data", "work")]


@pytest.mark.parametrize("variant,processes", [
    ("fabricated", False),
    pytest.param("noisy", True, marks=pytest.mark.slow),  # worker processes log too
])
def test_dp_cli_run_releases_no_training_row(tmp_path, digits, scanner, variant, processes):
    run = tmp_path / "run"
    cfg = pipeline_file(tmp_path, name="leak", **{
        "data.source": "sklearn:digits", "data.bounds": [0, 16], "model.n_components": 10, "model.n_layers": 2,
        "privacy.epsilon": 2.0, "privacy.dp_data": variant, "evaluate.max_train_rows": 400,
        "cluster.n_workers": 2, "cluster.processes": processes, "cluster.memory_limit": "1GiB"})
    run.mkdir()
    with open(run / "run.log", "wb") as log:  # the run's whole stdout and stderr, workers included
        proc = subprocess.run([sys.executable, "-m", "kahm_dask.cli", "-v", "run", str(cfg), "--no-progress"],
                              stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **BLAS_ENV},
                              cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, (run / "run.log").read_text()[-3000:]
    released = _released(run)
    names = {p.name for p in released}
    assert {"public", "predictions.zarr", "report.json", "report.md", "run.log"} <= names
    assert (run / "public" / "model.zarr" / "clusters").is_dir() and (run / "run.log").stat().st_size > 1000
    # the rows as stored (the digits scaled by their public bounds 0..16: the fixture's rows)
    # and as raw digits
    stored = zarr.open_array(str(run / "owner" / "data" / "train.zarr" / "X"), mode="r")[...]
    np.testing.assert_array_equal(stored, digits.X_train)
    leaks = {}
    for rows in (stored, load_bundled("digits")[0]):
        row_scanner = RowScanner(rows)
        for path in released:
            leaks.update(row_scanner.in_tree(path) if path.is_dir() else {str(path): row_scanner.in_file(path)})
    assert {k: sorted(v)[:5] for k, v in leaks.items() if v} == {}

    # the private side does hold the rows (so the scan can see them), and nothing else may
    private = RowScanner(stored).in_zarr_arrays(run / "owner" / "data")
    assert len(set().union(*private.values())) == len(stored)


# --------------------------------------------------------------------------- r and partition


