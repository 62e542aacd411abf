"""``kahm-dask run`` end to end, in this process (one threaded worker): the public and owner
folders and what each holds, the budget that refuses a second release, the warning and the
statement without public bounds, and an unknown key refused by name."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from kahm_dask.cli import main
from kahm_dask.pipeline.runs.central import _dp_row_summary
from kahm_dask.pipeline.stores.manifest import read_manifest
from kahm_dask.pipeline.stores.model import cluster_dir
from kahm_dask.privacy.randomness import PrivacyLeakWarning
from tests._kit import pipeline_file

#: The DP run of the CLI tests (pipeline_file overrides): digits with public bounds, ε = 2, one
#: threaded worker.
CLI_RUN = {"name": "test-run", "data.source": "sklearn:digits", "data.bounds": [0, 16], "model.n_components": 10,
           "model.n_layers": 2, "privacy.epsilon": 2.0, "cluster.n_workers": 1, "cluster.processes": False}


def test_cli_run_writes_the_public_and_owner_folders(tmp_path, digits):
    cfg = pipeline_file(tmp_path, **CLI_RUN)
    result = CliRunner().invoke(main, ["run", str(cfg), "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    public, owner = run / "public", run / "owner"
    report = json.loads((owner / "report.json").read_text())
    for key in ("accuracy", "mis", "attack_auc", "fit_seconds", "predict_seconds", "evaluate_seconds",
                "n_train", "n_test", "epsilon", "delta", "d", "n_components", "n_layers", "seed", "privacy",
                "bounds_source"):
        assert key in report
    assert report["accuracy"] > 0.85 and report["n_train"] == len(digits.y_train)
    assert report["delta"] == 0 and report["d"] == 1.0 and report["dp_data"] == "noisy"
    assert report["r_source"] is None  # nothing fabricated: no stopping rule to report
    assert report["cluster_on"] == "noisy" and isinstance(report["seed"], int)  # public now
    assert report["privacy"]["ledger"]["epsilon_total"] == 2.0
    assert sorted(p.name for p in public.iterdir()) == ["PRIVACY.md", "dp_rows.png", "model.zarr"]
    assert (owner / "report.md").exists() and (owner / "distances.png").exists()
    assert (owner / "predictions.zarr").is_dir() and (owner / "data" / "train.zarr").is_dir()
    assert not list(run.rglob("samples.png")) and not list(run.rglob("secret_seed.json"))
    # the console: a short summary (the accuracy, owner only; the ledger's total; where each folder is)
    assert f"Accuracy {report['accuracy']:.4g} on the 540 test rows (owner only" in result.output
    assert "the rows' privacy ledger: ε = 2, δ = 0 per entry in total over 1 release(s)" in result.output
    assert f"Public folder (may be published: DP model store, PRIVACY.md): {public}" in result.output
    assert f"Owner folder (keep with the data owner: data, work, report, predictions): {owner}" in result.output
    assert "## Results" not in result.output and "| attack_auc |" not in result.output
    manifest = read_manifest(public / "model.zarr")
    assert manifest["seed"] == report["seed"]
    assert manifest["privacy"]["release_id"] == report["privacy"]["release_id"]

    # No original training row in anything publishable (the full scan is in test_release_boundary)
    blob = b"".join(p.read_bytes() for p in public.rglob("*") if p.is_file())
    X_tr = zarr.open_array(str(owner / "data" / "train.zarr" / "X"), mode="r")[...]
    assert sum(X_tr[i].tobytes() in blob for i in range(len(X_tr))) == 0
    for path in (public / "model.zarr" / "clusters").iterdir():
        fab = zarr.open_group(str(path), mode="r")["dp_rows"][:]
        dist = np.sqrt(((fab[:, None, :] - X_tr[None, :, :]) ** 2).sum(-1)).min(axis=1)
        assert dist.min() > 1e-9

    # dp_rows.png draws the mean of each class's DP rows (at most ClassSummary.max_rows of them)
    summary = _dp_row_summary(public / "model.zarr")
    stored = {}
    for entry in manifest["clusters"]:
        group = zarr.open_group(str(cluster_dir(public / "model.zarr", entry["class"], entry["cluster"])), mode="r")
        stored.setdefault(manifest["classes"][entry["class"]], []).append(group["dp_rows"][:])
    assert summary.counts == {c: sum(map(len, rows)) for c, rows in stored.items()}
    for c, rows in stored.items():
        assert np.allclose(summary.means()[c], np.vstack(rows).mean(axis=0), rtol=1e-12, atol=1e-12)


def test_cli_run_budget_refuses_a_second_release(tmp_path):
    cfg = pipeline_file(tmp_path, **CLI_RUN)
    runner = CliRunner()
    first = runner.invoke(main, ["run", str(cfg), "--no-progress", "--budget", "3", "0", "--full-report"],
                          catch_exceptions=False)
    assert first.exit_code == 0, first.output
    report = (tmp_path / "run" / "owner" / "report.md").read_text()
    assert first.stdout.startswith(report) and "## Privacy statement" in report  # the whole report, then
    assert "budget (ε, δ) = (3, 0)" in first.stdout.split(report, 1)[1]  # the summary with the budget
    # another release from the same training store (the noisy rows lost): beyond the budget
    shutil.rmtree(tmp_path / "run" / "owner" / "work")
    shutil.rmtree(tmp_path / "run" / "public" / "model.zarr")
    second = runner.invoke(main, ["run", str(cfg), "--no-progress", "--budget", "3", "0"])
    assert second.exit_code == 1
    assert "BudgetExceededError" in second.output and "beyond the budget" in second.output
    assert "No noise was drawn" in second.output
    assert not (tmp_path / "run" / "owner" / "work" / "X_noisy").exists()


def test_cli_run_without_public_bounds_warns_and_says_so(tmp_path):
    cfg = pipeline_file(tmp_path, **{k: v for k, v in CLI_RUN.items() if k != "data.bounds"})
    with pytest.warns(PrivacyLeakWarning, match="data.bounds"):
        result = CliRunner().invoke(main, ["run", str(cfg), "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    statement = (tmp_path / "run" / "public" / "PRIVACY.md").read_text()
    assert "scaled by the training rows' min and max" in statement  # where the bounds came from
    assert "scaled by the private rows' min and max of each feature" in statement  # the weakening


def test_cli_rejects_unknown_yaml_key(tmp_path):
    cfg = pipeline_file(tmp_path, **CLI_RUN, **{"evaluate.membrship": True})
    result = CliRunner().invoke(main, ["run", str(cfg)])
    assert result.exit_code != 0
    assert "membrship" in result.output
