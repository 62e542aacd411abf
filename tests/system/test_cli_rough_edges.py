"""The command line speaks the command line, and never damages a user's files.

Findings replayed (each failed on the code before): `predict` onto an existing plain file moved
it to a hidden ``.out.txt.old-…`` and succeeded; `ingest` onto an existing path said "pass
overwrite=True" (the Python keyword); `train --bounds 0 1` on raw breast-cancer values (0 to
4254) clipped 35 % of the entries without a word.
"""

from __future__ import annotations

import contextlib

import pytest
from click.testing import CliRunner

from kahm_dask.cli import main
from kahm_dask.cli.session import one_line_warning
from kahm_dask.privacy.bounds import ClippingWarning


def _invoke(*args, monkeypatch=None):
    if monkeypatch is not None:
        monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))
    return CliRunner().invoke(main, [str(a) for a in args])


def test_predict_refuses_to_replace_a_file_that_is_not_a_prediction_store(tmp_path, monkeypatch):
    assert _invoke("ingest", "sklearn:iris", tmp_path / "iris.zarr").exit_code == 0
    assert _invoke("train", tmp_path / "iris.zarr", tmp_path / "m.zarr", "--n-components", "3",
                   monkeypatch=monkeypatch).exit_code == 0
    out = tmp_path / "out.txt"
    out.write_text("my results")
    result = _invoke("predict", tmp_path / "m.zarr", tmp_path / "iris.zarr", out)
    assert result.exit_code == 1 and "out.txt exists and is not a kahm-dask prediction store" in result.output
    assert out.read_text() == "my results" and sorted(p.name for p in tmp_path.glob(".out.txt*")) == []
    pred = tmp_path / "pred.zarr"
    for _ in range(2):  # earlier predictions are replaced
        assert _invoke("predict", tmp_path / "m.zarr", tmp_path / "iris.zarr", pred).exit_code == 0


def test_ingest_onto_an_existing_store_names_the_flag(tmp_path):
    assert _invoke("ingest", "sklearn:iris", tmp_path / "s.zarr").exit_code == 0
    # the same ingest again keeps the store (tests/system/test_cli_input_validation.py); other rows are refused
    for extra in (["--dtype", "float32"], ["--bounds", "0", "10", "--scale", "minmax"]):
        result = _invoke("ingest", "sklearn:iris", tmp_path / "s.zarr", *extra)
        assert result.exit_code == 1 and "add --overwrite" in result.output and "overwrite=True" not in result.output
    assert _invoke("ingest", "sklearn:iris", tmp_path / "s.zarr", "--overwrite").exit_code == 0


def test_train_warns_when_the_bounds_clip_many_entries(tmp_path, monkeypatch):
    assert _invoke("ingest", "sklearn:breast_cancer", tmp_path / "bc.zarr").exit_code == 0
    with pytest.warns(ClippingWarning, match=r"35\.\d % of the entries lie outside \[0, 1\]") as caught:
        result = _invoke("train", tmp_path / "bc.zarr", tmp_path / "m.zarr", "--epsilon", "2", "--bounds", "0", "1",
                         monkeypatch=monkeypatch)
    assert result.exit_code == 0, result.output
    w = next(w for w in caught if w.category is ClippingWarning)
    line = one_line_warning(w.message, w.category, w.filename, w.lineno)  # how the console shows it
    assert line.startswith("ClippingWarning: 35.") and line.count("\n") == 1 and ".py" not in line


def test_ingest_with_public_bounds_records_them_for_train(tmp_path, monkeypatch):
    result = _invoke("ingest", "sklearn:digits", tmp_path / "tr.zarr", "--test-store", tmp_path / "te.zarr",
                     "--bounds", "0", "16", "--scale", "minmax")
    assert result.exit_code == 0, result.output
    assert "1257 rows" in result.output and "540 rows" in result.output
    assert "public feature range recorded" in result.output
    result = _invoke("train", tmp_path / "tr.zarr", tmp_path / "m.zarr", "--epsilon", "2", monkeypatch=monkeypatch)
    assert result.exit_code == 0 and "Warning" not in result.output, result.output
    statement = (tmp_path / "m.zarr.PRIVACY.md").read_text()
    assert "| bounds | [0, 16] in raw units ([0, 1] after minmax scaling)" in statement
