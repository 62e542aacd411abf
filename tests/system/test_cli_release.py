"""``kahm-dask release``: a DP data set of a store's rows, in the owner's raw units, beside its
statement, recorded in the store's ledger before any noise; bad input refused before that."""

from __future__ import annotations

import contextlib
import json
import re
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from kahm_dask.cli import main
from kahm_dask.pipeline.stores.dataset import open_dataset
from kahm_dask.report.pictures import image_shape_of
from tests._kit import ledger_of


@pytest.fixture
def stores(tmp_path_factory) -> Path:
    """digits in ``d.zarr`` (1,257 training rows) and ``t.zarr`` (540 test rows), scaled to [0, 1]
    by their public bounds 0–16: each test's own (a store remembers its releases, and each test
    has its own ledger)."""
    where = tmp_path_factory.mktemp("digits")
    result = CliRunner().invoke(main, ["ingest", "sklearn:digits", str(where / "d.zarr"), "--test-store",
                                       str(where / "t.zarr"), "--bounds", "0", "16", "--scale", "minmax"])
    assert result.exit_code == 0, result.output
    return where


@pytest.fixture
def on_threads(monkeypatch):
    """The commands compute on Dask's threaded scheduler instead of starting a LocalCluster."""
    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))


def _release(stores: Path, out: Path, *args: str):
    return CliRunner().invoke(main, ["release", str(stores / "d.zarr"), str(out), *args])


def _read(out: Path) -> pd.DataFrame:
    return pd.read_csv(out) if out.suffix == ".csv" else pd.read_parquet(out)


@pytest.mark.parametrize(("name", "args"), [
    ("noisy.parquet", []),
    ("fabricated.csv", ["--dp-data", "fabricated", "--format", "csv", "--seed", "0"]),
])
def test_release_of_digits_at_epsilon_2_is_a_table_pandas_reads(stores, tmp_path, on_threads, name, args):
    out = tmp_path / name
    result = _release(stores, out, "--epsilon", "2", *args)
    assert result.exit_code == 0, result.output
    frame = _read(out)
    assert frame.shape == (1257, 65) and frame.columns[-1] == "label"
    features = frame.drop(columns="label").to_numpy()
    assert features.min() == 0.0 and features.max() == 16.0  # the owner's pixel counts, not [0, 1]
    ds = open_dataset(stores / "d.zarr")
    assert frame["label"].value_counts().sort_index().tolist() == [ds.class_counts[c] for c in ds.classes]
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    statement = (tmp_path / f"{name}.PRIVACY.md").read_text()
    assert summary["release_id"] in statement and "ε = 2 per entry" in statement
    assert "[0, 16] in raw units" in statement and f"{summary['dp_data']} DP rows" in statement
    entries = [e for e in ledger_of(ds).entries if e["release_id"] == summary["release_id"]]
    assert len(entries) == 1 and entries[0]["epsilon"] == 2.0 and entries[0]["release"] == str(out)


def test_a_noisy_release_keeps_the_store_order_and_undoes_the_scaling(stores, tmp_path, on_threads):
    out = tmp_path / "z.zarr"
    assert _release(stores, out, "--epsilon", "2", "--format", "zarr").exit_code == 0
    released, private = open_dataset(out), open_dataset(stores / "d.zarr")
    np.testing.assert_array_equal(released.labels(), private.labels())
    X = np.asarray(released.X())
    assert X.shape == (1257, 64) and X.min() == 0.0 and X.max() == 16.0
    assert released.attrs["feature_range"] == {"min": [0.0] * 64, "max": [16.0] * 64}
    steps = X / (16 / 1024)  # the public grid (step d/1024, d = the width) in raw units
    assert np.abs(steps - np.rint(steps)).max() < 1e-9


@pytest.mark.parametrize(("args", "match"), [
    (["--format", "xlsx"], r"Invalid value for '--format': 'xlsx' is not one of 'parquet', 'csv', 'zarr'"),
    (["--report", "r.html"], r"--report needs --test-store"),
    ([], r"Missing option '--epsilon'"),
], ids=["format", "report without test store", "no epsilon"])
def test_bad_options_are_one_line_before_the_release(stores, tmp_path, on_threads, args, match):
    with contextlib.chdir(tmp_path):
        args = [a.format(stores=stores) for a in args]
        result = _release(stores, tmp_path / "o.parquet", *(["--epsilon", "2"] if args else []), *args)
    _assert_refused(result, match, stores, tmp_path)


def test_an_existing_output_is_refused_before_the_release(stores, tmp_path, on_threads):
    (tmp_path / "o.parquet").write_text("mine")
    result = _release(stores, tmp_path / "o.parquet", "--epsilon", "2")
    _assert_refused(result, r"o.parquet exists; a release is never overwritten", stores, tmp_path, keep=1)
    assert (tmp_path / "o.parquet").read_text() == "mine"
    (tmp_path / "p.csv.PRIVACY.md").write_text("an earlier statement")
    result = _release(stores, tmp_path / "p.csv", "--epsilon", "2", "--format", "csv")
    _assert_refused(result, r"p.csv.PRIVACY.md exists", stores, tmp_path, keep=2)


