"""Bad input on the command line (docs/reliability.md §1): every mistake is a one-line error
naming the option, the key or the file, found before a cluster starts, with no traceback; a
killed worker is a clear error with the resume hint where it is true."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from kahm_dask.cli import main
from kahm_dask.pipeline.stores.dataset import open_dataset
from kahm_dask.pipeline.training import TrainSettings, train_pipeline
from kahm_dask.recipe import TrainParams
from tests._kit import BAD_INPUT_X, BAD_INPUT_Y, pipeline_file, write_small_stores


def _csv(tmp: Path, text: str) -> Path:
    path = tmp / "d.csv"
    path.write_text(text)
    return path


def _yaml(tmp: Path, overrides: dict) -> Path:
    """The pipeline file ``tmp/p.yaml``: the minimal one with ``overrides``."""
    return pipeline_file(tmp / "p.yaml", name="t", **overrides)


@pytest.fixture
def no_cluster(monkeypatch):
    """Fail the test if the CLI starts a cluster: validation must come first."""

    def refuse(cfg):
        raise AssertionError("the CLI started a cluster before validating its input")

    monkeypatch.setattr("kahm_dask.cli.session.connect", refuse)


@pytest.fixture
def stores(tmp_path):
    """The stores of tests._kit.write_small_stores in tmp_path: s.zarr, s4.zarr, s1.zarr."""
    return write_small_stores(tmp_path)


def _invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


CLI_TRAIN = {
    "epsilon = 0": (["--epsilon", "0"], r"'--epsilon': 0.0 is not in the range x>0"),
    "epsilon < 0": (["--epsilon", "-1"], r"'--epsilon': -1.0 is not in the range x>0"),
    "epsilon 1e6": (["--epsilon", "1e6"], r"'--epsilon': .* at most 709\.783 .*Got 1000000"),
    "delta > 1": (["--epsilon", "1", "--delta", "1.5"], r"'--delta': 1.5 is not in the range 0<=x<1"),
    "delta < 0": (["--epsilon", "1", "--delta=-0.1"], r"'--delta': -0.1 is not in the range 0<=x<1"),
    "bounds upper <= lower": (["--epsilon", "1", "--bounds", "1", "0"], r"upper must exceed lower"),
    "budget epsilon = 0": (["--epsilon", "1", "--budget", "0", "0"],
                           r"'--budget': must be \(ε, δ\) with ε finite and > 0"),
    "d = 0": (["--epsilon", "1", "--d", "0"], r"'--d': 0.0 is not in the range x>0"),
    "n_components = 0": (["--n-components", "0"], r"'--n-components': 0 is not in the range x>=1"),
    "n_layers = 0": (["--n-layers", "0"], r"'--n-layers': 0 is not in the range x>=1"),
    "block_size = 0": (["--block-size", "0"], r"'--block-size': 0 is not in the range x>=1"),
    "seed < 0": (["--seed", "-1"], r"'--seed': -1 is not in the range x>=0"),
    "dp_data unknown": (["--epsilon", "1", "--dp-data", "raw"],
                        r"'--dp-data': 'raw' is not one of 'fabricated', 'noisy'"),
    "fractional passes": (["--epsilon", "1", "--r-source", "passes", "--r-value", "2.5"],
                          r"'--r-value'.*'passes' needs an int >= 1.*Got 2.5"),
    "r_value with private r": (["--epsilon", "1", "--r-source", "private", "--r-value", "0.5"], r"'--r-value'"),
}


@pytest.mark.parametrize("args,pattern", list(CLI_TRAIN.values()), ids=list(CLI_TRAIN))
def test_cli_train_rejects_before_starting_a_cluster(args, pattern, stores, no_cluster):
    result = _invoke("train", stores / "s.zarr", stores / "m.zarr", *args)
    assert result.exit_code in (1, 2), result.output
    assert re.search(pattern, result.output), result.output
    assert "Traceback" not in result.output
    assert not (stores / "m.zarr").exists()


def test_cli_train_rejects_a_single_row_class(stores, no_cluster):
    result = _invoke("train", stores / "s1.zarr", stores / "m.zarr")
    assert result.exit_code == 1
    assert re.search(r"class\(es\) \[1\] have fewer than 2 samples.*Remove these classes or add samples",
                     result.output), result.output


def test_cli_train_warns_when_n_components_exceeds_features(stores, monkeypatch):
    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))
    monkeypatch.setattr("kahm_dask.pipeline.estimator.estimator.DaskKAHMClassifier.fit_store",
                        lambda self, *a, **k: {"n_clusters": 2, "n_resumed": 0, "clusters": []})
    result = _invoke("train", stores / "s.zarr", stores / "m.zarr", "--n-components", "20")
    assert result.exit_code == 0, result.output
    assert "--n-components 20 exceeds the 5 features" in result.output


@pytest.mark.parametrize("finished", [0, 2])
def test_cli_killed_worker_is_a_clear_error_with_the_resume_hint(stores, monkeypatch, finished):
    """The resume hint is given only where it is true: when finished clusters are kept."""
    from distributed.scheduler import KilledWorker

    def die(store, model, work, *a, **k):
        for s in range(finished):  # clusters a run finished before the worker died
            (work.path / "model.zarr" / "clusters" / f"c0_s{s}").mkdir(parents=True)
        raise KilledWorker("train_cluster-abc", SimpleNamespace(address="tcp://127.0.0.1:1"), 3)

    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))
    monkeypatch.setattr("kahm_dask.pipeline.estimator.estimator.train_pipeline", die)  # the fit behind the CLI
    result = _invoke("train", stores / "s.zarr", stores / "m.zarr", "--n-components", "3")
    assert result.exit_code == 1 and "Traceback" not in result.output and "KilledWorker" in result.output
    assert ("rerun the same command to resume" in result.output) == bool(finished)
    assert (f"The {finished} finished cluster(s) are kept" in result.output) == bool(finished)


def test_cli_failure_after_the_release_says_it_stays_charged_and_how_to_continue_it(stores, monkeypatch):
    """A worker lost while the noise is drawn: the release was charged, and the work store keeps its
    marker (the id it was charged under), so the hint says a rerun continues it without a new charge."""
    from distributed.scheduler import KilledWorker

    def die(store, model, work, *a, **k):
        work.path.mkdir(parents=True)
        (work.path / "X_noisy.pending.json").write_text("{}")  # what _draw_noisy_rows writes before drawing
        raise KilledWorker("noisy-abc", SimpleNamespace(address="tcp://127.0.0.1:1"), 3)

    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))
    monkeypatch.setattr("kahm_dask.pipeline.estimator.estimator.train_pipeline", die)
    result = _invoke("train", stores / "s.zarr", stores / "m.zarr", "--n-components", "3", "--epsilon", "2")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert ("The DP release stays charged in the privacy ledger; its work store keeps it: rerun the same command "
            "to continue it without a second charge.") in result.output


def _one_class(tmp: Path) -> Path:
    """A store whose 40 rows are all of class 3."""
    from kahm_dask.pipeline.stores.dataset import write_dataset

    write_dataset(tmp / "one.zarr", BAD_INPUT_X, np.full(len(BAD_INPUT_Y), 3), chunk_rows=20)
    return tmp / "one.zarr"


def _damaged(tmp: Path) -> Path:
    """``s.zarr`` with the file of its second chunk of X cut to half its bytes."""
    chunk = tmp / "s.zarr" / "X" / "c" / "1" / "0"
    chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])
    return tmp / "s.zarr"


BEFORE_THE_SPEND = {
    "epsilon 1e6": (lambda t: t / "s.zarr", ["--epsilon", "1e6"],
                    r"'--epsilon': must be None or a float > 0 .*at most 709\.783.*Got 1000000\.0"),
    "one class": (_one_class, ["--epsilon", "2"],
                  r"the training rows hold one class \(3\); a classifier needs at least two"),
    "damaged chunk": (_damaged, ["--epsilon", "2"],
                      r"chunk 1 of X \(rows 20 to 39\) of the dataset store .*s\.zarr cannot be read: Zstd "
                      r"decompression error: invalid input data"),
}


@pytest.mark.parametrize("make_store,args,pattern", list(BEFORE_THE_SPEND.values()), ids=list(BEFORE_THE_SPEND))
def test_cli_train_fails_before_the_spend(make_store, args, pattern, stores, ledger_dir, monkeypatch):
    """Issue 38, items 2-4: a DP train that cannot succeed fails with one line before the ledger is
    charged and before anything is written (no model, no statement, no work store)."""
    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))
    store = make_store(stores)
    before = sorted(p.name for p in stores.iterdir())
    result = _invoke("train", store, stores / "m.zarr", "--n-components", "3", *args)
    assert result.exit_code in (1, 2), result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(error) == 1 and re.search(pattern, error[0]), result.output
    assert "Traceback" not in result.output
    assert sorted(p.name for p in stores.iterdir()) == before  # no model, PRIVACY.md or .kahm-work
    assert not any(ledger_dir.iterdir())  # no ledger entry (not even a ledger)


CLI_OTHER = {
    "ingest: nan csv": (lambda t: ["ingest", _csv(t, "1,2,3\n4,nan,0\n"), t / "n.zarr"],
                        r"non-finite value at row 1, column 1.*impute"),
    "ingest: missing file": (lambda t: ["ingest", t / "nope.csv", t / "n.zarr"], r"Source file not found"),
    "ingest: existing store": (lambda t: ["ingest", "sklearn:iris", t / "s.zarr"],
                               r"s.zarr already exists and holds other rows .*; add --overwrite"),
    "ingest: unknown bundled set": (lambda t: ["ingest", "sklearn:mnist", t / "n.zarr"],
                                    r"Unknown bundled dataset 'sklearn:mnist'"),
    "predict: not a model": (lambda t: ["predict", t / "s.zarr", t / "s.zarr", t / "p.zarr"],
                             r"not a kahm-dask model store"),
    "run: unknown key": (lambda t: ["run", _yaml(t, {"evaluate.membrship": True})],
                         r"unknown key 'evaluate.membrship'.*did you mean 'membership'"),
    "run: epsilon = 0": (lambda t: ["run", _yaml(t, {"privacy.epsilon": 0})], r"'privacy.epsilon'.*: must be > 0"),
    "run: delta = 1": (lambda t: ["run", _yaml(t, {"privacy.epsilon": 1.0, "privacy.delta": 1.0})],
                       r"'privacy.delta'.*: must be >= 0 and < 1"),
    "run: bad budget": (lambda t: ["run", _yaml(t, {"privacy.epsilon": 1.0}), "--budget", "0", "0"],
                        r"'privacy.budget'.*epsilon > 0"),
}


@pytest.mark.parametrize("make_args,pattern", list(CLI_OTHER.values()), ids=list(CLI_OTHER))
def test_cli_rejects(make_args, pattern, stores, no_cluster):
    result = _invoke(*make_args(stores))
    assert result.exit_code == 1, result.output
    assert re.search(pattern, result.output, re.S), result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("split", [False, True], ids=["one store", "with a test store"])
def test_cli_ingest_again_keeps_identical_stores_and_refuses_others(tmp_path, no_cluster, split):
    """Issue 38 (the documented examples, twice): the same ingest again keeps the existing stores
    as they are (their creation time, their remembered releases), says so and exits 0; other rows
    or settings on an existing store are refused, naming --overwrite, and leave it unchanged."""
    args = ["ingest", "sklearn:wine", tmp_path / "train.zarr"]
    if split:
        args += ["--test-store", tmp_path / "test.zarr", "--bounds", "0", "2000", "--scale", "minmax"]
    assert _invoke(*args).exit_code == 0
    before = open_dataset(tmp_path / "train.zarr").attrs
    again = _invoke(*args)
    assert again.exit_code == 0, again.output
    assert again.output.count("unchanged (it already holds these rows") == (2 if split else 1), again.output
    assert open_dataset(tmp_path / "train.zarr").attrs == before  # not rewritten: same "created"
    other = (args[:-5] + ["--bounds", "0", "1000", "--scale", "minmax"]) if split else ["ingest", "sklearn:iris",
                                                                                       tmp_path / "train.zarr"]
    refused = _invoke(*other)
    assert refused.exit_code == 1 and re.search(r"train.zarr already exists and holds other rows .*--overwrite",
                                                refused.output), refused.output
    assert open_dataset(tmp_path / "train.zarr").attrs == before
    assert sorted(p.name for p in tmp_path.iterdir()) == (["test.zarr", "train.zarr"] if split else ["train.zarr"])


def test_cli_predict_feature_count_mismatch(stores, monkeypatch):
    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))
    train_pipeline(open_dataset(stores / "s.zarr"), stores / "m.zarr", stores / "w",
                   TrainSettings(TrainParams(3, 2), seed=0), progress=False)
    result = _invoke("predict", stores / "m.zarr", stores / "s4.zarr", stores / "p.zarr")
    assert result.exit_code == 1
    assert re.search(r"s4.zarr has 4 features; the model .* expects 5", result.output), result.output
