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
    LedgerError,
    default_ledger_dir,
)
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


def test_a_data_sets_ledger_is_private_and_names_its_rows(ledger_dir):
    fp = fingerprint(np.eye(3))
    ledger = PrivacyLedger.for_data(fp)
    ledger.spend(1.0, 0.0, release_id="a", what="test")
    assert ledger.path == ledger_dir / f"{fp.rows}.json"
    assert stat.S_IMODE(ledger_dir.stat().st_mode) == 0o700 and stat.S_IMODE(ledger.path.stat().st_mode) == 0o600
    assert json.loads(ledger.path.read_text())["data"]["rows"] == fp.rows
    other = fingerprint(np.eye(4))
    with pytest.raises(LedgerError, match="belongs to another data set"):
        PrivacyLedger(ledger.path, data=other).spent()
    ledger.path.write_text("{")
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
    path = tmp_path / "l.json"
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
    assert [c["by"] for c in json.loads(path.read_text())["budget_changes"]] == [
        "caller (lowered)", "caller (lowered)", "owner (set)"]


def test_spending_is_checked_recorded_once_and_remaining_is_exact():
    ledger = PrivacyLedger(budget=(3.0, 1e-6))
    assert ledger.remaining() == (3.0, 1e-6)
    ledger.spend(1.0, 0.0, release_id="a", what="x")
    assert ledger.spend(2.0, 0.0, release_id="a", what="again")["epsilon"] == 1.0  # a known release: once
    ledger.spend(2.0, 1e-6, release_id="b", what="y")
    assert ledger.spent() == (3.0, 1e-6) and ledger.remaining() == (0.0, 0.0)
    with pytest.raises(BudgetExceededError, match="2 release"):
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
    path = tmp_path / "l.json"
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
        _dp().fit(digits.X_train[::-1], digits.y_train[::-1])  # the same rows: the same ledger
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
    assert PrivacyLedger.for_data(fingerprint(digits.X_train), tmp_path / "mine").spent() == (2.0, 0.0)
    book = PrivacyLedger(tmp_path / "one.json", budget=(2.0, 0.0))
    clf = _dp(ledger=book)
    assert clone(clf).ledger is book  # clones share the account
    assert pickle.loads(pickle.dumps(clf)).ledger.path == book.path
    clf.fit(digits.X_train, digits.y_train)
    with pytest.raises(BudgetExceededError):
        clone(clf).fit(digits.X_train, digits.y_train)


def test_ledger_failure_mid_write_keeps_the_old_ledger(tmp_path, disk_full):
    path = tmp_path / "ledgers" / "s.json"
    PrivacyLedger(path, budget=(5.0, 0.0)).spend(1.0, 0.0, release_id="a", what="rows")
    before = path.read_bytes()
    disk_full()
    with pytest.raises(OSError, match="No space left"):
        PrivacyLedger(path).spend(2.0, 0.0, release_id="b", what="rows")
    assert path.read_bytes() == before
    assert PrivacyLedger(path).spent() == (1.0, 0.0) and PrivacyLedger(path).budget == (5.0, 0.0)
    assert leftovers(path.parent) == []
