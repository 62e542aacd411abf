"""The rows of the privacy ledger: keyed row digests and the sorted index of every row released.

A release is charged to the **rows** it contains (:mod:`kahm_dask.privacy.ledger`), so the
ledger must recognise a row wherever it appears again: in a subset, a superset, another split,
a cross-validation fold, a copy stored as float32. Each row gets a 128-bit **keyed digest**
``(hi, lo)`` of its entries at the ledger's declared precision, **float32**: every entry is
rounded to float32 (``-0.0`` → ``0.0``) and read as its 32-bit pattern ``w_ij``, so a float64
copy and a float32 copy of the same rows give the same digests, and float64 entries that round to
the same float32 are the same row to the ledger (the conservative side); an entry moved to
another float32, however slightly, makes another row.

Construction (version :data:`DIGEST_VERSION`), with the ledger directory's secret key
``k₀..k₃`` (256 bits from OS entropy, :func:`new_key`; kept 0600 beside the ledger, so a
digest reveals nothing about an entry to anyone without the key), the SplitMix64 finaliser
``f`` and per-column words ``a_j = f(k₀ ⊕ f(φ(j+1)))``, ``b_j = f(k₁ ⊕ f(φ(j+1)))``, modulo 2⁶⁴:

    m_ij = f(w_ij ⊕ a_j),   s_i = Σ_j m_ij,   t_i = Σ_j f(m_ij ⊕ b_j),
    hi_i = f(f(s_i ⊕ k₂) + t_i + p),   lo_i = f(f(t_i ⊕ k₃) + s_i).

It is a keyed mixing, not a cryptographic MAC: it stops the digests from naming entries to
whoever reads them without the key; the key and the digests both stay on the owner's side.
What a digest cannot see: an affine rescaling of a column, permuted columns, one changed entry
(each is another row to the ledger).

The **row index** is a sorted array of digests (``hi`` then ``lo``, uint64 each) and, per row,
a ``history`` id (uint32): rows released together share a history (:mod:`kahm_dask.privacy.ledger`
keeps the table of histories). :func:`locate` finds a release's rows in it
(``np.searchsorted``, no Python loop over rows) and :func:`merge` writes the index with new rows
inserted and the released rows' histories replaced, block by block into arrays the caller
provides (memory-mapped files for a ledger directory), so the memory used is the release's
digests plus one block.

Examples
--------
>>> import numpy as np
>>> key = new_key()
>>> X = np.array([[0.1, 2.0], [3.0, -0.0], [0.1, 2.0]])
>>> d = row_digests(X, key)
>>> d.shape, bool((d[0] == d[2]).all()), bool((d[0] == d[1]).all())
((3, 2), True, False)
>>> bool((row_digests(X.astype(np.float32), key) == d).all())
True
>>> rows = unique_rows(d)
>>> len(rows)
2
"""

from __future__ import annotations

import os

import numpy as np

from kahm_dask.privacy.fingerprint import _mix

__all__ = ["DIGEST_VERSION", "KEY_WORDS", "new_key", "row_digests", "unique_rows", "locate", "merge",
           "BLOCK_ENTRIES", "INDEX_BLOCK"]

#: Version of the digest construction (recorded in the ledger; fixed forever for a key).
DIGEST_VERSION = 1
#: Words (uint64) of a ledger key.
KEY_WORDS = 4
#: Entries digested at once: bounds the working memory (about 4 × 8 bytes an entry).
BLOCK_ENTRIES = 1 << 20
#: Rows of the index copied at once by :func:`merge`.
INDEX_BLOCK = 1 << 20

_PHI = np.uint64(0x9E3779B97F4A7C15)


def new_key() -> np.ndarray:
    """A fresh ledger key: (4,) uint64 from OS entropy."""
    return np.frombuffer(os.urandom(8 * KEY_WORDS), dtype=np.uint64).copy()


def _column_words(key: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray]:
    base = _mix(np.arange(1, p + 1, dtype=np.uint64) * _PHI)
    return _mix(base ^ key[0]), _mix(base ^ key[1])


