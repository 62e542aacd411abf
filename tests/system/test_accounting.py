"""Accounting around the release, on the pipeline's entry points: concurrent releases, busy
folders, output paths checked before any noise is drawn, and where private files go.

Findings replayed (each failed on the code before): two ``train_pipeline`` calls under a budget
of 3 both released ε = 2; two ``kahm-dask run`` on one folder both drew noise and the ledger
kept one; ``kahm-dask train data.zarr notes.txt`` drew the noise, charged ε = 2, then failed with
a raw ``FileExistsError``; ``kahm-dask train`` put its work store (private rows verbatim) beside
the publishable model; every owner-side file was world-readable.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from kahm_dask.cli import main
from kahm_dask.datasets import make_class_blobs
from kahm_dask.pipeline.stores.dataset import write_dataset
from kahm_dask.pipeline.training import NOISY, TrainSettings, train_pipeline
from kahm_dask.privacy.ledger import BudgetExceededError
from kahm_dask.recipe import TrainParams
from kahm_dask.storage.locks import FolderBusyError, exclusive
from tests._kit import ledger_of, pipeline_file

#: A DP run (pipeline_file overrides): digits with public bounds, ε = 2, one threaded worker.
PIPELINE = {"name": "accounting", "data.source": "sklearn:digits", "data.bounds": [0, 16], "model.n_components": 5,
            "privacy.epsilon": 2.0, "evaluate.membership": False, "report.plots": False, "cluster.n_workers": 1,
            "cluster.processes": False}


@pytest.fixture
def store(tmp_path):
    X, y = make_class_blobs(200, 5, 2, random_state=4)
    return write_dataset(tmp_path / "data.zarr", X, y, chunk_rows=50)


def _settings(**kw) -> TrainSettings:
    return TrainSettings(TrainParams(3, 1, epsilon=2.0), seed=1, bounds=(0.0, 1.0), **kw)


def test_concurrent_trainings_under_one_budget_release_once(tmp_path, store):
    """Two trainings of the same rows into two folders, started together under a budget of 3:
    one releases ε = 2, the other is refused before drawing noise; the ledger holds one."""
    barrier, outcomes = threading.Barrier(2), {}

    def train(name: str) -> None:
        barrier.wait()
        try:
            outcomes[name] = train_pipeline(store, tmp_path / name / "m.zarr", tmp_path / name / "w",
                                            _settings(budget=(3.0, 0.0)))["privacy"]["release_id"]
        except BudgetExceededError:
            outcomes[name] = "refused"

    threads = [threading.Thread(target=train, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    released = [r for r in outcomes.values() if r != "refused"]
    assert len(released) == 1 and list(outcomes.values()).count("refused") == 1
    assert [e["release_id"] for e in ledger_of(store).entries] == released
    refused = next(n for n, r in outcomes.items() if r == "refused")
    assert not (tmp_path / refused / "w" / NOISY).exists()  # no noise drawn for it


def test_a_busy_work_store_is_refused(tmp_path, store):
    with exclusive(tmp_path / "w", "the work store"):
        with pytest.raises(FolderBusyError, match="in use by another kahm-dask process"):
            train_pipeline(store, tmp_path / "m.zarr", tmp_path / "w", _settings())
    assert ledger_of(store).entries == []


def test_a_second_run_on_a_busy_run_folder_is_refused_at_once(tmp_path):
    """Another process holds the run folder (a run in progress): `kahm-dask run` on it exits
    with a one-line message, before ingesting, releasing or charging anything."""
    cfg = pipeline_file(tmp_path, **PIPELINE)
    with exclusive(tmp_path / "run", "the run folder"):
        proc = subprocess.run([sys.executable, "-m", "kahm_dask.cli", "run", str(cfg)],
                              capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "FolderBusyError: the run folder" in proc.stderr and "in use by another kahm-dask process" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run" / "owner").exists()
    assert not list(Path(os.environ["KAHM_DASK_LEDGER_DIR"]).glob("*.json"))  # nothing charged


def _cli_train(args: list[str], monkeypatch):
    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))
    return CliRunner().invoke(main, ["train", *args, "--n-components", "3", "--epsilon", "2", "--bounds", "0", "1"])


def test_train_onto_a_plain_file_is_refused_before_the_release(tmp_path, store, monkeypatch):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    result = _cli_train([str(store.path), str(notes)], monkeypatch)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "notes.txt exists and is not a kahm-dask model store" in result.output
    assert "resume" not in result.output  # nothing finished to resume
    assert ledger_of(store).entries == [] and notes.read_text() == "my notes"
    (tmp_path / "w").write_text("x")  # a work path that is a file
    result = _cli_train([str(store.path), str(tmp_path / "m.zarr"), "--work", str(tmp_path / "w")], monkeypatch)
    assert result.exit_code == 1 and "is not a kahm-dask work store" in result.output
    assert ledger_of(store).entries == []


def test_train_into_a_read_only_folder_is_refused_before_the_release(tmp_path, store, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    real_access = os.access  # root may write anywhere: the folder is read-only to the check too
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    result = _cli_train([str(store.path), str(locked / "m.zarr"), "--work", str(tmp_path / "w")], monkeypatch)
    assert result.exit_code == 1 and "is not writable" in result.output and "resume" not in result.output
    assert ledger_of(store).entries == []


def test_the_default_work_store_is_beside_the_data_and_private(tmp_path, store, monkeypatch):
    public = tmp_path / "to-publish"
    public.mkdir()
    result = _cli_train([str(store.path), str(public / "model.zarr")], monkeypatch)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in public.iterdir()) == ["model.zarr", "model.zarr.PRIVACY.md"]  # nothing private
    work_root = tmp_path / "data.kahm-work"
    (work,) = work_root.iterdir()
    assert work.name.startswith("model.zarr-") and (work / NOISY).is_dir()
    assert f"work store (owner only): {work}" in result.output
    for path in (work_root, *work_root.rglob("*"), store.path, *Path(store.path).rglob("*")):
        assert stat.S_IMODE(path.lstat().st_mode) & 0o077 == 0, path


def test_a_non_private_model_store_is_private_by_file_mode(tmp_path, store, monkeypatch):
    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))
    result = CliRunner().invoke(main, ["train", str(store.path), str(tmp_path / "m.zarr"), "--n-components", "3"])
    assert result.exit_code == 0, result.output
    assert "Non-private model" in result.output and "keep it with the data owner" in result.output
    for path in (tmp_path / "m.zarr", *(tmp_path / "m.zarr").rglob("*")):
        assert stat.S_IMODE(path.lstat().st_mode) & 0o077 == 0, path


def test_stores_written_by_ingest_are_private(tmp_path):
    result = CliRunner().invoke(main, ["ingest", "sklearn:iris", str(tmp_path / "iris.zarr")])
    assert result.exit_code == 0, result.output
    for path in (tmp_path / "iris.zarr", *(tmp_path / "iris.zarr").rglob("*")):
        assert stat.S_IMODE(path.lstat().st_mode) & 0o077 == 0, path