def test_the_same_release_again_keeps_it_and_spends_nothing(stores, tmp_path, on_threads):
    """Issue 38 (the documented examples, twice): rerunning the same command keeps the release it
    made, says so, exits 0 and spends nothing; another ε on the same OUT is refused as before."""
    out = tmp_path / "o.parquet"
    assert _release(stores, out, "--epsilon", "2").exit_code == 0
    first, statement = _read(out), (tmp_path / "o.parquet.PRIVACY.md").read_text()
    (entry,) = ledger_of(open_dataset(stores / "d.zarr")).entries
    again = _release(stores, out, "--epsilon", "2", "--report", str(tmp_path / "q.html"), "--test-store",
                     str(stores / "t.zarr"))
    assert again.exit_code == 0, again.output
    assert re.search(r"o.parquet already holds DP release [0-9a-f]{32} of these rows \(ε = 2, δ = 0, .*nothing new "
                     r"is released or spent", again.output), again.output
    assert "q.html is not written" in again.output
    assert ledger_of(open_dataset(stores / "d.zarr")).entries == [entry]
    pd.testing.assert_frame_equal(_read(out), first)
    assert (tmp_path / "o.parquet.PRIVACY.md").read_text() == statement
    for other in (["--epsilon", "1"], ["--epsilon", "2", "--dp-data", "fabricated"]):
        result = _release(stores, out, *other)
        assert result.exit_code == 1 and "a release is never overwritten" in result.output, result.output
    assert ledger_of(open_dataset(stores / "d.zarr")).entries == [entry]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.parquet", "o.parquet.PRIVACY.md"]


def test_an_unknown_store_is_refused(stores, tmp_path, on_threads):
    result = CliRunner().invoke(main, ["release", str(tmp_path / "no.zarr"), str(tmp_path / "o"), "--epsilon", "2"])
    assert result.exit_code == 2 and "does not exist" in result.output
    (tmp_path / "folder").mkdir()
    result = CliRunner().invoke(main, ["release", str(tmp_path / "folder"), str(tmp_path / "o"), "--epsilon", "2"])
    assert result.exit_code == 1 and "Traceback" not in result.output and len(result.output.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]


def _assert_refused(result, match: str, stores: Path, where: Path, keep: int = 0) -> None:
    """One line naming the problem, nothing written, nothing spent."""
    assert result.exit_code in (1, 2) and "Traceback" not in result.output
    assert re.search(match, result.output), result.output
    assert len(list(where.iterdir())) == keep
    assert ledger_of(open_dataset(stores / "d.zarr")).entries == []


def test_report_is_computed_on_the_owners_side_in_raw_units(stores, tmp_path, on_threads, monkeypatch):
    calls = []
    fake = types.ModuleType("kahm_dask.report")
    fake.write_quality_report = lambda path, **kwargs: calls.append((path, kwargs))
    monkeypatch.setitem(sys.modules, "kahm_dask.report", fake)
    monkeypatch.setitem(sys.modules, "kahm_dask.report.pictures",
                        types.SimpleNamespace(image_shape_of=image_shape_of))
    result = _release(stores, tmp_path / "o.parquet", "--epsilon", "2", "--report", str(tmp_path / "r.html"),
                      "--test-store", str(stores / "t.zarr"))
    assert result.exit_code == 0, result.output
    ((path, kw),) = calls
    assert path == tmp_path / "r.html" and kw["dp_X"].shape == kw["real_X"].shape == (1257, 64)
    assert kw["test_X"].shape == (540, 64) and kw["real_X"].max() == kw["dp_X"].max() == 16.0  # all raw units
    np.testing.assert_array_equal(kw["dp_y"], kw["real_y"])
    assert kw["statement"].mechanism["epsilon"] == 2.0 and kw["feature_names"][:2] == ["x0", "x1"]
    assert np.all(np.asarray(kw["bounds"][1]) == 16.0)
    assert kw["image_shape"] == (8, 8)  # 64 features: 8 × 8 images


def test_a_record_level_release_with_its_quality_report(stores, tmp_path, on_threads):
    """--record-epsilon is solved to an ε per entry by the accountant (64 features, record ε = 8:
    about 0.21 per entry, between the basic 8/64 and 8), and --report writes the real quality
    report (owner only: 0600) beside the release."""
    out, report = tmp_path / "r.parquet", tmp_path / "q.html"
    result = _release(stores, out, "--record-epsilon", "8", "--report", str(report), "--test-store",
                      str(stores / "t.zarr"))
    assert result.exit_code == 0, result.output
    statement = (tmp_path / "r.parquet.PRIVACY.md").read_text()
    per_entry = float(re.search(r"\| ε per entry \| ([0-9.]+) \|", statement).group(1))
    assert 8 / 64 < per_entry < 8 and "| ε per record (64 features, δ = 1e-05) | 8 |" in statement
    page = report.read_text()
    assert report.stat().st_mode & 0o777 == 0o600 and "Owner only" in page
    # digits' 64 features are drawn as 8 × 8 images: real rows only in the owner-only fidelity section
    fidelity = page[page.index('<section class="owner"'):]
    assert page.index("Real rows beside the DP rows") > page.index('<section class="owner"')
    assert "Real rows beside the DP rows" in fidelity[:fidelity.index("</section>")]


def test_a_record_level_fabricated_release_fabricates_at_the_releases_epsilon(stores, tmp_path, on_threads):
    """The fabrication's classifier solves its ε per entry where a fit does
    (``KAHMClassifier._set_entry_epsilon``); it is the release's (else the release stops)."""
    from kahm_dask.privacy.accounting import entry_epsilon

    out = tmp_path / "f.parquet"
    result = _release(stores, out, "--record-epsilon", "8", "--dp-data", "fabricated", "--seed", "0")
    assert result.exit_code == 0, result.output
    statement = (tmp_path / "f.parquet.PRIVACY.md").read_text()
    per_entry = float(re.search(r"\| ε per entry \| ([0-9.]+) \|", statement).group(1))
    assert per_entry == pytest.approx(entry_epsilon(None, 8.0, 64), rel=1e-3) and "fabricated DP rows" in statement
    frame = _read(out)
    assert frame.shape == (1257, 65) and frame.drop(columns="label").to_numpy().max() <= 16.0
