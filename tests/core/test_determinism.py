"""Determinism of the in-memory classifier (docs/reliability.md): the same seed and, for a DP
fit, the same noise give bit-identical models and distances; the seed is public, so two DP fits
with the same seed and fresh noise differ (tests/pipeline/training/test_determinism.py: the
pipeline across runs and worker counts)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from kahm_dask import KAHMClassifier
from kahm_dask.datasets import make_class_blobs


@pytest.fixture(scope="module")
def blobs():
    X, y = make_class_blobs(400, 8, 3, random_state=4)
    return X[:300], y[:300], X[300:]


def _state(clf: KAHMClassifier) -> bytes:
    """Everything a fitted classifier holds (its pickle), for bitwise comparison; not the statement
    and the release's id, which names each release anew (its ledger entry)."""
    return pickle.dumps({k: v for k, v in vars(clf).items()
                         if k.endswith("_") and k not in ("privacy_statement_", "release_id_")})


@pytest.mark.filterwarnings("ignore::kahm_dask.privacy.randomness.PrivacyLeakWarning")
@pytest.mark.parametrize("kw", [{}, {"epsilon": 2.0}, {"epsilon": 2.0, "dp_data": "noisy"},
                                {"epsilon": 1.0, "r_source": "passes", "r_value": 3, "cluster_on": "noisy"}],
                         ids=["non-private", "fabricated", "noisy", "post-processed"])
def test_estimator_same_seed_same_bits(blobs, kw):
    X, y, Q = blobs
    if kw:  # the same noise on both fits (test only)
        kw = {**kw, "insecure_noise_seed": 1}
    a = KAHMClassifier(5, 3, 100, random_state=7, **kw).fit(X, y)
    b = KAHMClassifier(5, 3, 100, random_state=7, **kw).fit(X, y)
    assert _state(a) == _state(b)
    assert a.class_distances(Q).tobytes() == b.class_distances(Q).tobytes()
    if kw:
        c = KAHMClassifier(5, 3, 100, random_state=8, **{**kw, "insecure_noise_seed": 2}).fit(X, y)
        assert not np.array_equal(a.class_distances(Q), c.class_distances(Q))


@pytest.mark.filterwarnings("ignore::kahm_dask.privacy.randomness.PrivacyLeakWarning")
def test_estimator_same_seed_fresh_noise_differs(blobs):
    """The seed is public: without the test-only seed two DP fits never share noise."""
    X, y, Q = blobs
    a = KAHMClassifier(5, 3, 100, random_state=7, epsilon=2.0, dp_data="noisy").fit(X, y)
    b = KAHMClassifier(5, 3, 100, random_state=7, epsilon=2.0, dp_data="noisy").fit(X, y)
    assert not np.array_equal(a.dp_data_[0], b.dp_data_[0])
