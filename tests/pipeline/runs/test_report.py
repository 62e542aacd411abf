"""The run report a data owner reads: results first, each explained in a line, then timings,
settings and paths, apart; a tail rate only where the sample resolves it.

Finding replayed (failed on the code before): the report was one 36-row table mixing metrics,
settings and paths, ``mis`` and ``mis_norm`` were unexplained, and ``attack_tpr_at_0_1pct_fpr``
was reported with 540 non-members (0.1 % of them is not one row).
A report or privacy statement whose write fails half-way leaves the old one whole. The console
ends a run with a few lines (the report's 100-odd stay in owner/report.md): the accuracy marked
owner only, the timings on one line, the privacy spent, the folders and the report's path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kahm_dask.federated import membership_fields
from kahm_dask.pipeline.runs.report import RESULTS, console_summary, write_privacy_statement, write_report
from kahm_dask.privacy.membership import MembershipAttack, MembershipInference
from tests._kit import leftovers


def _fields(n_nonmembers: int) -> dict:
    inference = MembershipInference(0.05, 0.06, 1.2, 1257, n_nonmembers, 0)
    attack = MembershipAttack(0.54, 0.09, 0.014, 0.002, 1257, n_nonmembers)
    return membership_fields(inference, attack)


def test_tail_rates_are_reported_only_where_the_non_members_resolve_them():
    small, large = _fields(540), _fields(1000)
    assert small["attack_tpr_at_1pct_fpr"] == 0.014 and small["attack_tpr_at_0_1pct_fpr"] is None
    assert large["attack_tpr_at_0_1pct_fpr"] == 0.002
    assert _fields(99)["attack_tpr_at_1pct_fpr"] is None


def test_the_report_puts_results_with_their_meaning_before_timings_settings_and_paths(tmp_path):
    metrics = {"name": "demo", "accuracy": 0.948, **_fields(540), "fit_seconds": 2.0, "predict_seconds": 0.5,
               "ingest_seconds": 0.7, "fit_stage_seconds": {"noise": 0.1}, "n_train": 1257, "n_test": 540,
               "n_features": 64, "n_clusters": 10, "n_clusters_resumed": 0, "epsilon": 2.0, "delta": 0.0, "d": 1.0,
               "d_raw": 16.0, "bounds_raw": [0.0, 16.0], "seed": 3, "owner_dir": str(tmp_path)}
    text = write_report(tmp_path, metrics, plots=False)
    order = [text.index(h) for h in ("## Results", "## Timings", "## Settings", "## Paths")]
    assert order == sorted(order)
    results = text[order[0]:order[1]]
    assert "| accuracy | 0.948 | share of the 540 test rows whose class is predicted correctly |" in results
    for key in ("mis", "mis_norm", "attack_auc", "attack_advantage"):
        assert f"| {key} | " in results and RESULTS[key] in results
    assert "| attack_tpr_at_0_1pct_fpr | not resolved (540 non-members; 0.1 % needs ≥ 1000) |" in results
    settings = text[order[2]:order[3]]
    assert "| epsilon | 2 |" in settings and "| d_raw | 16 |" in settings and "epsilon" not in results
    assert "fit_seconds" not in results and "| fit | 2 |" in text[order[1]:order[2]]


# --------------------------------------------------------------------------- the console

LEDGER = {"releases": 2, "epsilon_total": 4.0, "delta_total": 0.0, "budget": [8.0, 0.0], "remaining": [4.0, 0.0]}
TIMES = {"fit_seconds": 2.04, "predict_seconds": 0.52, "ingest_seconds": 0.71, "evaluate_seconds": 0.3,
         "fit_stage_seconds": {"noise": 0.1, "partition_in_memory": 0.2, "tasks": 1.7}}


def test_the_console_summary_of_a_dp_run_is_short_and_says_what_each_folder_may_do(tmp_path):
    metrics = {"name": "demo", "accuracy": 0.948, **_fields(540), **TIMES, "n_test": 540, "epsilon": 2.0,
               "delta": 0.0, "privacy": {"release_id": "r", "ledger": LEDGER},
               "public_dir": "/runs/demo/public", "owner_dir": "/runs/demo/owner"}
    full = write_report(tmp_path, metrics, plots=False)
    lines = console_summary(metrics, tmp_path / "report.md").splitlines()
    assert len(full.splitlines()) > 30 and len(lines) == 6
    assert lines[0] == "Accuracy 0.948 on the 540 test rows (owner only: computed on the private rows)."
    assert lines[1] == ("Timings: ingest 0.7 s, fit 2.0 s (noise 0.1, partition in memory 0.2, tasks 1.7), "
                        "predict 0.5 s, evaluate 0.3 s")
    assert lines[2] == ("Privacy: trained at ε = 2 per entry; the rows' privacy ledger: ε = 4, δ = 0 per entry "
                        "in total over 2 release(s), budget (ε, δ) = (8, 0).")
    assert lines[3] == "Public folder (may be published: DP model store, PRIVACY.md): /runs/demo/public"
    assert lines[4] == "Owner folder (keep with the data owner: data, work, report, predictions): /runs/demo/owner"
    assert lines[5] == f"Full report (owner only; --full-report prints it): {tmp_path / 'report.md'}"
    assert not any(key in "\n".join(lines) for key in ("attack", "mis", "seed"))  # those stay in the report


def test_the_console_summary_of_non_private_and_federated_runs():
    plain = console_summary({"accuracy": 0.9, "n_test": 45, **TIMES, "epsilon": None, "owner_dir": "/o"},
                            Path("/o/report.md"))
    assert "Privacy: non-private run, no DP guarantee" in plain and "Public folder" not in plain
    assert "Owner folder (keep with the data owner: data, work, model store, report, predictions): /o" in plain
    sites = [{"ledger": LEDGER}, {"ledger": {**LEDGER, "releases": 1, "epsilon_total": 2.0, "budget": None}}]
    metrics = {"accuracy": 0.92, "n_test": 540, **TIMES, "epsilon": 2.0, "delta": 1e-6, "owner_dir": "/o",
               "site_privacy": sites, "site_public_dirs": ["/s/site0/public", "/s/site1/public"]}
    federated = console_summary(metrics, Path("/o/report.md"), sites_dir=Path("/s"))
    assert ("Privacy: each site trained at ε = 2, δ = 1e-06 per entry; the sites' privacy ledgers: site 0: ε = 4, "
            "δ = 0 per entry in total over 2 release(s), budget (ε, δ) = (8, 0); site 1: ε = 2, δ = 0 per entry in "
            "total over 1 release(s), no budget set.") in federated
    assert "Site folders (site{q}/: its public/ may be published (DP model store, PRIVACY.md), its owner/ and " \
           "answers/ stay at site q): /s" in federated
    assert "model store" not in federated.split("Owner folder")[1]  # the sites hold the models


# --------------------------------------------------------------------------- atomic writes


def test_report_failure_mid_write_keeps_the_old_report(tmp_path, disk_full):
    write_report(tmp_path, {"name": "a", "accuracy": 0.5}, plots=False)
    statement = write_privacy_statement(tmp_path / "public", "# Privacy\n\nε = 1\n")
    before = {p.name: p.read_bytes() for p in (tmp_path / "report.json", tmp_path / "report.md", statement)}
    assert json.loads(before["report.json"]) == {"name": "a", "accuracy": 0.5}
    assert "ε = 1" in statement.read_text(encoding="utf-8")
    disk_full()
    with pytest.raises(OSError, match="No space left"):
        write_report(tmp_path, {"name": "b", "accuracy": 0.9}, plots=False)
    with pytest.raises(OSError, match="No space left"):
        write_privacy_statement(tmp_path / "public", "# Privacy\n\nε = 2\n")
    after = {p.name: p.read_bytes() for p in (tmp_path / "report.json", tmp_path / "report.md", statement)}
    assert after == before
    assert leftovers(tmp_path) == [] and leftovers(tmp_path / "public") == []


# --------------------------------------------------------------------------- the public picture


def test_a_dp_run_of_any_shape_publishes_its_class_story(tmp_path):
    import matplotlib.image
    import numpy as np

    from kahm_dask.report.pictures import ClassSummary

    rng = np.random.default_rng(0)
    for p, name in ((30, "table"), (64, "images")):
        summary = ClassSummary.from_rows(rng.normal(size=(40, p)), np.repeat([0, 1], 20))
        metrics = {"name": name, "epsilon": 1.0, "n_features": p}
        text = write_report(tmp_path / name / "owner", metrics, dp_rows=summary, public_dir=tmp_path / name / "public")
        picture = tmp_path / name / "public" / "dp_rows.png"
        assert min(matplotlib.image.imread(picture).shape[:2]) > 150 and "## DP rows (public)" in text
        assert leftovers(tmp_path / name / "public") == []
