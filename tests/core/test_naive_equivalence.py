"""The fast evaluation path agrees with the naive formulation of the paper (benchmarks/naive.py).

The naive model computes PCA from the p×p covariance, θ and its inverse explicitly, λ* with an
explicit inverse per fixed-point iteration, and the O(m·N²) weights ``K_q (K + λI)^{-1}``
normalised; the project uses a thin SVD / top-k eigh, one eigendecomposition for λ* and β, and
the fused kernel with ``K_q·β``. Same model: images and distances agree to 1e-9 (relative).
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.naive import NaiveDeepKAHM, NaiveKAHM, NaiveKAHMClassifier
from kahm_dask import KAHMClassifier
from kahm_dask.deep import DeepKAHM
from kahm_dask.kahm import KAHM

RTOL = 1e-9


def _data(seed: int, N: int = 150, p: int = 12, scale: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(p, p)) / np.sqrt(p)
    return np.tanh(scale * rng.normal(size=(N, p)) @ A + rng.normal(size=p))


def _queries(Y: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    near = Y[rng.choice(len(Y), 40)] + 0.05 * rng.normal(size=(40, Y.shape[1]))
    far = Y.mean(0) + 3.0 * rng.normal(size=(10, Y.shape[1]))  # far from the data
    return np.vstack([near, far])


@pytest.mark.parametrize("seed,n", [(0, 5), (1, 8), (2, 3), (3, 11)])
def test_kahm_images_match_naive(seed, n):
    Y = _data(seed)
    Yq = _queries(Y, seed + 100)
    fast = KAHM(n).fit(Y)
    naive = NaiveKAHM(n).fit(Y)
    assert naive.n_ == fast.n_components_
    assert naive.lambda_ == pytest.approx(fast.lambda_, rel=1e-9)
    img_fast = fast.transform(Yq)
    img_naive = naive.images(Yq)
    scale = np.abs(Y).max()
    np.testing.assert_allclose(img_fast, img_naive, rtol=0, atol=RTOL * scale)
    np.testing.assert_allclose(
        fast.distance(Yq), np.linalg.norm(Yq - img_naive, axis=1), rtol=RTOL, atol=RTOL * scale
    )


def test_deep_distances_match_naive():
    Y = _data(5, N=200, p=15)
    Yq = _queries(Y, 7)
    fast = DeepKAHM(8, 4).fit(Y)
    img_naive, g_naive = NaiveDeepKAHM(8, 4).fit(Y).images_and_distances(Yq)
    img, g, _ = fast.transform_with_distance(Yq)
    np.testing.assert_allclose(g, g_naive, rtol=RTOL, atol=RTOL * np.abs(Y).max())
    np.testing.assert_allclose(img, img_naive, rtol=0, atol=RTOL * np.abs(Y).max())
    # the distance-only path used by the classifier gives the same distances, bit for bit
    np.testing.assert_array_equal(fast._distance_rows(Yq)[0], g)


def test_classifier_matches_naive():
    rng = np.random.default_rng(11)
    centres = rng.normal(size=(3, 10)) * 2
    y = np.repeat(np.arange(3), 140)
    X = np.tanh(centres[y] + rng.normal(size=(len(y), 10)))
    Xq = np.tanh(centres[rng.integers(0, 3, 60)] + rng.normal(size=(60, 10)))
    kw = dict(n_components=6, n_layers=3, block_size=70, random_state=4, n_init=2)
    fast = KAHMClassifier(**kw).fit(X, y)
    naive = NaiveKAHMClassifier(**kw).fit(X, y)
    assert [len(w.branches_) for w in naive.models_] == list(fast.n_branches_)
    np.testing.assert_allclose(fast.class_distances(Xq), naive.class_distances(Xq), rtol=RTOL)
    np.testing.assert_array_equal(fast.predict(Xq), naive.predict(Xq))
