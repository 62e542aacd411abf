"""The privacy ledger by rows, through the CLI and scikit-learn (docs/privacy.md#ledger).

Findings replayed (each allowed a second ε = 2 release under a budget of one on the code that
counted exact data sets): one row appended; one row removed; the rows cast to float32;
``--test-size 0.29`` instead of 0.3; ``GridSearchCV`` over 3 folds (7 releases over 4 ledgers, no
ledger showing a row's 5); a budget refusal inside ``GridSearchCV`` turned into a NaN score; a
moved or deleted ledger directory resetting the budget of a store's rows.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
from click.testing import CliRunner
from sklearn.model_selection import GridSearchCV

from kahm_dask import KAHMClassifier
from kahm_dask.cli import main
from kahm_dask.pipeline.stores.dataset import open_dataset, write_dataset
from kahm_dask.privacy.ledger import BudgetExceededError, BudgetRefusalWarning, PrivacyLedger
from kahm_dask.privacy.randomness import PrivacyLeakWarning
from tests._kit import ledger_of


@pytest.fixture(autouse=True)
def _threads(monkeypatch):
    """`kahm-dask train` on threads in this process instead of a cluster."""
    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))


def _train(store, model, *extra) -> object:
    args = ["train", str(store), str(model), "--n-components", "3", "--n-layers", "1", "--epsilon", "2",
            "--bounds", "0", "16", "--budget", "2", "0", *map(str, extra)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BudgetRefusalWarning)
        return CliRunner().invoke(main, args)


def _digits_store(tmp_path):
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = X / 7.0  # not exact in float32: a float32 copy changes every fraction (by up to 3e-8 relative)
    return write_dataset(tmp_path / "first.zarr", X[:300], y[:300]), X, y


@pytest.mark.parametrize("again", ["appended row", "removed row", "float32 copy"])
def test_train_refuses_the_same_rows_in_another_store(tmp_path, again):
    first, X, y = _digits_store(tmp_path)
    assert (done := _train(first.location.path, tmp_path / "m1.zarr")).exit_code == 0, done.output
    rows, labels, dtype = {"appended row": (X[:301], y[:301], "float64"), "removed row": (X[:299], y[:299], "float64"),
                           "float32 copy": (X[:300], y[:300], "float32")}[again]
    second = write_dataset(tmp_path / "second.zarr", rows, labels, dtype=dtype)
    refused = _train(second.location.path, tmp_path / "m2.zarr")
    assert refused.exit_code == 1 and "BudgetExceededError" in refused.output
    assert {"appended row": "300 of its 301", "removed row": "299 of its 299",
            "float32 copy": "300 of its 300"}[again] + " row(s)" in refused.output
    assert "ledger.json" in refused.output and "kahm-dask ledger show" in refused.output
    assert not (tmp_path / "m2.zarr").exists()
    shown = CliRunner().invoke(main, ["ledger", "show", str(second.location.path)])
    assert shown.exit_code == 0 and "ε = 2" in shown.output and "1 release(s)" in shown.output


def test_a_re_split_shares_its_rows_spend(tmp_path):
    """`ingest --test-size 0.29` after 0.3: 1,249 of 1,275 training rows shared."""
    runner = CliRunner()
    for name, size in (("a", "0.3"), ("b", "0.29")):
        done = runner.invoke(main, ["ingest", "sklearn:digits", str(tmp_path / f"{name}.zarr"), "--test-store",
                                    str(tmp_path / f"{name}-test.zarr"), "--test-size", size, "--bounds", "0", "16"])
        assert done.exit_code == 0, done.output
    assert _train(tmp_path / "a.zarr", tmp_path / "ma.zarr").exit_code == 0
    refused = _train(tmp_path / "b.zarr", tmp_path / "mb.zarr")
    assert refused.exit_code == 1 and "beyond the budget" in refused.output


def test_the_store_remembers_its_releases_when_the_ledger_is_moved(tmp_path, ledger_dir):
    first, _, _ = _digits_store(tmp_path)
    store = first.location.path
    assert _train(store, tmp_path / "m1.zarr").exit_code == 0
    assert [r["epsilon"] for r in open_dataset(store).releases] == [2.0]
    elsewhere = tmp_path / "new-ledgers"  # --ledger-dir, $KAHM_DASK_LEDGER_DIR, XDG_DATA_HOME or rm -r
    refused = _train(store, tmp_path / "m2.zarr", "--ledger-dir", elsewhere)
    assert refused.exit_code == 1 and "does not record" in refused.output
    assert str(ledger_dir / "ledger.json") in refused.output and "kahm-dask ledger adopt" in refused.output
    adopted = CliRunner().invoke(main, ["ledger", "adopt", str(store), "--ledger-dir", str(elsewhere)])
    assert adopted.exit_code == 0 and "adopted 1 release" in adopted.output
    assert PrivacyLedger.for_data(open_dataset(store).row_digests, elsewhere).spent() == (2.0, 0.0)
    again = _train(store, tmp_path / "m3.zarr", "--ledger-dir", elsewhere)
    assert again.exit_code == 1 and "beyond the budget" in again.output  # the budget holds in the new ledger
    forgot = CliRunner().invoke(main, ["ledger", "adopt", str(store), "--forget", "--ledger-dir", str(tmp_path / "x")])
    assert forgot.exit_code == 0 and open_dataset(store).releases == []


def _search(X, y, **kw) -> GridSearchCV:
    clf = KAHMClassifier(epsilon=2.0, bounds=(0, 1), random_state=0, **kw)
    return GridSearchCV(clf, {"n_components": [5, 8]}, cv=3)


def test_grid_search_charges_each_row_every_fit_it_was_in(digits):
    """2 settings x 3 folds + the refit: each row is in 2 x 2 + 1 = 5 releases of ε = 2."""
    X, y = digits.X_train[:240], digits.y_train[:240]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        _search(X, y).fit(X, y)
    book = ledger_of(X)
    assert book.spent() == (10.0, 0.0) and len(book.entries) == 7
    assert [(level["rows"], level["spent"][0]) for level in book.levels()] == [(80, 10.0)] * 3  # by fold


def test_a_refusal_in_grid_search_is_loud_and_no_row_passes_its_budget(digits):
    X, y = digits.X_train[:240], digits.y_train[:240]
    with pytest.warns(BudgetRefusalWarning, match="beyond the budget"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PrivacyLeakWarning)
            with pytest.raises(BudgetExceededError):  # the refit, at the latest, is refused out loud
                _search(X, y, budget=(2.0, 0.0)).fit(X, y)
    assert ledger_of(X).spent() == (2.0, 0.0)  # the successful fits: no row beyond its budget
    search = GridSearchCV(KAHMClassifier(epsilon=2.0, bounds=(0, 1), random_state=0, budget=(2.0, 0.0)),
                          {"n_components": [5, 8]}, cv=3, error_score="raise")
    with pytest.raises(BudgetExceededError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        search.fit(X, y)


def test_a_federated_fit_after_a_central_one_is_charged_to_the_same_rows(digits):
    """The quickstart's central run and then a federated run over the same rows: each site's rows
    were all released by the central fit."""
    from kahm_dask.federated import fit_sites, split_sites

    X, y = digits.X_train[:300], digits.y_train[:300]
    KAHMClassifier(n_components=5, epsilon=2.0, bounds=(0, 1), budget=(2.0, 0.0), random_state=0).fit(X, y)
    with pytest.raises(BudgetExceededError, match=r"(\d+) of its \1 row"), pytest.warns(BudgetRefusalWarning):
        fit_sites(KAHMClassifier(n_components=5, epsilon=2.0, bounds=(0, 1), random_state=0), X, y,
                  split_sites(y, 2, "iid", random_state=0))
    assert ledger_of(X).spent() == (2.0, 0.0)
