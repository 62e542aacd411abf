"""The privacy ledger of a data set: every DP release of its rows, from any entry point.

Each release of noisy rows spends (ε, δ) of element-level privacy, and releases compose (basic
composition: the ε add up, the δ add up). A budget therefore belongs to a **data set**, not to
an output folder or a process: :meth:`PrivacyLedger.for_data` finds the one ledger of a data set
by its fingerprint (:mod:`kahm_dask.privacy.fingerprint`, the multiset of its rows) in a
**ledger directory** on the owner's side: ``ledger_dir`` where a caller gives one, else
``$KAHM_DASK_LEDGER_DIR``, else ``$XDG_DATA_HOME/kahm-dask/ledgers`` (by default
``~/.local/share/kahm-dask/ledgers``; :func:`default_ledger_dir`). ``KAHMClassifier``,
``DaskKAHMClassifier``, ``kahm-dask train`` and ``kahm-dask run`` (central and federated) all
record there, so the same rows released from two folders, two copies of a store or two
processes are counted together.

The rules (diffprivlib's ``BudgetAccountant`` habits, made durable and shared):

* **One locked transaction.** :meth:`PrivacyLedger.spend` re-reads the ledger file under an
  exclusive file lock (the ``filelock`` library), checks the budget, appends the release and
  writes the file atomically before the lock is released. Callers spend *before* drawing the
  noise, so two concurrent releases are both recorded, or the second is refused: none is lost.
  A release id already recorded is not charged again (a resumed run reusing its stored noise).
* **Budgets only go down.** A caller's budget lowers the stored one (or sets the first one);
  a caller cannot raise it (:class:`BudgetChangeError`): only the owner can, explicitly, with
  :meth:`PrivacyLedger.set_budget` ``(..., allow_raise=True)`` or ``kahm-dask ledger budget
  --raise``. Budgets are finite: ε > 0, δ in [0, 1).
* **Private files.** The directory is created 0700 and the ledger files 0600: a ledger holds
  the data set's fingerprint, which is private (a hash of the rows).

A ledger without a file (``PrivacyLedger()``) lives in memory, for tests and examples.

Examples
--------
>>> ledger = PrivacyLedger(budget=(3.0, 0.0))
>>> ledger.spend(2.0, 0.0, release_id="a", what="fabricated rows")["epsilon"]
2.0
>>> ledger.spent(), ledger.remaining()
((2.0, 0.0), (1.0, 0.0))
>>> ledger.spend(2.0, 0.0, release_id="b", what="again")  # doctest: +NORMALIZE_WHITESPACE
Traceback (most recent call last):
...
kahm_dask.privacy.ledger.BudgetExceededError: this release (ε = 2, δ = 0) would take the total to
(ε = 4, δ = 0), beyond the budget (ε = 3, δ = 0) of this data set's ledger; 1 release(s) recorded.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from kahm_dask.privacy.fingerprint import DataFingerprint
from kahm_dask.storage.atomic import write_json_atomic
from kahm_dask.storage.private import PRIVATE_FILE_MODE, private_directory

__all__ = [
    "PrivacyLedger",
    "BudgetExceededError",
    "BudgetChangeError",
    "LedgerError",
    "check_budget",
    "default_ledger_dir",
    "LEDGER_DIR_ENV",
]

#: Environment variable naming the ledger directory (overrides the default location).
LEDGER_DIR_ENV = "KAHM_DASK_LEDGER_DIR"
#: Seconds a transaction waits for another process's lock before giving up.
LOCK_TIMEOUT = 120.0
_FORMAT = "kahm-dask privacy ledger"
_VERSION = 2
# relative slack of the budget comparison: sums of floats (2 + 1 + ... ) may exceed the budget by rounding
_EPS_SLACK, _DELTA_SLACK = 1e-12, 1e-15


class LedgerError(RuntimeError):
    """The ledger file cannot be used (damaged, another data set's, or locked too long)."""


class BudgetExceededError(RuntimeError):
    """A release would spend more privacy than the data set's budget allows."""


class BudgetChangeError(ValueError):
    """A caller tried to raise a stored budget (only the owner can, explicitly)."""


def default_ledger_dir() -> Path:
    """``$KAHM_DASK_LEDGER_DIR``, else ``$XDG_DATA_HOME/kahm-dask/ledgers``, else
    ``~/.local/share/kahm-dask/ledgers`` (absolute)."""
    env = os.environ.get(LEDGER_DIR_ENV)
    if env:
        return Path(env).expanduser().absolute()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return (Path(base).expanduser() / "kahm-dask" / "ledgers").absolute()


def check_budget(budget: Any, name: str = "budget") -> tuple[float, float] | None:
    """``budget`` as ``(ε, δ)`` floats, or None; ValueError unless ε is finite and > 0 and
    δ in [0, 1) (an infinite budget is no budget: pass None)."""
    if budget is None:
        return None
    try:
        eps, delta = (float(v) for v in budget)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (ε, δ) of numbers, got {budget!r}.") from None
    if not (math.isfinite(eps) and eps > 0 and math.isfinite(delta) and 0 <= delta < 1):
        raise ValueError(f"{name} must be (ε, δ) with ε finite and > 0 and δ in [0, 1), got {budget!r} "
                         "(no budget at all is None).")
    return eps, delta


def _fmt(eps: float, delta: float) -> str:
    return f"(ε = {eps:g}, δ = {delta:g})"


class PrivacyLedger:
    """The releases of one data set and its budget, in a JSON file or in memory.

    Parameters
    ----------
    path : local path of the ledger file, or None (in memory). Prefer :meth:`for_data`, which
        finds a data set's ledger in the ledger directory.
    budget : (ε, δ) or None. Lowers the stored budget, or sets the first one; raising it is a
        :class:`BudgetChangeError` (see :meth:`set_budget`). None keeps the stored budget.
    data : the :class:`~kahm_dask.privacy.fingerprint.DataFingerprint` of the data set, recorded
        in a new ledger file and checked against an existing one.

    Every query re-reads the file, so a ledger object always shows what every process recorded.
    """

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        budget: tuple[float, float] | None = None,
        *,
        data: DataFingerprint | None = None,
    ) -> None:
        self.path = None if path is None else Path(path).expanduser().absolute()
        self.data = data
        self._memory: dict = self._empty()
        self._thread_lock = threading.RLock()
        budget = check_budget(budget)
        with self._transaction() as state:
            if budget is not None:
                self._lower_budget(state, budget)

    @classmethod
    def for_data(
        cls,
        data: DataFingerprint,
        directory: str | os.PathLike | None = None,
        budget: tuple[float, float] | None = None,
    ) -> PrivacyLedger:
        """The ledger of the data set with fingerprint ``data``: ``<directory>/<data.rows>.json``
        (``directory`` None: :func:`default_ledger_dir`), created 0700 / 0600 if absent."""
        root = private_directory(default_ledger_dir() if directory is None else directory)
        return cls(root / f"{data.rows}.json", budget, data=data)

    # ------------------------------------------------------------------ file
    def _empty(self) -> dict:
        return {"format": _FORMAT, "version": _VERSION,
                "data": None if self.data is None else self.data.to_dict(),
                "budget": None, "budget_changes": [], "entries": []}

    def _read(self) -> dict:
        if self.path is None:
            return self._memory
        try:
            state = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return self._empty()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise LedgerError(f"the privacy ledger {self.path} is damaged ({exc}); restore it from a backup. "
                              "No release was made.") from None
        if not isinstance(state, dict) or not isinstance(state.get("entries"), list):
            raise LedgerError(f"{self.path} is not a kahm-dask privacy ledger. No release was made.")
        stored = state.get("data")
        if self.data is not None and stored is not None and stored.get("rows") != self.data.rows:
            raise LedgerError(f"the ledger {self.path} belongs to another data set (fingerprint "
                              f"{str(stored.get('rows'))[:12]}…, these rows {self.data.short}…).")
        if self.data is not None and stored is None:
            state["data"] = self.data.to_dict()
        return state

    @contextmanager
    def _transaction(self) -> Iterator[dict]:
        """The ledger's state, read under the lock; written back (atomically, 0600) if changed."""
        with self._thread_lock:
            if self.path is None:
                yield self._memory
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = FileLock(f"{self.path}.lock", timeout=LOCK_TIMEOUT, mode=PRIVATE_FILE_MODE)
            try:
                lock.acquire()
            except Timeout:
                raise LedgerError(f"the privacy ledger {self.path} stayed locked by another process for "
                                  f"{LOCK_TIMEOUT:g} s; no release was made.") from None
            try:
                state = self._read()
                before = json.dumps(state, sort_keys=True)
                yield state
                if json.dumps(state, sort_keys=True) != before or not self.path.exists():
                    write_json_atomic(self.path, state, indent=2, mode=PRIVATE_FILE_MODE)
            finally:
                lock.release()

    def _state(self) -> dict:
        with self._transaction() as state:
            return json.loads(json.dumps(state))  # a copy

    # ------------------------------------------------------------------ budget
    @staticmethod
    def _lower_budget(state: dict, budget: tuple[float, float]) -> None:
        stored = state["budget"]
        if stored is not None and (budget[0] > stored[0] or budget[1] > stored[1]):
            raise BudgetChangeError(
                f"the data set's ledger has the budget {_fmt(*stored)}; a caller may lower it but not "
                f"raise it to {_fmt(*budget)}. Raising it is the data owner's decision: "
                "PrivacyLedger.set_budget(..., allow_raise=True) or `kahm-dask ledger budget ... --raise`."
            )
        if stored is None or list(budget) != list(stored):
            state["budget"] = list(budget)
            state["budget_changes"].append({"time": _now(), "budget": list(budget), "by": "caller (lowered)"})

    def set_budget(self, epsilon: float, delta: float = 0.0, *, allow_raise: bool = False) -> None:
        """Set the budget to (ε, δ); raising it needs ``allow_raise=True`` (the owner's decision).
        A budget below what is already spent refuses every further release."""
        budget = check_budget((epsilon, delta))
        with self._transaction() as state:
            if not allow_raise:
                self._lower_budget(state, budget)
                return
            state["budget"] = list(budget)
            state["budget_changes"].append({"time": _now(), "budget": list(budget), "by": "owner (set)"})

    @property
    def budget(self) -> tuple[float, float] | None:
        """The stored (ε, δ) budget, or None (no limit)."""
        stored = self._state()["budget"]
        return None if stored is None else (float(stored[0]), float(stored[1]))

    @property
    def entries(self) -> list[dict]:
        """The recorded releases, oldest first (a copy)."""
        return self._state()["entries"]

    # ------------------------------------------------------------------ queries
    @staticmethod
    def _spent(state: dict) -> tuple[float, float]:
        entries = state["entries"]
        return (math.fsum(e["epsilon"] for e in entries), math.fsum(e["delta"] for e in entries))

    def spent(self) -> tuple[float, float]:
        """Total (ε, δ) of the recorded releases (basic composition)."""
        return self._spent(self._state())

    def remaining(self) -> tuple[float, float]:
        """(ε, δ) still allowed by the budget (``(inf, 1)`` without a budget; never negative)."""
        state = self._state()
        if state["budget"] is None:
            return (math.inf, 1.0)
        eps, delta = self._spent(state)
        return (max(0.0, state["budget"][0] - eps), max(0.0, state["budget"][1] - delta))

    def has(self, release_id: str) -> bool:
        return any(e["release_id"] == release_id for e in self.entries)

    @classmethod
    def _refusal(cls, state: dict, epsilon: float, delta: float) -> str | None:
        budget = state["budget"]
        if budget is None:
            return None
        eps, dl = cls._spent(state)
        if eps + epsilon > budget[0] * (1 + _EPS_SLACK) or dl + delta > budget[1] + _DELTA_SLACK:
            return (f"this release {_fmt(epsilon, delta)} would take the total to {_fmt(eps + epsilon, dl + delta)}, "
                    f"beyond the budget {_fmt(*budget)} of this data set's ledger; "
                    f"{len(state['entries'])} release(s) recorded.")
        return None

    def check(self, epsilon: float, delta: float) -> None:
        """Raise :class:`BudgetExceededError` if a release of (ε, δ) would exceed the budget now
        (advisory: :meth:`spend` checks again under the lock)."""
        reason = self._refusal(self._state(), epsilon, delta)
        if reason is not None:
            raise BudgetExceededError(reason)

    # ------------------------------------------------------------------ spending
    def spend(self, epsilon: float, delta: float, *, release_id: str, what: str, **details: Any) -> dict:
        """Record one release of (ε, δ) in one locked transaction: refused with
        :class:`BudgetExceededError` if it would exceed the budget; a ``release_id`` already
        recorded is returned as it is (spent once). Call it *before* the noise is drawn.
        Returns the entry."""
        with self._transaction() as state:
            for entry in state["entries"]:
                if entry["release_id"] == release_id:
                    return dict(entry)
            reason = self._refusal(state, float(epsilon), float(delta))
            if reason is not None:
                raise BudgetExceededError(reason)
            entry = {"release_id": release_id, "epsilon": float(epsilon), "delta": float(delta), "what": what,
                     "time": _now(), "pid": os.getpid(), **details}
            state["entries"].append(json.loads(json.dumps(entry, default=str)))
            return dict(entry)

    def summary(self) -> dict:
        """Releases, totals and budget, for reports: ``{"releases", "epsilon_total",
        "delta_total", "budget", "remaining"}`` (``remaining`` None without a budget)."""
        state = self._state()
        eps, delta = self._spent(state)
        budget = state["budget"]
        remaining = None if budget is None else [max(0.0, budget[0] - eps), max(0.0, budget[1] - delta)]
        return {"releases": len(state["entries"]), "epsilon_total": eps, "delta_total": delta,
                "budget": budget, "remaining": remaining}

    def __repr__(self) -> str:
        where = "in memory" if self.path is None else str(self.path)
        return f"PrivacyLedger({where})"

    def __deepcopy__(self, memo: dict) -> PrivacyLedger:
        """A ledger is a handle on one account: copies (``sklearn.base.clone``) share it."""
        return self

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_thread_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._thread_lock = threading.RLock()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
