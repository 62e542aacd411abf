"""The fingerprint of a data set: which private rows a release, a ledger and stored noise belong to.

A privacy budget belongs to a data set, not to a folder or a process, so every entry point
(``KAHMClassifier``, ``DaskKAHMClassifier``, ``kahm-dask train``, ``kahm-dask run``) must
recognise the same rows wherever they are stored. :func:`fingerprint` gives two 128-bit
identities of a matrix X (N, p), computed from the values only:

* ``rows``: the **multiset** of its rows. The same rows in any order, in any chunking, stored
  as float32 or float64 (equal values), give the same ``rows``: it names the data set's
  privacy ledger (:mod:`kahm_dask.privacy.ledger`).
* ``order``: the rows **in their order**. Stored noisy rows are valid only for the rows they
  were drawn for, in that order: a work store records ``order`` and refuses to resume on
  rows that differ (a permutation, one changed entry, another data set of the same shape).

Construction (version :data:`VERSION`; fixed forever, since ledgers outlive library versions):
each entry is made canonical (float64, ``-0.0`` → ``0.0``) and read as its 64-bit pattern
``w_ij``; a row hashes to ``r_i = Σ_j f(w_ij ⊕ a_j) mod 2⁶⁴`` with per-column constants
``a_j = f(φ·(j + 1))`` and the SplitMix64 finaliser ``f`` (a bijection of 64-bit words that
mixes every input bit into every output bit). Then, modulo 2⁶⁴,

    rows  = (Σ_i f(r_i ⊕ c₁), Σ_i f(r_i ⊕ c₂)),
    order = (Σ_i f(r_i ⊕ f(i ⊕ c₃)), Σ_i f(r_i ⊕ f(i ⊕ c₄))),

and each pair, with N, p and the version, goes through BLAKE2b to 32 hex digits. Both are sums
over rows, so blocks of rows can be hashed in any order and on any worker
(:func:`partial_sums` of a block, :func:`combine` of the blocks): the result never depends on
the chunking. It is a non-cryptographic identity: two different data sets collide with
probability about 2⁻⁶⁴, but an owner who *wants* a new ledger can always make one by changing
an entry. It stops accidents (a second output folder, a copy of the store, a re-ingest), not a
determined owner.

**The fingerprint is private.** It is a deterministic function of the private rows: anyone
who knows all rows but one entry can test guesses of that entry against it. It is kept on the
owner's side (the dataset store's attributes, the ledger directory, the work store) and never
written to anything published.

Examples
--------
>>> import numpy as np
>>> X = np.arange(12.0).reshape(4, 3)
>>> a, b = fingerprint(X), fingerprint(X[::-1])
>>> a.rows == b.rows, a.order == b.order
(True, False)
>>> fingerprint(X.astype(np.float32)) == a
True
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

__all__ = ["VERSION", "DataFingerprint", "fingerprint", "partial_sums", "combine", "BLOCK_ENTRIES"]

#: Version of the construction (part of every digest).
VERSION = 1
#: Entries hashed at once: bounds the working memory (about 3 × 8 bytes an entry).
BLOCK_ENTRIES = 1 << 20

_PHI = np.uint64(0x9E3779B97F4A7C15)
_LANES = np.array([0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89],
                  dtype=np.uint64)  # c₁..c₄: digits of π


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, in place on a uint64 array (wrapping arithmetic)."""
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def _column_constants(p: int) -> np.ndarray:
    """``a_j = f(φ·(j + 1))`` for j < p → (p,) uint64."""
    return _mix(np.arange(1, p + 1, dtype=np.uint64) * _PHI)


def _row_hashes(X: np.ndarray) -> np.ndarray:
    """``r_i`` of the rows of a block X (n, p) → (n,) uint64."""
    words = np.ascontiguousarray(X, dtype=np.float64) + 0.0  # a new canonical copy: -0.0 becomes 0.0
    words = words.view(np.uint64)
    words ^= _column_constants(X.shape[1])
    return _mix(words).sum(axis=1, dtype=np.uint64)


def partial_sums(X: np.ndarray, row_offset: int = 0) -> np.ndarray:
    """The four lane sums (uint64, (4,)) of the rows of X (n, p), whose first row is row
    ``row_offset`` of the whole matrix; :func:`combine` adds the blocks' sums."""
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n_samples, n_features), got shape {X.shape}.")
    out = np.zeros(4, dtype=np.uint64)
    step = max(1, BLOCK_ENTRIES // max(X.shape[1], 1))
    for a in range(0, X.shape[0], step):
        r = _row_hashes(X[a : a + step])
        index = np.arange(row_offset + a, row_offset + a + r.size, dtype=np.uint64)
        out += np.array([_mix(r ^ _LANES[0]).sum(dtype=np.uint64), _mix(r ^ _LANES[1]).sum(dtype=np.uint64),
                         _mix(r ^ _mix(index ^ _LANES[2])).sum(dtype=np.uint64),
                         _mix(r ^ _mix(index ^ _LANES[3])).sum(dtype=np.uint64)], dtype=np.uint64)
    return out


@dataclass(frozen=True)
class DataFingerprint:
    """The two identities of a data matrix (module docstring): ``rows`` (order-insensitive,
    names the ledger), ``order`` (order-sensitive, binds stored noise), each 32 hex digits, and
    the shape (``n_samples``, ``n_features``)."""

    rows: str
    order: str
    n_samples: int
    n_features: int

    @property
    def short(self) -> str:
        """The first 12 hex digits of ``rows``, for messages."""
        return self.rows[:12]

    def to_dict(self) -> dict:
        return {"version": VERSION, "rows": self.rows, "order": self.order,
                "n_samples": self.n_samples, "n_features": self.n_features}

    @classmethod
    def from_dict(cls, d: dict) -> DataFingerprint:
        if d.get("version") != VERSION:
            raise ValueError(f"fingerprint version {d.get('version')!r}; this kahm-dask computes version {VERSION}.")
        return cls(str(d["rows"]), str(d["order"]), int(d["n_samples"]), int(d["n_features"]))


def _digest(kind: str, lanes: np.ndarray, n: int, p: int) -> str:
    head = f"kahm-dask-fingerprint-v{VERSION}-{kind}-{n}x{p}".encode()
    return hashlib.blake2b(head + lanes.astype("<u8").tobytes(), digest_size=16).hexdigest()


def combine(blocks: Iterable[np.ndarray], n_samples: int, n_features: int) -> DataFingerprint:
    """The fingerprint of a matrix (n_samples, n_features) from the :func:`partial_sums` of its
    row blocks (each row in exactly one block, blocks in any order)."""
    total = np.zeros(4, dtype=np.uint64)
    for part in blocks:
        total += np.asarray(part, dtype=np.uint64).reshape(4)
    return DataFingerprint(_digest("rows", total[:2], n_samples, n_features),
                           _digest("order", total[2:], n_samples, n_features), int(n_samples), int(n_features))


def fingerprint(X) -> DataFingerprint:
    """The fingerprint of an in-memory matrix X (N, p) (module docstring)."""
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n_samples, n_features), got shape {X.shape}.")
    return combine([partial_sums(X)], *X.shape)
