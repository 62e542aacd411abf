"""Traps of a user's first hour with the command line (each failed on the code before).

Findings replayed: a second `ingest` of another CSV beside the first wrote the first file's
rows (a private ``raw.zarr`` left by the first was reused without a word, and a failed ingest
left it too); `ingest --scale minmax` without `--bounds` scaled by the private min/max without
the warning its help promises; a CSV row five fields short said "the label is missing"; a
plain-TCP `--scheduler` gave no warning; `--dashboard-address none` printed a dashboard link;
pipeline files on noisy rows said "fabricated" in their first comment."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from sklearn.datasets import load_breast_cancer, load_digits

import kahm_dask.pipeline.cluster.connect  # noqa: F401  (sys.modules holds the module its function hides)
from kahm_dask.cli import main
from kahm_dask.cli.session import one_line_warning
from kahm_dask.pipeline.stores.dataset import open_dataset
from kahm_dask.privacy.randomness import PrivacyLeakWarning
from kahm_dask.privacy.statement import PRIVATE_BOUNDS, PRIVATE_SCALING

REPO = Path(__file__).resolve().parents[2]


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _in_threads(cluster_cfg):
    """The command's cluster, its workers threads of this process (they start in a second)."""
    from kahm_dask.pipeline.cluster import connect

    return connect(dataclasses.replace(cluster_cfg, processes=False))


def _csv(path, loader) -> tuple:
    X, y = loader(return_X_y=True)
    np.savetxt(path, np.column_stack([X, y]), delimiter=",", fmt="%g")
    return X.shape


# ------------------------------------------------------------------ ingest writes its own source


def test_a_second_ingest_writes_its_own_rows(tmp_path):
    data = tmp_path / "dir"
    data.mkdir()
    digits = _csv(tmp_path / "digits.csv", load_digits)
    cancer = _csv(tmp_path / "breast_cancer.csv", load_breast_cancer)
    for name, source, bounds, shape in (("first", "digits.csv", (0, 16), digits),
                                        ("second", "breast_cancer.csv", (0, 4300), cancer)):
        result = _invoke("ingest", tmp_path / source, data / f"{name}.zarr", "--test-store", data / f"{name}_test.zarr",
                         "--bounds", *bounds, "--scale", "minmax")
        assert result.exit_code == 0, result.output
        train, test = open_dataset(data / f"{name}.zarr"), open_dataset(data / f"{name}_test.zarr")
        assert train.n_features == test.n_features == shape[1]
        assert train.n_samples + test.n_samples == shape[0]
    assert sorted(p.name for p in data.iterdir()) == ["first.zarr", "first_test.zarr", "second.zarr",
                                                       "second_test.zarr"]  # no private copy left behind


def test_a_failed_ingest_leaves_no_private_copy(tmp_path):
    source = tmp_path / "bad.csv"
    source.write_text("1,2,0\n3,4,0\n5,6,0\n7,8,1\n")  # read, then the stratified split fails (one row of 1)
    result = _invoke("ingest", source, tmp_path / "out" / "s.zarr", "--test-store", tmp_path / "out" / "t.zarr",
                     "--bounds", 0, 10, "--test-size", 0.5)
    assert result.exit_code == 1 and "least populated class" in result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []


# ------------------------------------------------------------------ minmax without bounds warns


def test_minmax_without_bounds_warns_that_the_scaling_is_private(tmp_path):
    with pytest.warns(PrivacyLeakWarning, match="private") as caught:
        result = _invoke("ingest", "sklearn:iris", tmp_path / "s.zarr", "--scale", "minmax")
    assert result.exit_code == 0, result.output
    w = next(w for w in caught if w.category is PrivacyLeakWarning)
    line = one_line_warning(w.message, w.category, w.filename, w.lineno)  # how the console shows it
    assert line.startswith("PrivacyLeakWarning: the features were scaled by the training rows' min and max, "
                           "which are private") and line.count("\n") == 1 and ".py" not in line
    assert "give --bounds LOW HIGH" in line and "(--scale minmax without --bounds)" in line


