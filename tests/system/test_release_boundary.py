"""The release boundary of a DP run, tried as an attacker holding the publishable folder.

``kahm-dask run pipelines/quickstart.yaml`` (the shipped file; output and cluster overridden)
splits its run folder into ``public/`` (may be published) and ``owner/`` (stays with the data
owner). Everything under ``public/`` is scanned for the private training and test rows, as
stored (scaled) and as the raw digits: every Zarr array decompressed (float64 and float32
renderings of each row), the raw bytes of every file (float64 and float32 bytes of each row, and
their text renderings), and every number printed in a file. No picture of real rows may be made.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import kahm_dask.pipeline.runs.report as report_mod
from kahm_dask.datasets import load_bundled
from kahm_dask.pipeline.config import load_config
from kahm_dask.pipeline.stores.dataset import open_dataset
from tests._kit import REPO, RowScanner
from tests._kit import zarr_arrays as _zarr_arrays


def _row_keys(X: np.ndarray) -> set[bytes]:
    """Each row's float64 and float32 bytes."""
    X = np.asarray(X)
    return {r.tobytes() for r in X.astype(np.float64)} | {r.tobytes() for r in X.astype(np.float32)}


def _text_renderings(row: np.ndarray) -> list[str]:
    return [
        json.dumps(row.tolist()),
        str(row.tolist()),
        " ".join(repr(float(v)) for v in row),
        np.array2string(row, separator=", ", max_line_width=10**6),
        np.array2string(row.astype(np.float32), separator=", ", max_line_width=10**6),
    ]


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory):
    """The quickstart pipeline run on a thread LocalCluster; the DP-rows plot's input
    is captured to check what it draws."""
    from kahm_dask.pipeline.cluster import connect
    from kahm_dask.pipeline.runs.central import run_pipeline

    out = tmp_path_factory.mktemp("quickstart") / "run"
    cfg = load_config(REPO / "pipelines" / "quickstart.yaml").with_overrides(
        output=str(out), **{"cluster.processes": False, "cluster.n_workers": 1}
    )
    drawn = []
    real = report_mod._plot_dp_rows
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(report_mod, "_plot_dp_rows",
                   lambda path, rows, *a, **k: (drawn.append(rows), real(path, rows, *a, **k)))
        with connect(cfg.cluster) as client:
            metrics = run_pipeline(cfg, client, progress=False)
    return out, metrics, drawn


@pytest.fixture(scope="module")
def private_rows(quickstart_run):
    """Every private row: the stored (scaled) training and test rows and the raw digits."""
    out, _, _ = quickstart_run
    train = open_dataset(out / "owner" / "data" / "train.zarr").X().compute()
    test = open_dataset(out / "owner" / "data" / "test.zarr").X().compute()
    raw, _ = load_bundled("digits")
    return {"train": train, "test": test, "raw": raw}


def test_run_folder_is_split_at_the_release_boundary(quickstart_run):
    out, metrics, _ = quickstart_run
    public, owner = out / "public", out / "owner"
    assert sorted(p.name for p in public.iterdir()) == ["PRIVACY.md", "dp_rows.png", "model.zarr"]
    assert {"data", "work", "report.json", "report.md", "distances.png", "predictions.zarr"} <= {
        p.name for p in owner.iterdir()}
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["owner", "public"]
    report = (owner / "report.md").read_text()
    assert "may be published" in report and "stays with the data owner" in report
    assert "## Privacy statement" in report and "Privacy unit" not in report
    statement = (public / "PRIVACY.md").read_text()
    assert "public (stated by the data owner)" in statement and "Settings that weaken it:** none" in statement
    assert metrics["public_dir"] == str(public) and metrics["owner_dir"] == str(owner)
    assert metrics["accuracy"] > 0.85
    # the release is in the ledger, in the ledger directory (owner side, 0600)
    ledger_file = Path(metrics["privacy"]["ledger_path"])
    entries = json.loads(ledger_file.read_text())["releases"]
    entry = entries[metrics["privacy"]["release_id"]]  # (other tests of this session release digits too)
    assert entry["unit"] == "entry" and entry["mechanism"]["upper"] == 1.0
    assert ledger_file.stat().st_mode & 0o077 == 0 and not ledger_file.is_relative_to(public)
    for path in (owner, *owner.rglob("*")):  # owner-side: no other user reads anything (was 0644/0755)
        assert path.lstat().st_mode & 0o077 == 0, path
    assert not list(out.rglob("secret_seed.json"))


def test_no_private_row_in_any_public_zarr_array(quickstart_run, private_rows):
    out, _, _ = quickstart_run
    arrays = _zarr_arrays(out / "public")
    assert any(name.endswith("dp_rows") for name in arrays)
    private = set().union(*(_row_keys(X) for X in private_rows.values()))
    for name, arr in arrays.items():
        if arr.ndim == 2 and arr.shape[1] == 64:
            rows = {r.tobytes() for r in arr.astype(np.float64)} | {r.tobytes() for r in arr.astype(np.float32)}
            assert not rows & private, name
    # and as p consecutive values anywhere (C and Fortran order), to 1e-9 / 1e-6 in float32
    for name, X in private_rows.items():
        assert RowScanner(X).in_zarr_arrays(out / "public") == {}, name


def test_no_private_row_in_the_bytes_or_text_of_any_public_file(quickstart_run, private_rows):
    """Every file that is not a (compressed) Zarr chunk: the non-Zarr files (PRIVACY.md, the
    plot) and every zarr.json (metadata and attributes); the chunks are checked decompressed
    above. The files are searched as one blob (NUL-separated)."""
    out, _, _ = quickstart_run
    public = out / "public"
    files = [p for p in public.rglob("*") if p.is_file()
             and (p.name == "zarr.json" or not any(part.endswith(".zarr") for part in p.relative_to(public).parts))]
    assert {"PRIVACY.md", "dp_rows.png", "zarr.json"} <= {p.name for p in files}
    blob = b"\0".join(p.read_bytes() for p in files)
    # the fingerprint of the training rows is a hash of private data: never published
    fp = open_dataset(out / "owner" / "data" / "train.zarr").fingerprint()
    assert fp.rows[:16].encode() not in blob and fp.order[:16].encode() not in blob
    for name, X in private_rows.items():
        for r in X.astype(np.float64):
            assert r.tobytes() not in blob and r.astype(np.float32).tobytes() not in blob, name
            assert not any(t.encode() in blob for t in _text_renderings(r)), name
        scanner = RowScanner(X)  # any p consecutive numbers, as bytes or printed, to 1e-9
        assert scanner.in_bytes(blob) == set() and scanner.in_text(blob) == set(), name


def test_no_picture_of_real_rows(quickstart_run, private_rows):
    out, _, drawn = quickstart_run
    assert not list(out.rglob("samples*.png"))
    assert len(drawn) == 1  # the one plot of rows: fabricated rows from the model store only
    fabricated = set()
    for arr in (a for n, a in _zarr_arrays(out / "public" / "model.zarr").items() if n.endswith("dp_rows")):
        fabricated |= {r.tobytes() for r in arr.astype(np.float64)}
    private = set().union(*(_row_keys(X) for X in private_rows.values()))
    summary = drawn[0]  # single DP rows and each class's mean of DP rows
    for rows in summary.samples.values():
        for r in np.asarray(rows, dtype=np.float64):
            assert r.tobytes() in fabricated and r.tobytes() not in private
    assert all(m.tobytes() not in private for m in summary.means().values())
