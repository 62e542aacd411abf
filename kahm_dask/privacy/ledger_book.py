"""The privacy ledger's storage: one locked, atomically replaced state per ledger directory.

A ledger directory holds (all owner only: folder 0700, files 0600)::

    ledger.json                 the releases, the histories, the key (see below), the generation g
    ledger.json.lock            the file lock of every transaction
    rows-<g>-hi.npy, -lo.npy    the sorted row digests (uint64, (n,)) of index generation g
    rows-<g>-history.npy        each row's history id (uint32, (n,))

``ledger.json`` is ``{"format", "version", "digest_version", "key" (4 × 16 hex digits, the
secret of the row digests), "budget" (the ledger-wide budget, [ε, δ] or null), "budget_changes",
"releases" {id: entry}, "histories" {id: {"releases": [ids], "budget": [ε, δ] or null, "rows":
count}}, "next_history", "generation", "n_rows"}``.

A transaction (:meth:`LedgerBook.transaction`) takes the file lock, reads ``ledger.json`` and
memory-maps generation g's arrays. A change of the index is written to new files of generation
g + 1 (:meth:`LedgerState.write_index`); ``ledger.json`` naming g + 1 is then replaced
atomically, and only then are generation g's files removed. An interruption at any point leaves
either the old state or the new one, never a mix. A ledger without a directory lives in memory
(tests, examples), with the same state.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from filelock import FileLock, Timeout

from kahm_dask.privacy.ledger_rows import DIGEST_VERSION, new_key
from kahm_dask.storage.atomic import write_json_atomic
from kahm_dask.storage.private import PRIVATE_FILE_MODE, private_directory

__all__ = ["LedgerBook", "LedgerState", "LedgerError", "LEDGER_FILE", "LOCK_TIMEOUT"]

#: The ledger's state file in a ledger directory.
LEDGER_FILE = "ledger.json"
#: Seconds a transaction waits for another process's lock before giving up.
LOCK_TIMEOUT = 120.0
_FORMAT = "kahm-dask privacy ledger"
_VERSION = 3
_ARRAYS = (("hi", np.uint64), ("lo", np.uint64), ("history", np.uint32))


class LedgerError(RuntimeError):
    """The ledger cannot be used (damaged, or locked too long)."""


def _new_meta() -> dict:
    return {"format": _FORMAT, "version": _VERSION, "digest_version": DIGEST_VERSION,
            "key": [f"{int(w):016x}" for w in new_key()], "budget": None, "budget_changes": [], "releases": {},
            "histories": {},
            "next_history": 0, "generation": 0, "n_rows": 0}


class LedgerState:
    """One transaction's view of the ledger: ``meta`` (the JSON state, mutable) and the row
    index ``hi``, ``lo``, ``history`` (read-only arrays, memory-mapped for a directory)."""

    def __init__(self, book: LedgerBook, meta: dict, arrays: tuple[np.ndarray, ...]) -> None:
        self.book, self.meta = book, meta
        self.hi, self.lo, self.history = arrays
        self._written: list[Path] = []

    @property
    def key(self) -> np.ndarray:
        return np.array([int(w, 16) for w in self.meta["key"]], dtype=np.uint64)

    def write_index(self, n_rows: int, fill: Callable[[tuple[np.ndarray, ...]], None]) -> None:
        """Replace the index by ``n_rows`` rows that ``fill(out)`` writes into ``out`` = (hi, lo,
        history) arrays of that length (files of the next generation for a directory)."""
        generation = int(self.meta["generation"]) + 1
        if self.book.path is None:
            out = tuple(np.zeros(n_rows, dtype=dt) for _, dt in _ARRAYS)
        else:
            out = []
            for name, dt in _ARRAYS:
                path = self.book.array_path(generation, name)
                self._written.append(path)
                out.append(np.lib.format.open_memmap(path, mode="w+", dtype=dt, shape=(n_rows,)))
                os.chmod(path, PRIVATE_FILE_MODE)
            out = tuple(out)
        fill(out)
        for a in out:
            if isinstance(a, np.memmap):
                a.flush()
        self.hi, self.lo, self.history = out
        self.meta["generation"], self.meta["n_rows"] = generation, int(n_rows)


class LedgerBook:
    """The storage of one ledger: a directory (``path``) or memory (``path`` None); shared by
    every :class:`~kahm_dask.privacy.ledger.PrivacyLedger` view on it."""

    def __init__(self, path: str | os.PathLike | None) -> None:
        self.path = None if path is None else Path(path).expanduser().absolute()
        self._thread_lock = threading.RLock()
        self._memory: tuple[dict, tuple[np.ndarray, ...]] | None = None

    @property
    def file(self) -> Path | None:
        """The ledger's state file (None in memory)."""
        return None if self.path is None else self.path / LEDGER_FILE

    def array_path(self, generation: int, name: str) -> Path:
        return self.path / f"rows-{generation}-{name}.npy"

    def __repr__(self) -> str:
        return "in memory" if self.path is None else str(self.file)

    def _empty_arrays(self) -> tuple[np.ndarray, ...]:
        return tuple(np.zeros(0, dtype=dt) for _, dt in _ARRAYS)

    def _read(self) -> tuple[dict, tuple[np.ndarray, ...]]:
        try:
            meta = json.loads(self.file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return _new_meta(), self._empty_arrays()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise LedgerError(f"the privacy ledger {self.file} is damaged ({exc}); restore it from a backup. "
                              "No release was made.") from None
        if not isinstance(meta, dict) or meta.get("format") != _FORMAT or meta.get("version") != _VERSION:
            raise LedgerError(f"{self.file} is not a kahm-dask privacy ledger of version {_VERSION}. "
                              "No release was made.")
        if not meta["n_rows"]:
            return meta, self._empty_arrays()
        try:
            arrays = tuple(np.load(self.array_path(meta["generation"], name), mmap_mode="r") for name, _ in _ARRAYS)
        except (OSError, ValueError) as exc:
            raise LedgerError(f"the row index of the privacy ledger {self.file} is missing or damaged ({exc}); "
                              "restore the ledger directory from a backup. No release was made.") from None
        return meta, arrays

    @contextmanager
    def transaction(self) -> Iterator[LedgerState]:
        """The ledger's state, read under the lock; written back (atomically, 0600) if changed."""
        with self._thread_lock:
            if self.path is None:
                if self._memory is None:
                    self._memory = (_new_meta(), self._empty_arrays())
                meta, arrays = self._memory
                state = LedgerState(self, json.loads(json.dumps(meta)), arrays)
                yield state
                self._memory = (state.meta, (state.hi, state.lo, state.history))
                return
            private_directory(self.path)
            lock = FileLock(f"{self.file}.lock", timeout=LOCK_TIMEOUT, mode=PRIVATE_FILE_MODE)
            try:
                lock.acquire()
            except Timeout:
                raise LedgerError(f"the privacy ledger {self.file} stayed locked by another process for "
                                  f"{LOCK_TIMEOUT:g} s; no release was made.") from None
            try:
                meta, arrays = self._read()
                before = json.dumps(meta, sort_keys=True)
                state = LedgerState(self, meta, arrays)
                try:
                    yield state
                    if json.dumps(state.meta, sort_keys=True) != before or not self.file.exists():
                        write_json_atomic(self.file, state.meta, indent=1, mode=PRIVATE_FILE_MODE)
                except BaseException:
                    for path in state._written:
                        path.unlink(missing_ok=True)
                    raise
                old = int(json.loads(before)["generation"])
                if state.meta["generation"] != old:
                    for name, _ in _ARRAYS:
                        self.array_path(old, name).unlink(missing_ok=True)
            finally:
                lock.release()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_thread_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._thread_lock = threading.RLock()