def test_a_model_trained_on_privately_scaled_stores_names_the_scaling(tmp_path, monkeypatch):
    monkeypatch.setattr("kahm_dask.cli.session.connect", _in_threads)
    with pytest.warns(PrivacyLeakWarning):
        assert _invoke("ingest", "sklearn:iris", tmp_path / "s.zarr", "--scale", "minmax").exit_code == 0
    with pytest.warns(PrivacyLeakWarning, match="ingest the rows again with --bounds LOW HIGH"):
        result = _invoke("train", tmp_path / "s.zarr", tmp_path / "m.zarr", "--n-components", 3, "--epsilon", 2)
    assert result.exit_code == 0, result.output
    statement = (tmp_path / "m.zarr.PRIVACY.md").read_text()
    assert PRIVATE_SCALING in statement and PRIVATE_BOUNDS not in statement


def test_minmax_with_bounds_does_not_warn(tmp_path, recwarn):
    assert _invoke("ingest", "sklearn:iris", tmp_path / "s.zarr", "--scale", "minmax", "--bounds", 0, 8).exit_code == 0
    assert not [w for w in recwarn if w.category is PrivacyLeakWarning]


# ------------------------------------------------------------------ messages that name the problem


def test_a_short_csv_row_is_named_by_its_line_and_field_count(tmp_path):
    rows = [",".join(f"{v:g}" for v in [*range(8), r % 2]) for r in range(20)]
    rows[10] = "1,2,3,4"  # five fields short
    source = tmp_path / "short.csv"
    source.write_text("f0,f1,f2,f3,f4,f5,f6,f7,label\n" + "\n".join(rows) + "\n")
    result = _invoke("ingest", source, tmp_path / "s.zarr")
    assert result.exit_code == 1
    assert f"{source}, line 12: the row has 4 fields where 9 are expected" in result.output
    assert "label is missing" not in result.output and not (tmp_path / "s.zarr").exists()


def _refused(address, timeout, security=None):
    from kahm_dask.pipeline.cluster.connect import ClusterConnectionError

    raise ClusterConnectionError(f"cannot reach the Dask scheduler at {address} (test)")


def test_a_plain_tcp_scheduler_warns_that_the_rows_travel_unencrypted(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules["kahm_dask.pipeline.cluster.connect"], "_client_for_address", _refused)
    assert _invoke("ingest", "sklearn:iris", tmp_path / "s.zarr").exit_code == 0
    with pytest.warns(PrivacyLeakWarning, match="tls://") as caught:
        result = _invoke("train", tmp_path / "s.zarr", tmp_path / "m.zarr", "--scheduler", "tcp://10.1.2.3:8786")
    assert result.exit_code == 1 and "cannot reach the Dask scheduler" in result.output
    w = next(w for w in caught if w.category is PrivacyLeakWarning)
    line = one_line_warning(w.message, w.category, w.filename, w.lineno)
    assert line.startswith("PrivacyLeakWarning: the Dask scheduler tcp://10.1.2.3:8786 is reached without TLS")
    assert "--tls-ca-file" in line and line.count("\n") == 1


def test_dashboard_address_none_says_the_dashboard_is_off(tmp_path, monkeypatch):
    monkeypatch.setattr("kahm_dask.cli.session.connect", _in_threads)
    assert _invoke("ingest", "sklearn:iris", tmp_path / "s.zarr").exit_code == 0
    result = _invoke("train", tmp_path / "s.zarr", tmp_path / "m.zarr", "--n-components", 3, "--n-workers", 1,
                     "--dashboard-address", "none")
    assert result.exit_code == 0, result.output
    assert "Dask dashboard: off" in result.output and "8787" not in result.output


@pytest.mark.parametrize("path", sorted((REPO / "pipelines").glob("*.yaml")), ids=lambda p: p.name)
def test_a_pipeline_files_header_names_the_dp_rows_it_uses(path):
    """The comment a pipeline file opens with says "fabricated" only if its rows are."""
    header = "".join(line for line in path.read_text().splitlines(keepends=True)[:12] if line.startswith("#"))
    header = header.split("\n#   kahm-dask run", 1)[0]  # the description, before the command
    dp_data = (yaml.safe_load(path.read_text()).get("privacy") or {}).get("dp_data")
    if dp_data != "fabricated":
        assert "fabricated" not in header, f"{path.name} says fabricated but its privacy.dp_data is {dp_data}"
