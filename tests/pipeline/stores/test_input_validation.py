"""Bad input to the dataset store (docs/reliability.md §1): write_dataset and ingest reject it
naming the problem and the fix, and a failed ingest leaves neither a store nor a temporary one
(tests/core/test_input_validation.py has the estimator's table)."""

from __future__ import annotations

from pathlib import Path

import dask.array as da
import numpy as np
import pytest

from kahm_dask.pipeline.stores.dataset import ingest, write_dataset
from tests._kit import BAD_INPUT_X as X
from tests._kit import BAD_INPUT_Y as Y
from tests._kit import MIXED_LABELS as MIXED_LIST
from tests._kit import Rejection as Case
from tests._kit import assert_rejects as _check
from tests._kit import with_entry as _with

RNG = np.random.default_rng(1)


STORE = {
    "nan": Case(lambda t: write_dataset(t / "s", _with(np.nan), Y), ValueError,
                r"non-finite value at row 3, column 2: nan", r"remove or impute"),
    "inf": Case(lambda t: write_dataset(t / "s", _with(np.inf), Y), ValueError,
                r"non-finite value at row 3, column 2: inf", r"remove or impute"),
    "nan (dask)": Case(lambda t: write_dataset(t / "s", da.from_array(_with(np.nan), chunks=(10, 5)), Y),
                       ValueError, r"non-finite value at row 3, column 2", r"remove or impute"),
    "float32 overflow": Case(lambda t: write_dataset(t / "s", _with(1e300), Y, dtype="float32"), ValueError,
                             r"overflows float32", r"dtype='float64'"),
    "rank 1": Case(lambda t: write_dataset(t / "s", X[:, 0], Y), ValueError, r"must be 2-D", r"reshape"),
    "rank 3": Case(lambda t: write_dataset(t / "s", X[:, :, None], Y), ValueError, r"must be 2-D", r"reshape"),
    "empty": Case(lambda t: write_dataset(t / "s", X[:0], Y[:0]), ValueError, r"at least one row"),
    "X/y lengths": Case(lambda t: write_dataset(t / "s", X, Y[:-1]), ValueError, r"39 labels but X has 40 rows"),
    "mixed labels (list)": Case(lambda t: write_dataset(t / "s", X, MIXED_LIST), TypeError,
                                r"labels of type\(s\) int, str", r"astype\(str\)"),
    "mixed labels (object)": Case(lambda t: write_dataset(t / "s", X, np.array(MIXED_LIST, dtype=object)),
                                  TypeError, r"int, str", r"astype\(str\)"),
    "fractional labels": Case(lambda t: write_dataset(t / "s", X, RNG.random(40)), TypeError,
                              r"non-integer floats", r"integers or strings"),
    "2-D labels": Case(lambda t: write_dataset(t / "s", X, Y[:, None]), ValueError, r"y must be 1-D"),
    "string features": Case(lambda t: write_dataset(t / "s", X.astype(str), Y), TypeError, r"real numbers"),
    "existing path": Case(lambda t: write_dataset(write_dataset(t / "s", X, Y).path, X, Y), FileExistsError,
                          r"already exists", r"overwrite=True"),
    "csv nan": Case(lambda t: ingest(_csv(t, "1,2,3\n4,nan,0\n"), t / "s"), ValueError,
                    r"non-finite value at row 1, column 1", r"impute"),
    "csv text": Case(lambda t: ingest(_csv(t, "1,2,3\n4,abc,0\n"), t / "s"), ValueError,
                     r"Cannot parse .* as a numeric CSV"),
    "npz object labels": Case(lambda t: ingest(_npz(t), t / "s"), ValueError, r"Python object array",
                              r"astype\(str\)"),
    "missing file": Case(lambda t: ingest(t / "nope.csv", t / "s"), FileNotFoundError, r"not found"),
}


def _csv(tmp: Path, text: str) -> Path:
    path = tmp / "d.csv"
    path.write_text(text)
    return path


def _npz(tmp: Path) -> Path:
    path = tmp / "d.npz"
    np.savez(path, X=X, y=np.array(MIXED_LIST, dtype=object))
    return path


@pytest.mark.parametrize("name", list(STORE))
def test_store_rejects(name, tmp_path):
    _check(STORE[name], tmp_path)
    if name != "existing path":
        assert not (tmp_path / "s").exists(), "a failed ingest left a store behind"
    assert not list(tmp_path.glob("*.tmp-*")), "a failed ingest left a temporary store"
