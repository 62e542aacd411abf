"""The DP data set in Python (kahm_dask.release_dataset, DPDataset): one release through the one
release sequence, rows in the owner's raw units, and post-processing that spends nothing."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.model_selection import GridSearchCV

from kahm_dask import DPDataset, KAHMClassifier, PrivacyLeakWarning, PrivacyLedger, release_dataset
from kahm_dask.privacy.bounds import Scaling
from kahm_dask.privacy.noise import GridLaplace
from tests._kit import ledger_of


@pytest.fixture(scope="module")
def noisy(digits):
    return release_dataset(digits.X_train, digits.y_train, epsilon=2.0, bounds=digits.bounds, ledger=PrivacyLedger())


def test_scaling_invert_undoes_apply_within_the_raw_bounds():
    raw = np.array([[0.0, 3.5, 16.0, -2.0, 20.0]])
    for kind, upper in (("minmax", 16.0), ("tanh255", 255.0), ("none", 16.0)):
        scaling = Scaling(kind, np.zeros(5), np.full(5, upper))
        back = scaling.invert(scaling.apply(raw))
        # apply clips to the raw bounds: invert gives the clipped values back (float64 round trip)
        np.testing.assert_allclose(back, np.clip(raw, 0, upper), rtol=0, atol=1e-12 * upper)
    beyond = Scaling("tanh255", np.zeros(1), np.full(1, 255.0)).invert(np.array([2.0]))  # above tanh(1)
    assert np.isfinite(beyond).all() and beyond[0] == pytest.approx(255.0)


def test_a_noisy_release_of_digits_in_raw_units(digits, noisy):
    assert isinstance(noisy, DPDataset)
    assert noisy.X.shape == noisy.X_raw.shape == (1257, 64) and noisy.y.shape == (1257,)
    np.testing.assert_array_equal(noisy.y, digits.y_train)  # the rows' order, labels as they are
    assert noisy.X.min() < 0 < 1 < noisy.X.max()  # the noisy rows leave the bounds ...
    assert noisy.X_raw.min() == 0.0 and noisy.X_raw.max() == 16.0  # ... the raw units are clipped to them
    np.testing.assert_allclose(noisy.X_raw, 16 * np.clip(noisy.X, 0, 1), rtol=1e-12)
    mech = GridLaplace(2.0, np.zeros(64), np.ones(64))
    steps = (noisy.X - mech.lower) / mech.step  # every released value is on the public grid
    assert np.all(steps == np.rint(steps))
    assert noisy.statement.mechanism["epsilon"] == 2.0 and noisy.statement.raw["raw_upper"] == 16.0
    frame = noisy.to_pandas()
    assert frame.shape == (1257, 65) and list(frame.columns[:2]) == ["x0", "x1"] and frame.columns[-1] == "label"


def test_the_release_is_recorded_once_in_the_data_sets_ledger(digits):
    ds = release_dataset(digits.X_train, digits.y_train, epsilon=1.5, bounds=digits.bounds)
    (entry,) = ledger_of(digits.X_train).entries
    assert entry["release_id"] == ds.release_id and entry["epsilon"] == 1.5 and "release_dataset" in entry["what"]


def test_a_fabricated_release_is_the_classifiers_fabrication(digits):
    X, y = digits.X_train[:300], digits.y_train[:300]
    settings = {"epsilon": 2.0, "bounds": digits.bounds, "dp_data": "fabricated", "insecure_noise_seed": 3,
                "random_state": 0, "n_components": 8}
    with pytest.warns(PrivacyLeakWarning, match="fixed seed"):
        ds = release_dataset(X, y, ledger=PrivacyLedger(), **settings)
        clf = KAHMClassifier(ledger=PrivacyLedger(), **settings).fit(X, y)
    for label in clf.classes_:  # same noise (seeded, test only), same partition: the same rows
        np.testing.assert_array_equal(ds.X[y == label], clf.dp_data_[label])
    assert ds.statement.dp_data == "fabricated" and not ds.statement.holds  # seeded: no guarantee, said so
    assert ds.X_raw.min() >= 0 and ds.X_raw.max() <= 16


def test_a_record_level_release_draws_at_the_fits_epsilon_per_entry(digits):
    X, y = digits.X_train[:300], digits.y_train[:300]
    ds = release_dataset(X, y, epsilon=None, record_epsilon=8.0, bounds=digits.bounds, ledger=PrivacyLedger())
    clf = KAHMClassifier(record_epsilon=8.0, bounds=digits.bounds, ledger=PrivacyLedger(), n_components=8).fit(X, y)
    assert 8.0 / 64 < clf.epsilon_ < 8.0  # solved by the accountant, not the record ε itself
    assert ds.statement.mechanism["epsilon"] == clf.epsilon_ == clf.privacy_statement_.mechanism["epsilon"]
    assert ds.statement.epsilon_per_record.pld == pytest.approx(8.0, rel=1e-3)  # the target, met


def test_tuning_on_the_release_spends_nothing_and_carries_its_statement(digits):
    ds = release_dataset(digits.X_train, digits.y_train, epsilon=2.0, bounds=digits.bounds)
    ledger = ledger_of(digits.X_train)
    before = ledger.entries
    search = GridSearchCV(KAHMClassifier(random_state=0), {"n_components": [10, 20]}, cv=2)
    search.fit(ds.X, ds.y, released_from=ds)
    assert ledger_of(digits.X_train).entries == before and ledger_of(ds.X).entries == []  # nothing spent
    statement = search.best_estimator_.privacy_statement_
    assert statement.trained_on == ds.release_id and statement.mechanism == ds.statement.mechanism
    assert "Trained on a DP release: post-processing" in statement.to_markdown()
    assert search.score(digits.X_test, digits.y_test) > 0.5


def test_released_from_refuses_a_second_release(digits, noisy):
    with pytest.raises(ValueError, match="released_from: the rows of a DP release are private already"):
        KAHMClassifier(epsilon=1.0, bounds=(0, 1)).fit(noisy.X, noisy.y, released_from=noisy)
    assert ledger_of(noisy.X).entries == []


@pytest.mark.parametrize(("change", "match"), [
    ({"y": np.zeros(5)}, "inconsistent numbers of samples"),
    ({"dp_data": "smoothed"}, "'dp_data' parameter"),
    ({"feature_names": ["a", "b"]}, "feature_names must be 64 distinct names"),
    ({"epsilon": 0.0}, "'epsilon' parameter"),
    ({"epsilon": None}, "release_dataset needs epsilon"),
])
def test_bad_input_is_refused_before_anything_is_spent(digits, change, match):
    kwargs = {"y": digits.y_train, "epsilon": 2.0, "bounds": digits.bounds, **change}
    with pytest.raises(ValueError, match=match):
        release_dataset(digits.X_train, **kwargs)
    assert ledger_of(digits.X_train).entries == []


def test_to_parquet_and_to_csv_write_the_raw_rows_and_the_statement(tmp_path, noisy):
    statement = noisy.to_parquet(tmp_path / "d.parquet")
    frame = pd.read_parquet(tmp_path / "d.parquet")
    np.testing.assert_array_equal(frame.drop(columns="label").to_numpy(), noisy.X_raw)
    assert statement == tmp_path / "d.parquet.PRIVACY.md"
    assert noisy.release_id in statement.read_text() and "## Privacy statement" in statement.read_text()
    noisy.to_csv(tmp_path / "d.csv")
    np.testing.assert_allclose(pd.read_csv(tmp_path / "d.csv").drop(columns="label").to_numpy(), noisy.X_raw)
