"""The privacy ledger of a data set (docs/privacy.md#ledger): found by the rows' fingerprint,
shared by every entry point, spent in one locked transaction before the noise is drawn, with a
budget that callers can lower but not raise.

Findings replayed (each failed on the code before): a budget per folder (the same rows released
twice, each ledger saying ε = 2); a caller's budget replacing the stored one ((2, 0) replaced by
(100, 0)); ``PrivacyLedger(budget=(nan, 0))`` accepted; ``KAHMClassifier`` without ``ledger=``
recording nothing; ``DaskKAHMClassifier`` without ``ledger``/``budget``
(tests/pipeline/estimator/test_estimator.py); concurrent releases read-modify-writing one file and
losing entries; a ledger write failing half-way.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import pickle
import stat
import warnings

import numpy as np
import pytest
from sklearn.base import clone

from kahm_dask import KAHMClassifier, PrivacyLedger
from kahm_dask.privacy.fingerprint import combine, fingerprint, partial_sums
from kahm_dask.privacy.ledger import (
    LEDGER_DIR_ENV,
    BudgetChangeError,
    BudgetExceededError,
    BudgetRefusalWarning,
    LedgerError,
    default_ledger_dir,
)
from kahm_dask.privacy.ledger_rows import locate, merge, new_key, row_digests, unique_rows
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import PrivacyLeakWarning
from tests._kit import ledger_of, leftovers


def _dp(**kw) -> KAHMClassifier:
    return KAHMClassifier(n_components=10, epsilon=2.0, bounds=(0, 1), random_state=0, **kw)


# --------------------------------------------------------------------------- the fingerprint


def test_fingerprint_is_the_rows_not_their_order_chunking_or_dtype():
    X = np.random.default_rng(0).uniform(size=(500, 7)).astype(np.float32)
    a = fingerprint(X)
    assert fingerprint(X[np.random.default_rng(1).permutation(500)]).rows == a.rows  # any order
    assert fingerprint(X.astype(np.float64)) == a  # the same values in float64
    blocks = [partial_sums(X[i:i + 37], i) for i in range(0, 500, 37)]
    assert combine(reversed(blocks), 500, 7) == a  # blocks in any order, of any size
    Y = X.copy()
    Y[123, 4] = np.nextafter(Y[123, 4], np.float32(2))  # one entry, one ulp
    assert fingerprint(Y).rows != a.rows and fingerprint(Y).order != a.order
    assert fingerprint(X[::-1]).order != a.order  # the order fingerprint binds stored noise to row order
    assert fingerprint(X[:, ::-1]).rows != a.rows  # columns are features: their order matters
    assert fingerprint(-0.0 * np.ones((2, 2))) == fingerprint(np.zeros((2, 2)))


# --------------------------------------------------------------------------- where it lives


def test_the_ledger_directory_default_and_override(monkeypatch, tmp_path):
    monkeypatch.delenv(LEDGER_DIR_ENV)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_ledger_dir() == tmp_path / "xdg" / "kahm-dask" / "ledgers"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_ledger_dir() == tmp_path / "home" / ".local" / "share" / "kahm-dask" / "ledgers"
    monkeypatch.setenv(LEDGER_DIR_ENV, str(tmp_path / "mine"))
    assert default_ledger_dir() == tmp_path / "mine"


def test_the_ledger_is_private_and_holds_no_row(ledger_dir):
    X = np.eye(3) * 0.37
    ledger = PrivacyLedger.for_data(X)
    ledger.spend(1.0, 0.0, release_id="a", what="test")
    assert ledger.path == ledger_dir and ledger.file == ledger_dir / "ledger.json"
    assert stat.S_IMODE(ledger_dir.stat().st_mode) == 0o700
    assert sorted(p.name for p in ledger_dir.iterdir()) == [
        "ledger.json", "ledger.json.lock", "rows-1-hi.npy", "rows-1-history.npy", "rows-1-lo.npy"]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in ledger_dir.iterdir())
    assert b"0.37" not in b"".join(p.read_bytes() for p in ledger_dir.iterdir())
    ledger.file.write_text("{")
    with pytest.raises(LedgerError, match="damaged.*No release was made"):
        ledger.spend(1.0, 0.0, release_id="b", what="test")


# --------------------------------------------------------------------------- budgets


@pytest.mark.parametrize("budget", [(math.nan, 0.0), (math.inf, 0.0), (1.0, math.nan), (0.0, 0.0), (1.0, 1.0),
                                    (-1.0, 0.0), ("a", 0)])
def test_non_finite_or_invalid_budgets_are_refused(budget):
    with pytest.raises(ValueError, match="budget"):
        PrivacyLedger(budget=budget)
    with pytest.raises(ValueError, match="budget"):
        _dp(budget=budget).fit(np.eye(4), [0, 0, 1, 1])


def test_a_caller_lowers_a_budget_but_never_raises_it(tmp_path):
    path = tmp_path / "l"
    PrivacyLedger(path, budget=(2.0, 0.0))
    with pytest.raises(BudgetChangeError, match="may lower it but not raise it"):
        PrivacyLedger(path, budget=(100.0, 0.0))  # this replaced the stored budget before
    with pytest.raises(BudgetChangeError):
        PrivacyLedger(path, budget=(1.0, 1e-6))  # δ raised
    assert PrivacyLedger(path).budget == (2.0, 0.0)
    PrivacyLedger(path, budget=(1.5, 0.0))  # lowered: kept
    assert PrivacyLedger(path).budget == (1.5, 0.0)
    PrivacyLedger(path).set_budget(5.0, 0.0, allow_raise=True)  # the owner's explicit decision
    ledger = PrivacyLedger(path)
    assert ledger.budget == (5.0, 0.0) and ledger.remaining() == (5.0, 0.0)
    assert [c["by"] for c in json.loads((path / "ledger.json").read_text())["budget_changes"]] == [
        "caller (lowered)", "caller (lowered)", "owner (set)"]


def test_spending_is_checked_recorded_once_and_remaining_is_exact():
    ledger = PrivacyLedger(budget=(3.0, 1e-6))
    assert ledger.remaining() == (3.0, 1e-6)
    ledger.spend(1.0, 0.0, release_id="a", what="x")
    assert ledger.spend(2.0, 0.0, release_id="a", what="again")["epsilon"] == 1.0  # a known release: once
    ledger.spend(2.0, 1e-6, release_id="b", what="y")
    assert ledger.spent() == (3.0, 1e-6) and ledger.remaining() == (0.0, 0.0)
    with pytest.raises(BudgetExceededError, match="2 release"), pytest.warns(BudgetRefusalWarning):
        ledger.spend(1e-3, 0.0, release_id="c", what="z")
    assert PrivacyLedger().remaining() == (math.inf, 1.0)  # no budget: no limit


def _spend_in_a_process(args) -> str:
    path, i = args
    try:
        PrivacyLedger(path).spend(1.0, 0.0, release_id=f"r{i}", what="concurrent")
        return "spent"
    except BudgetExceededError:
        return "refused"


def test_concurrent_releases_are_all_recorded_or_refused(tmp_path):
    """12 processes spend ε = 1 at once against a budget of 5: 5 are recorded, 7 refused, none
    lost (the old ledger read the file once and rewrote it whole)."""
    path = tmp_path / "l"
    PrivacyLedger(path, budget=(5.0, 0.0))
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        outcomes = pool.map(_spend_in_a_process, [(path, i) for i in range(12)])
    ledger = PrivacyLedger(path)
    assert outcomes.count("spent") == 5 and outcomes.count("refused") == 7
    assert len(ledger.entries) == 5 and ledger.spent() == (5.0, 0.0)
    assert {e["release_id"] for e in ledger.entries} == {f"r{i}" for i, o in enumerate(outcomes) if o == "spent"}


# --------------------------------------------------------------------------- the estimators


def test_kahm_classifier_records_in_the_rows_own_ledger_by_default(digits):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        _dp().fit(digits.X_train, digits.y_train)
        _dp().fit(digits.X_train[::-1], digits.y_train[::-1])  # the same rows: charged again
    entries = ledger_of(digits.X_train).entries
    assert [e["epsilon"] for e in entries] == [2.0, 2.0] and entries[0]["what"].startswith("KAHMClassifier.fit")


def test_opting_out_of_the_ledger_is_explicit_and_warned(digits):
    with pytest.warns(PrivacyLeakWarning, match="ledger=None"):
        _dp(ledger=None).fit(digits.X_train, digits.y_train)
    assert ledger_of(digits.X_train).entries == []
    with pytest.raises(ValueError, match="a budget needs a ledger"):
        with pytest.warns(PrivacyLeakWarning):
            _dp(ledger=None, budget=(4.0, 0.0)).fit(digits.X_train, digits.y_train)


def test_a_budget_refuses_before_any_noise_is_drawn(digits, monkeypatch):
    _dp(budget=(3.0, 0.0)).fit(digits.X_train, digits.y_train)
    drawn = []
    monkeypatch.setattr(GridLaplace, "release", lambda *a, **k: drawn.append(1))
    with pytest.raises(BudgetExceededError, match="beyond the budget"):
        _dp().fit(digits.X_train, digits.y_train)  # the stored budget holds without a caller's
    with pytest.raises(BudgetExceededError):
        _dp(budget=(3.0, 0.0)).fit(digits.X_train, digits.y_train)
    assert drawn == [] and ledger_of(digits.X_train).spent() == (2.0, 0.0)


def test_a_ledger_directory_parameter_and_a_ledger_object(digits, tmp_path):
    _dp(ledger=str(tmp_path / "mine")).fit(digits.X_train, digits.y_train)
    assert PrivacyLedger.for_data(digits.X_train, tmp_path / "mine").spent() == (2.0, 0.0)
    book = PrivacyLedger(tmp_path / "one", budget=(2.0, 0.0))  # a ledger-wide budget
    clf = _dp(ledger=book)
    assert clone(clf).ledger is book  # clones share the account
    assert pickle.loads(pickle.dumps(clf)).ledger.path == book.path
    clf.fit(digits.X_train, digits.y_train)
    with pytest.raises(BudgetExceededError):
        clone(clf).fit(digits.X_train, digits.y_train)


def test_ledger_failure_mid_write_keeps_the_old_ledger(tmp_path, disk_full):
    path = tmp_path / "ledgers"
    PrivacyLedger(path, budget=(5.0, 0.0)).spend(1.0, 0.0, release_id="a", what="rows")
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    disk_full()
    with pytest.raises(OSError, match="No space left"):
        PrivacyLedger(path).spend(2.0, 0.0, release_id="b", what="rows")
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before
    assert PrivacyLedger(path).spent() == (1.0, 0.0) and PrivacyLedger(path).budget == (5.0, 0.0)
    assert leftovers(path) == []


# --------------------------------------------------------------------------- by rows


def test_row_digests_are_keyed_at_float32_and_blind_to_what_they_cannot_see():
    X = np.random.default_rng(0).normal(size=(200, 6))
    key = new_key()
    d = row_digests(X, key)
    assert (row_digests(X.astype(np.float32), key) == d).all()  # a float32 copy: the same rows
    assert len(unique_rows(d)) == 200 and not (row_digests(X, new_key()) == d).any()  # another key: other digests
    assert (row_digests(X[:, ::-1], key) != d).any(axis=1).all()  # permuted columns: other rows (stated)
    assert (row_digests(2 * X + 1, key) != d).any(axis=1).all()  # an affine rescaling: other rows (stated)
    assert (row_digests(-0.0 * np.ones((1, 3)), key) == row_digests(np.zeros((1, 3)), key)).all()


def test_the_index_locates_and_merges_like_a_sorted_set():
    """locate + merge against Python sets, with hi collisions forced (lo decides)."""
    rng = np.random.default_rng(1)
    old = unique_rows(np.c_[rng.integers(0, 50, 300, dtype=np.uint64), rng.integers(0, 2**63, 300, dtype=np.uint64)])
    hist = rng.integers(0, 9, len(old)).astype(np.uint32)
    new = unique_rows(np.r_[old[::7], np.c_[rng.integers(0, 50, 80, dtype=np.uint64),
                                             rng.integers(0, 2**63, 80, dtype=np.uint64)]])
    found, position = locate(old[:, 0], old[:, 1], new)
    assert (found == [tuple(r) in set(map(tuple, old)) for r in new]).all()
    assert (old[position[found]] == new[found]).all()
    out = tuple(np.zeros(len(old) + int((~found).sum()), dt) for dt in (np.uint64, np.uint64, np.uint32))
    merge((old[:, 0], old[:, 1], hist), new[~found], position[~found], np.full(int((~found).sum()), 99, np.uint32),
          out)
    assert (np.c_[out[0], out[1]] == unique_rows(np.r_[old, new])).all()
    assert (out[2] == 99).sum() == (~found).sum() and sorted(out[2][out[2] != 99]) == sorted(hist)


def _released(ledger_dir, X, what):
    return PrivacyLedger.for_data(X, ledger_dir).spend(2.0, 0.0, release_id=what, what=what)


@pytest.mark.parametrize("again", ["appended row", "removed row", "float32 copy", "test size 0.29", "fold"])
def test_rows_released_again_in_another_data_set_share_their_spend(ledger_dir, digits, again):
    """With a budget of one ε = 2 release spent, a second release over the same rows in another
    form is refused (each of these was allowed when the ledger counted exact data sets)."""
    X = np.r_[digits.X_train, digits.X_test]
    first = X[:1275]
    PrivacyLedger.for_data(first, ledger_dir, budget=(2.0, 0.0))
    _released(ledger_dir, first, "first")
    second = {"appended row": X[:1276], "removed row": X[:1274], "float32 copy": first.astype(np.float32),
              "test size 0.29": X[26:1301], "fold": first[::3]}[again]
    with pytest.raises(BudgetExceededError, match=r"would take \d+ of its \d+ row\(s\).*first") as refused, \
            pytest.warns(BudgetRefusalWarning):
        _released(ledger_dir, second, "second")
    message = str(refused.value)
    assert str(ledger_dir / "ledger.json") in message and "kahm-dask ledger show" in message
    assert "--raise" in message and "reuses its stored noise" in message
    assert PrivacyLedger.for_data(second, ledger_dir).spent() == (2.0, 0.0)


def test_each_row_carries_its_own_history(ledger_dir):
    X = np.random.default_rng(2).uniform(size=(100, 4))
    _released(ledger_dir, X[:60], "a")
    _released(ledger_dir, X[40:], "b")
    _released(ledger_dir, X[50:55], "c")
    levels = {(level["rows"], level["spent"][0]) for level in PrivacyLedger.for_data(X, ledger_dir).levels()}
    assert levels == {(40, 2.0), (15, 4.0), (5, 6.0), (40, 2.0)}  # 0-39: a; 40-49, 55-59: a b; 50-54: a b c
    assert sorted(level["rows"] for level in PrivacyLedger(ledger_dir).levels()) == [5, 15, 40, 40]
    assert PrivacyLedger.for_data(X[60:], ledger_dir).spent() == (2.0, 0.0)
    assert PrivacyLedger.for_data(X, ledger_dir).spent() == (6.0, 0.0)
    assert [e["release_id"] for e in PrivacyLedger.for_data(X[:10], ledger_dir).entries] == ["a"]
    assert PrivacyLedger(ledger_dir).n_rows == 100


def test_an_earlier_per_data_set_ledger_is_charged_to_its_rows_once(ledger_dir):
    """A ledger directory of an earlier kahm-dask (one <fingerprint>.json per data set) is not
    a fresh start: its releases and budget pass to the rows the first time they are seen."""
    X = np.random.default_rng(3).uniform(size=(50, 4))
    old = {"format": "kahm-dask privacy ledger", "version": 2, "budget": [3.0, 0.0], "budget_changes": [],
           "data": fingerprint(X).to_dict(),
           "entries": [{"release_id": "old", "epsilon": 2.0, "delta": 0.0, "what": "rows", "time": "2026"}]}
    (ledger_dir / f"{fingerprint(X).rows}.json").write_text(json.dumps(old))
    book = PrivacyLedger.for_data(X[::-1])  # the same rows in another order
    assert book.spent() == (2.0, 0.0) and book.budget == (3.0, 0.0)
    with pytest.raises(BudgetExceededError, match="old"), pytest.warns(BudgetRefusalWarning):
        PrivacyLedger.for_data(X[:10]).spend(2.0, 0.0, release_id="new", what="a subset")
    assert PrivacyLedger.for_data(X).spent() == (2.0, 0.0)  # folded once