def row_digests(X, key: np.ndarray) -> np.ndarray:
    """The keyed digests of the rows of X (n, p) → (n, 2) uint64 ``(hi, lo)`` (module
    docstring), at float32 precision; in blocks of :data:`BLOCK_ENTRIES` entries."""
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n_samples, n_features), got shape {X.shape}.")
    key = np.asarray(key, dtype=np.uint64)
    n, p = X.shape
    a, b = _column_words(key, p)
    out = np.empty((n, 2), dtype=np.uint64)
    step = max(1, BLOCK_ENTRIES // max(p, 1))
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, n, step):
            block = np.asarray(X[start : start + step], dtype=np.float32) + np.float32(0.0)  # -0.0 → 0.0
            m = _mix(block.view(np.uint32).astype(np.uint64) ^ a)
            s = m.sum(axis=1, dtype=np.uint64)
            m ^= b
            t = _mix(m).sum(axis=1, dtype=np.uint64)
            out[start : start + step, 0] = _mix(_mix(s ^ key[2]) + t + np.uint64(p))
            out[start : start + step, 1] = _mix(_mix(t ^ key[3]) + s)
    return out


def unique_rows(digests: np.ndarray) -> np.ndarray:
    """The distinct digests of (n, 2) ``digests``, sorted by (hi, lo) → (u, 2) uint64."""
    digests = np.asarray(digests, dtype=np.uint64).reshape(-1, 2)
    if len(digests) == 0:
        return digests.copy()
    d = digests[np.argsort(digests[:, 0])]  # by hi; a run of equal hi (rare, or repeated rows) by lo next
    same = d[1:, 0] == d[:-1, 0]
    if same.any():  # the rows in runs of equal hi, sorted by (hi, lo) among themselves, in place
        tied = np.flatnonzero(np.r_[same, False] | np.r_[False, same])
        sub = d[tied]
        d[tied] = sub[np.lexsort((sub[:, 1], sub[:, 0]))]
    keep = np.ones(len(d), dtype=bool)
    keep[1:] = (d[1:] != d[:-1]).any(axis=1)
    return np.ascontiguousarray(d[keep])


def locate(hi: np.ndarray, lo: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where the sorted distinct ``rows`` (u, 2) are in the index (``hi``, ``lo``: (n,) sorted by
    (hi, lo); memory-mapped arrays are fine) → ``found`` (u,) bool and ``position`` (u,) int64:
    a found row's index, else where it would be inserted. Rows whose ``hi`` occurs in the index
    with another ``lo`` (probability about u·n/2⁶⁴) are resolved one by one."""
    left = np.searchsorted(hi, rows[:, 0], side="left").astype(np.int64)
    right = np.searchsorted(hi, rows[:, 0], side="right").astype(np.int64)
    position = left.copy()
    found = np.zeros(len(rows), dtype=bool)
    single = right - left == 1
    at = left[single]
    found[single] = np.asarray(lo[at]) == rows[single, 1]
    position[single] = at + (np.asarray(lo[at]) < rows[single, 1])
    for k in np.flatnonzero(right - left > 1):  # a shared hi: search its lo run
        run = np.asarray(lo[left[k] : right[k]])
        i = int(np.searchsorted(run, rows[k, 1]))
        position[k] = left[k] + i
        found[k] = i < len(run) and run[i] == rows[k, 1]
    return found, position


def merge(
    old: tuple[np.ndarray, np.ndarray, np.ndarray],
    new_rows: np.ndarray,
    insert_at: np.ndarray,
    new_history: np.ndarray,
    out: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """Write the index ``old`` = (hi, lo, history), each (n,), with the rows ``new_rows`` (m, 2)
    (sorted, absent from ``old``) inserted before the old positions ``insert_at`` (m,) with
    histories ``new_history`` (m,), into ``out`` (three (n + m,) arrays), block by block.

    Old row i lands at ``i + #{k : insert_at[k] <= i}``, new row k at ``insert_at[k] + k``."""
    hi, lo, history = old
    n = len(hi)
    for a in range(0, n, INDEX_BLOCK):
        b = min(n, a + INDEX_BLOCK)
        target = np.arange(a, b, dtype=np.int64)
        target += np.searchsorted(insert_at, target, side="right")
        out[0][target] = hi[a:b]
        out[1][target] = lo[a:b]
        out[2][target] = history[a:b]
    target = insert_at + np.arange(len(new_rows), dtype=np.int64)
    out[0][target] = new_rows[:, 0]
    out[1][target] = new_rows[:, 1]
    out[2][target] = new_history
