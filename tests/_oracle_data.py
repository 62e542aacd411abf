"""Data generators shared by the oracle tests of several folders (docs/oracles.md#oracles)."""

from __future__ import annotations

import numpy as np


def three_blobs(seed: int, n_train: int = 200, n_test: int = 100, p: int = 5, sigma: float = 1.0):
    """Data of docs/oracles.md#oracle-blobs and docs/oracles.md#oracle-dp-end-to-end: three
    Gaussian blobs in ``p``-D, centres pairwise 10σ apart.

    Returns ``X_train (3·n_train, p), y_train, X_test (3·n_test, p), y_test, centres (3, p)``.
    """
    rng = np.random.default_rng(seed)
    # three points of a regular simplex with side 10σ, rotated at random
    Q, _ = np.linalg.qr(rng.normal(size=(p, p)))
    centres = (10 * sigma / np.sqrt(2)) * Q[:3]
    Xtr = np.vstack([c + sigma * rng.normal(size=(n_train, p)) for c in centres])
    Xte = np.vstack([c + sigma * rng.normal(size=(n_test, p)) for c in centres])
    return Xtr, np.repeat(np.arange(3), n_train), Xte, np.repeat(np.arange(3), n_test), centres
