"""Every statistic taken from the private rows is warned and named: scaling by the training
split's min/max, a caller's partition; the statement shows the bounds in both units
(tests/pipeline/runs/test_data.py: ``privacy.d`` of a pipeline file is in raw units).

Findings replayed (each failed on the code before): ``split_and_scale`` without ``bounds``
scaled by the private min/max silently and the ``KAHMClassifier`` docstring then fitted with
``bounds=(0, 1)`` and a statement saying "weakenings: none" (one raw entry changed rescales a
whole column: 185 entries of digits change); ``fit(partition=...)`` accepted a partition of the
private rows without a word; ``privacy.d`` was applied in scaled units though documented as raw.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.model_selection import train_test_split

from kahm_dask import KAHMClassifier, PrivacyLedger
from kahm_dask.datasets import PUBLIC_BOUNDS, load_bundled, split_and_scale
from kahm_dask.privacy.bounds import BOUNDS_PRIVATE_SCALING, BOUNDS_PUBLIC
from kahm_dask.privacy.randomness import PrivacyLeakWarning
from kahm_dask.privacy.statement import CALLER_PARTITION, PRIVATE_SCALING


def _fit(split, **kw):
    return KAHMClassifier(n_components=10, epsilon=2.0, random_state=0, ledger=PrivacyLedger(), **kw).fit(
        split.X_train, split.y_train, **kw.pop("fit", {}))


def test_scaling_by_the_private_min_max_moves_a_whole_column():
    """Why it leaks: a neighbouring raw data set (one entry of the column's extreme row moved)
    changes every scaled entry of that column, not one."""
    X, y = load_bundled("digits")
    train_rows, _ = train_test_split(np.arange(len(y)), test_size=0.3, stratify=y, random_state=0)  # the split's
    Xtr = X[train_rows]
    unique_max = [j for j in range(X.shape[1]) if Xtr[:, j].max() < 16 and np.sum(Xtr[:, j] == Xtr[:, j].max()) == 1]
    j = unique_max[0]  # a column whose training maximum is below 16 and held by one row
    i = train_rows[int(np.argmax(Xtr[:, j]))]
    neighbour = X.copy()
    neighbour[i, j] += 1.0  # one entry, within the public range 0-16
    with pytest.warns(PrivacyLeakWarning, match="scaled by the training rows' min and max"):
        a, b = split_and_scale(X, y), split_and_scale(neighbour, y)
    changed = np.count_nonzero(a.X_train != b.X_train) + np.count_nonzero(a.X_test != b.X_test)
    assert changed > 100 and not a.bounds.public
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        c = split_and_scale(X, y, bounds=PUBLIC_BOUNDS["digits"])
        d = split_and_scale(neighbour, y, bounds=PUBLIC_BOUNDS["digits"])
    assert np.count_nonzero(c.X_train != d.X_train) + np.count_nonzero(c.X_test != d.X_test) == 1
    assert c.bounds.public and tuple(c.bounds) == (0.0, 1.0)


def test_a_fit_on_privately_scaled_features_warns_and_names_it(digits_private_scaling):
    split = digits_private_scaling
    with pytest.warns(PrivacyLeakWarning, match="scaled by the training rows' min and max"):
        clf = _fit(split, bounds=split.bounds)
    statement = clf.privacy_statement_
    assert statement.bounds_source == BOUNDS_PRIVATE_SCALING and PRIVATE_SCALING in statement.weakenings
    assert "Settings that weaken it:** none" not in statement.to_markdown()


def test_public_bounds_give_a_statement_in_raw_units_too(digits):
    split = digits
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        statement = _fit(split, bounds=split.bounds).privacy_statement_
    assert statement.bounds_source == BOUNDS_PUBLIC and statement.weakenings == []
    assert statement.raw == {"kind": "minmax", "raw_lower": 0.0, "raw_upper": 16.0, "d": 16.0}
    md = statement.to_markdown()
    assert "| d | 16 in raw units (1 after minmax scaling) |" in md
    assert "| bounds | [0, 16] in raw units ([0, 1] after minmax scaling) |" in md
    assert "| ε per record (64 features, δ = 1e-05) | 128 |" in md and statement.epsilon_per_record.basic == 128


def test_a_callers_partition_is_assumed_private_unless_declared_public(digits):
    split = digits
    partition = np.zeros(len(split.y_train), dtype=np.int64)
    clf = KAHMClassifier(n_components=10, epsilon=2.0, bounds=split.bounds, random_state=0, ledger=PrivacyLedger())
    with pytest.warns(PrivacyLeakWarning, match="partition"):
        clf.fit(split.X_train, split.y_train, partition=partition)
    assert CALLER_PARTITION in clf.privacy_statement_.weakenings
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        clf.fit(split.X_train, split.y_train, partition=partition, partition_public=True)
    assert clf.privacy_statement_.weakenings == []


