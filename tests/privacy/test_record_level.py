"""The record-level ε on the in-memory classifier: the statement's per-record lines (PLD beside
the basic bound), a record-level target (``record_epsilon``), and one unit of change in the ledger
(a release with d below the bound width charged by group privacy)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.utils._param_validation import InvalidParameterError

from kahm_dask import KAHMClassifier
from kahm_dask.datasets import load_bundled
from kahm_dask.privacy.accounting import SOLVE_RTOL, record_epsilon
from kahm_dask.privacy.bounds import BOUNDS_PUBLIC
from kahm_dask.privacy.ledger import PrivacyLedger
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import PrivacyLeakWarning
from kahm_dask.privacy.statement import PrivacyStatement


@pytest.fixture(scope="module")
def breast_cancer():
    """The bundled breast cancer rows (569 x 30) scaled to [0, 1] (the test's public bounds)."""
    X, y = load_bundled("breast_cancer")
    return (X - X.min(0)) / np.ptp(X, axis=0), y


def _fit(X, y, **kw) -> KAHMClassifier:
    return KAHMClassifier(n_components=3, bounds=(0.0, 1.0), random_state=0, **kw).fit(X, y)


def test_statement_of_a_breast_cancer_fit_gives_the_pld_beside_the_basic_bound(breast_cancer):
    clf = _fit(*breast_cancer, epsilon=0.1, ledger=PrivacyLedger())
    md = clf.privacy_statement_.to_markdown()
    assert "| ε per entry | 0.1 |" in md
    assert "| ε per record (30 features, δ = 1e-05) | 2.11 |" in md  # PLD (exact: 2.1102)
    assert "| ε per record, basic bound | 3 |" in md
    assert "a whole record is protected at ε = 2.11, and above ε ≈ 10 a record is not meaningfully protected" in md
    assert clf.epsilon_ == 0.1 and clf.privacy_statement_.epsilon_per_record.pld == pytest.approx(2.1102, abs=1e-4)


def test_a_record_level_target_solves_the_entry_epsilon(breast_cancer):
    ledger = PrivacyLedger()
    clf = _fit(*breast_cancer, record_epsilon=4.0, ledger=ledger)
    assert clf.epsilon_ == pytest.approx(0.18, abs=0.001)  # ≈ 0.1800 per entry on 30 features
    record = clf.privacy_statement_.epsilon_per_record
    assert 4.0 * (1 - 2 * SOLVE_RTOL) <= record.pld <= 4.0  # met from below, within the solver's tolerance
    md = clf.privacy_statement_.to_markdown()
    assert "| ε per record (30 features, δ = 1e-05) | 4 |" in md and "| ε per record, basic bound | 5.4 |" in md
    assert ledger.spent() == (pytest.approx(clf.epsilon_), 0.0)  # the ledger is charged per entry


def test_record_delta_is_the_delta_of_the_target(breast_cancer):
    clf = _fit(*breast_cancer, record_epsilon=4.0, record_delta=1e-8, ledger=PrivacyLedger())
    assert clf.privacy_statement_.epsilon_per_record.delta == 1e-8
    assert clf.epsilon_ < 0.17  # a smaller δ costs ε: 0.1800 at 1e-5
    assert record_epsilon(clf.epsilon_, 30, 1e-8).pld <= 4.0


@pytest.mark.parametrize(("kw", "pattern"), [
    (dict(epsilon=0.5, record_epsilon=4.0), r"'record_epsilon' parameter of KAHMClassifier is invalid: set epsilon"),
    (dict(record_epsilon=0.0), r"'record_epsilon' parameter of KAHMClassifier must be None or a finite float > 0"),
    (dict(record_epsilon=4.0, record_delta=0.0), r"'record_delta' parameter of KAHMClassifier must be"),
    (dict(record_epsilon=0.01), r"record_epsilon = 0.01 over 30 features needs epsilon = 0.00.* per entry: below "
                                r"0.001 the noise"),
    (dict(record_epsilon=4.0, delta=1e-6), r"record_epsilon cannot be met at record_delta = 1e-05"),
])
def test_a_bad_target_is_refused_before_anything_is_spent(breast_cancer, kw, pattern):
    ledger = PrivacyLedger()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)  # delta > 0 warns
        with pytest.raises((ValueError, InvalidParameterError), match=pattern):
            _fit(*breast_cancer, ledger=ledger, **kw)
    assert ledger.entries == []


def test_a_release_below_the_bound_width_is_charged_at_the_unit():
    """Two releases of the same rows, bounds [0, 1], ε = 2 each, at d = 0.01 and d = 1: one entry
    moving by 1 is 100 changes of 0.01, so the first costs 200 (group privacy) and the ledger
    totals 202 (it showed 4 before)."""
    rng = np.random.default_rng(0)
    X, y = rng.random((60, 3)), np.repeat([0, 1], 30)
    ledger = PrivacyLedger()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)  # d below the width warns
        fine = _fit(X, y, epsilon=2.0, d=0.01, ledger=ledger)
    _fit(X, y, epsilon=2.0, ledger=ledger)
    assert ledger.spent() == (pytest.approx(202.0), 0.0)
    assert [e["unit_factor"] for e in ledger.entries] == [100, 1]
    assert [e["mechanism"]["epsilon"] for e in ledger.entries] == [2.0, 2.0]
    md = fine.privacy_statement_.to_markdown()
    assert "| ε per entry at the data set's unit | 200 |" in md and "100 changes of d" in md
    assert "| ε per record, basic bound | 600 | 3 × ε × 100:" in md


def test_group_privacy_of_a_release_with_delta():
    rng = np.random.default_rng(1)
    X, y = rng.random((40, 3)), np.repeat([0, 1], 20)
    ledger = PrivacyLedger()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        _fit(X, y, epsilon=0.5, delta=1e-9, d=0.5, ledger=ledger)
    eps, delta = ledger.spent()
    assert eps == 1.0 and delta == pytest.approx(1e-9 * (1 + np.exp(0.5)))  # (2ε, δ(1 + e^ε)) for k = 2


def test_the_record_lines_do_not_overflow_at_a_huge_epsilon():
    mechanism = GridLaplace(1e6, np.zeros(30), np.ones(30), d=1e-3)
    statement = PrivacyStatement.from_settings(mechanism, BOUNDS_PUBLIC, dp_data="noisy")
    assert statement.epsilon_per_unit == (1e9, 0.0)
    assert statement.epsilon_per_record.pld == statement.epsilon_per_record.basic == 3e10
