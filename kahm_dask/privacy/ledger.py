"""The privacy ledger: every DP release of private rows, charged to the rows it contains.

Each release of noisy rows spends (ε, δ) of element-level privacy on **each row it contains**,
and the releases that cover a row compose (:func:`~kahm_dask.privacy.ledger_composition.compose`).
So the ledger counts by rows: a row is recognised by a keyed digest of its entries at float32
precision (:mod:`kahm_dask.privacy.ledger_rows`), and subsets, supersets, re-splits,
cross-validation folds, appended rows and float32 copies share their spend. One ledger per
**ledger directory** on the owner's side (:mod:`kahm_dask.privacy.ledger_book`): ``ledger_dir``
where a caller gives one, else ``$KAHM_DASK_LEDGER_DIR``, else
``$XDG_DATA_HOME/kahm-dask/ledgers`` (by default ``~/.local/share/kahm-dask/ledgers``;
:func:`default_ledger_dir`). ``KAHMClassifier``, ``DaskKAHMClassifier``, ``kahm-dask train`` and
``kahm-dask run`` (central and federated) all record there.

A :class:`PrivacyLedger` is a view of the ledger on a set of rows (:meth:`PrivacyLedger.for_data`,
:meth:`PrivacyLedger.bind`): it spends on those rows and reports on them. A view without rows is
the whole ledger: it reports on every row, its budget is the **ledger-wide** budget (a limit on
every row), and what it spends is charged to one unnamed row of its own (the examples below).

The rules:

* **Histories.** Rows released together share a *history* (the ids of the releases that
  covered them, and their budget); a new release maps each history it touches to a new one.
  A row's spend is the composition of its history's releases.
* **One locked transaction.** :meth:`PrivacyLedger.spend` reads the ledger under an exclusive
  file lock, checks every history its rows are in, records the release and writes the ledger
  atomically before the lock is released. Callers spend *before* drawing the noise, so two
  concurrent releases are both recorded, or the second is refused. A release id already
  recorded is not charged again (a resumed run reusing its stored noise).
* **Budgets are per row and only go down.** A budget given for a data set applies to its rows;
  a budget given to the whole ledger applies to every row; a row's budget is the smallest of
  its own and the ledger-wide one. A caller cannot raise either
  (:class:`BudgetChangeError`): only the owner can, with :meth:`PrivacyLedger.set_budget`
  ``(..., allow_raise=True)`` or ``kahm-dask ledger budget --raise``. A release is refused if
  any of its rows would pass its budget, naming how many rows, the earlier releases, the ledger
  file and the ways on.
* **Private files.** The directory is 0700 and its files 0600 (owner only): they hold the key
  of the row digests and the digests.

Examples
--------
>>> ledger = PrivacyLedger(budget=(3.0, 0.0))
>>> ledger.spend(2.0, 0.0, release_id="a", what="fabricated rows")["epsilon"]
2.0
>>> ledger.spent(), ledger.remaining()
((2.0, 0.0), (1.0, 0.0))
>>> ledger.spend(2.0, 0.0, release_id="b", what="again")  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
Traceback (most recent call last):
...
kahm_dask.privacy.ledger.BudgetExceededError: this release (ε = 2, δ = 0) would take 1 of its 1 row(s)
to (ε = 4, δ = 0), beyond the budget (ε = 3, δ = 0) of those rows; ...

Rows are charged wherever they appear again:

>>> import numpy as np
>>> X = np.arange(12.0).reshape(6, 2)
>>> book = PrivacyLedger(budget=(3.0, 0.0))
>>> _ = book.bind(X[:4]).spend(2.0, 0.0, release_id="first", what="rows 0-3")
>>> book.bind(X[3:].astype(np.float32)).spent()  # row 3 was released
(2.0, 0.0)
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kahm_dask.privacy.fingerprint import fingerprint
from kahm_dask.privacy.ledger_book import LEDGER_FILE, LOCK_TIMEOUT, LedgerBook, LedgerError, LedgerState
from kahm_dask.privacy.ledger_composition import compose, exceeds
from kahm_dask.privacy.ledger_rows import locate, merge, row_digests, unique_rows

__all__ = [
    "PrivacyLedger",
    "BudgetExceededError",
    "BudgetChangeError",
    "BudgetRefusalWarning",
    "LedgerError",
    "check_budget",
    "default_ledger_dir",
    "LEDGER_DIR_ENV",
    "LEDGER_FILE",
    "LOCK_TIMEOUT",
]

#: Environment variable naming the ledger directory (overrides the default location).
LEDGER_DIR_ENV = "KAHM_DASK_LEDGER_DIR"
#: The digest standing for "the rows of a view made without rows" (one unnamed data set).
_UNNAMED = np.zeros((1, 2), dtype=np.uint64)
#: Releases named in a refusal at most.
_NAMED = 5


class BudgetExceededError(RuntimeError):
    """A release would spend more privacy on some of its rows than their budget allows."""


class BudgetChangeError(ValueError):
    """A caller tried to raise a stored budget (only the owner can, explicitly)."""


class BudgetRefusalWarning(UserWarning):
    """Emitted with every :class:`BudgetExceededError`: a caller that swallows exceptions
    (scikit-learn's model selection with a numeric ``error_score``) still shows the refusal."""


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


#: Rows to charge: a matrix (N, p), a function of the ledger key giving digests (N, 2), or a
#: dataset store (with ``row_digests(key)`` and ``fingerprint()``).
RowsSpec = Any


class PrivacyLedger:
    """A view of a ledger (a ledger directory, or memory) on a set of rows.

    Parameters
    ----------
    path : the ledger directory, or None (in memory). Prefer :meth:`for_data`.
    budget : (ε, δ) or None. Lowers the budget of the view's rows, or sets their first one;
        raising it is a :class:`BudgetChangeError` (see :meth:`set_budget`). None keeps it.
    rows : the view's rows: a matrix (N, p) of private rows, a dataset store (its digests are
        computed on the Dask workers), or a function of the ledger's key returning their digests
        (N, 2) (:func:`~kahm_dask.privacy.ledger_rows.row_digests`); None: the whole ledger
        (module docstring). The first time a matrix or a store is seen, the per-data-set ledger
        an earlier kahm-dask kept for exactly these rows (``<dir>/<fingerprint>.json``) is
        charged to them.

    Every query re-reads the ledger, so a view always shows what every process recorded.
    """

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        budget: tuple[float, float] | None = None,
        *,
        rows: RowsSpec | None = None,
        _book: LedgerBook | None = None,
    ) -> None:
        self.book = _book if _book is not None else LedgerBook(path)
        self.path = self.book.path
        budget = check_budget(budget)
        with self.book.transaction() as state:
            self._digests = None if rows is None else self._resolve_rows(rows, state.key)
            if rows is not None and self.book.path is not None and any(
                    p.name != LEDGER_FILE for p in self.book.path.glob("*.json")):
                self._fold_legacy(state, _data_rows(rows))
            if budget is not None:
                self._set_budget(state, budget, allow_raise=False)

    @staticmethod
    def _resolve_rows(rows: RowsSpec, key: np.ndarray) -> np.ndarray:
        if hasattr(rows, "row_digests"):
            digests = rows.row_digests(key)
        else:
            digests = rows(key) if callable(rows) else row_digests(rows, key)
        return unique_rows(digests)

    @classmethod
    def for_data(
        cls,
        rows: RowsSpec,
        directory: str | os.PathLike | None = None,
        budget: tuple[float, float] | None = None,
    ) -> PrivacyLedger:
        """The view on ``rows`` (a matrix, or a function of the key giving digests) of the
        ledger in ``directory`` (None: :func:`default_ledger_dir`), created 0700 / 0600 if absent."""
        return cls(default_ledger_dir() if directory is None else directory, budget, rows=rows)

    def bind(self, rows: RowsSpec, budget: tuple[float, float] | None = None) -> PrivacyLedger:
        """A view of the same ledger on ``rows`` (as in :meth:`for_data`); ``budget`` lowers theirs."""
        return PrivacyLedger(budget=budget, rows=rows, _book=self.book)

    @property
    def file(self) -> Path | None:
        """The ledger's state file (None in memory)."""
        return self.book.file

    @property
    def n_rows(self) -> int:
        """The number of distinct rows of this view (of the whole ledger for a view without rows)."""
        if self._digests is None:
            with self.book.transaction() as state:
                return int(state.meta["n_rows"])
        return len(self._digests)

    @property
    def _charged(self) -> np.ndarray:
        """The digests a release of this view is charged to."""
        return _UNNAMED if self._digests is None else self._digests

    # ------------------------------------------------------------------ histories
    def _histories(self, state: LedgerState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``found`` (u,), ``position`` (u,) of the view's rows in the index and their history id
        (u,) int64, -1 for a row never seen."""
        found, position = locate(state.hi, state.lo, self._charged)
        hist = np.full(len(self._charged), -1, dtype=np.int64)
        hist[found] = np.asarray(state.history[position[found]], dtype=np.int64)
        return found, position, hist

    @staticmethod
    def _record(state: LedgerState, hid: int) -> dict:
        if hid < 0:
            return {"releases": [], "budget": None, "rows": 0}
        return state.meta["histories"][str(hid)]

    @staticmethod
    def _spent_of(state: LedgerState, record: dict) -> tuple[float, float]:
        return compose(state.meta["releases"][r] for r in record["releases"])

    @staticmethod
    def _budget_of(state: LedgerState, record: dict) -> tuple[float, float] | None:
        """A history's budget: the smallest of its own and the ledger-wide one (ε and δ each)."""
        budgets = [b for b in (record["budget"], state.meta["budget"]) if b is not None]
        if not budgets:
            return None
        return (min(b[0] for b in budgets), min(b[1] for b in budgets))

    def _remap(self, state: LedgerState, hist: np.ndarray, found: np.ndarray, position: np.ndarray,
               change: Callable[[dict], dict | None]) -> None:
        """Give the view's rows new histories: ``change(record)`` of each old history (a new
        record, or None to keep it), and write the index (new rows inserted)."""
        ids, inverse = np.unique(hist, return_inverse=True)
        mapping = np.empty(len(ids), dtype=np.int64)
        for k, hid in enumerate(ids):
            new = change(self._record(state, int(hid)))
            if new is None:
                mapping[k] = hid
                continue
            new_id = int(state.meta["next_history"])
            state.meta["next_history"] = new_id + 1
            state.meta["histories"][str(new_id)] = {**new, "rows": 0}
            mapping[k] = new_id
        new_hist = mapping[inverse]
        if (new_hist == hist).all():
            return
        if new_hist.max() >= 2**32 - 1:
            raise LedgerError(f"the privacy ledger {self.book} has run out of history ids; no release was made.")
        old = (state.hi, state.lo, state.history)
        absent = ~found
        n_old = len(state.hi)

        def fill(out):
            merge(old, self._charged[absent], position[absent], new_hist[absent], out)
            present = position[found]
            out[2][present + np.searchsorted(position[absent], present, side="right")] = new_hist[found]

        state.write_index(n_old + int(absent.sum()), fill)
        self._count_rows(state)

    @staticmethod
    def _count_rows(state: LedgerState) -> None:
        """Recount the rows of every history; drop the histories no row is in."""
        counts = np.zeros(int(state.meta["next_history"]), dtype=np.int64)
        for a in range(0, len(state.history), 1 << 22):
            block = np.asarray(state.history[a : a + (1 << 22)], dtype=np.int64)
            counts += np.bincount(block, minlength=len(counts))
        histories = state.meta["histories"]
        for hid in list(histories):
            if counts[int(hid)] == 0:
                del histories[hid]
            else:
                histories[hid]["rows"] = int(counts[int(hid)])

    # ------------------------------------------------------------------ budget
    def _set_budget(self, state: LedgerState, budget: tuple[float, float], *, allow_raise: bool) -> None:
        if self._digests is None:
            stored = state.meta["budget"]
            if stored is not None and not allow_raise:
                _check_lowered(stored, budget, f"the rows of the ledger {self.book}")
            if stored is None or list(stored) != list(budget):
                state.meta["budget"] = list(budget)
                by = "owner (set)" if allow_raise else "caller (lowered)"
                state.meta["budget_changes"].append({"time": _now(), "budget": list(budget), "by": by,
                                                     "rows": "all"})
            return
        found, position, hist = self._histories(state)
        if not allow_raise:
            for hid in np.unique(hist):
                stored = self._record(state, int(hid))["budget"]
                if stored is not None:
                    _check_lowered(stored, budget, f"some of these rows in the ledger {self.book}")

        def change(record: dict) -> dict | None:
            if record["budget"] is not None and list(record["budget"]) == list(budget):
                return None
            return {"releases": list(record["releases"]), "budget": list(budget)}

        generation = state.meta["generation"]
        self._remap(state, hist, found, position, change)
        if state.meta["generation"] != generation:
            by = "owner (set)" if allow_raise else "caller (lowered)"
            state.meta["budget_changes"].append({"time": _now(), "budget": list(budget), "by": by,
                                                 "rows": self.n_rows})

    def set_budget(self, epsilon: float, delta: float = 0.0, *, allow_raise: bool = False) -> None:
        """Set the budget of the view's rows to (ε, δ); raising it needs ``allow_raise=True``
        (the owner's decision). A budget below what is already spent refuses every further release."""
        budget = check_budget((epsilon, delta))
        with self.book.transaction() as state:
            self._set_budget(state, budget, allow_raise=allow_raise)

    # ------------------------------------------------------------------ queries
    def levels(self) -> list[dict]:
        """The view's rows grouped by history: ``{"rows", "spent" (ε, δ), "budget", "releases"}``
        each, most spent first (rows never released: a level with ``spent`` (0, 0); a view
        without rows: every history of the ledger, or that one level if it has none)."""
        with self.book.transaction() as state:
            if self._digests is None:
                groups = [(int(h), record["rows"]) for h, record in state.meta["histories"].items()] or [(-1, 0)]
            else:
                ids, counts = np.unique(self._histories(state)[2], return_counts=True)
                groups = [(int(h), int(c)) for h, c in zip(ids, counts, strict=True)]
            out = []
            for hid, count in groups:
                record = self._record(state, hid)
                out.append({"rows": count, "spent": self._spent_of(state, record),
                            "budget": self._budget_of(state, record), "releases": list(record["releases"])})
        return sorted(out, key=lambda level: level["spent"], reverse=True)

    @property
    def budget(self) -> tuple[float, float] | None:
        """The smallest budget of the view's rows (ε and δ each), or None (no limit)."""
        budgets = [level["budget"] for level in self.levels() if level["budget"] is not None]
        if not budgets:
            return None
        return (min(b[0] for b in budgets), min(b[1] for b in budgets))

    @property
    def entries(self) -> list[dict]:
        """The releases that covered any of the view's rows, oldest first (copies)."""
        ids = {r for level in self.levels() for r in level["releases"]}
        with self.book.transaction() as state:
            releases = state.meta["releases"]
            return [dict(releases[r], release_id=r) for r in sorted(ids, key=lambda r: releases[r]["order"])]

    def spent(self) -> tuple[float, float]:
        """The largest (ε, δ) spent on any of the view's rows (ε and δ each)."""
        levels = self.levels()
        return (max(level["spent"][0] for level in levels), max(level["spent"][1] for level in levels))

    def remaining(self) -> tuple[float, float]:
        """(ε, δ) still allowed on every one of the view's rows (``(inf, 1)`` without a budget;
        never negative)."""
        eps, delta = math.inf, 1.0
        for level in self.levels():
            if level["budget"] is not None:
                eps = min(eps, max(0.0, level["budget"][0] - level["spent"][0]))
                delta = min(delta, max(0.0, level["budget"][1] - level["spent"][1]))
        return eps, delta

    def has(self, release_id: str) -> bool:
        """Whether the ledger records the release ``release_id`` (on any rows)."""
        with self.book.transaction() as state:
            return release_id in state.meta["releases"]

    def _refusal(self, state: LedgerState, hist: np.ndarray, epsilon: float, delta: float) -> str | None:
        ids, counts = np.unique(hist, return_counts=True)
        over, worst = 0, None
        for hid, count in zip(ids, counts, strict=True):
            record = self._record(state, int(hid))
            spent = self._spent_of(state, record)
            after = (spent[0] + epsilon, spent[1] + delta)
            budget = self._budget_of(state, record)
            if exceeds(after, budget):
                over += int(count)
                if worst is None or after > worst[0]:
                    worst = (after, budget, record["releases"])
        if worst is None:
            return None
        after, budget, earlier = worst
        releases = state.meta["releases"]
        named = "; ".join(f"{r[:12]} ({releases[r]['time']}, ε = {releases[r]['epsilon']:g}: {releases[r]['what']})"
                          for r in earlier[-_NAMED:])
        more = f" and {len(earlier) - _NAMED} more" if len(earlier) > _NAMED else ""
        return (f"this release {_fmt(epsilon, delta)} would take {over} of its {len(hist)} row(s) to "
                f"{_fmt(*after)}, beyond the budget {_fmt(*budget)} of those rows; they were released before in "
                f"{len(earlier)} release(s): {named or 'none'}{more}. Ledger: {self.book}. No release was made. "
                "To go on: `kahm-dask ledger show STORE` shows the spend per row; the data owner may raise "
                "the budget with `kahm-dask ledger budget STORE EPS DELTA --raise`; a run resumed in its "
                "earlier run folder reuses its stored noise and costs nothing; to tune a model, release "
                "once and tune on the release.")

    def check(self, epsilon: float, delta: float) -> None:
        """Raise :class:`BudgetExceededError` if a release of (ε, δ) on the view's rows would
        exceed a budget now (advisory: :meth:`spend` checks again under the lock)."""
        with self.book.transaction() as state:
            reason = self._refusal(state, self._histories(state)[2], float(epsilon), float(delta))
        if reason is not None:
            _refuse(reason)

    # ------------------------------------------------------------------ spending
    def spend(self, epsilon: float, delta: float, *, release_id: str, what: str, **details: Any) -> dict:
        """Record one release of (ε, δ) of the view's rows in one locked transaction: refused
        with :class:`BudgetExceededError` (and a :class:`BudgetRefusalWarning`) if any row would
        pass its budget; a ``release_id`` already recorded is returned as it is (spent once).
        Call it *before* the noise is drawn. Returns the entry."""
        return self._record_release(float(epsilon), float(delta), release_id, what, details, check=True)

    def adopt(self, epsilon: float, delta: float, *, release_id: str, what: str, **details: Any) -> dict:
        """Record a release of the view's rows that already happened (one a dataset store
        remembers and this ledger lacks: ``kahm-dask ledger adopt``), without a budget check: it
        cannot be refused any more. A ``release_id`` already recorded is left as it is."""
        return self._record_release(float(epsilon), float(delta), release_id, what, details, check=False)

    def adopt_remembered(self, releases: list[dict]) -> list[dict]:
        """:meth:`adopt` each release a dataset store remembers (``DatasetStore.releases``) that
        this ledger lacks; returns those adopted (``kahm-dask ledger adopt``)."""
        missing = [r for r in releases if not self.has(r["release_id"])]
        for r in missing:
            self.adopt(r["epsilon"], r["delta"], release_id=r["release_id"],
                       what=f"{r['what']} (adopted from {r.get('ledger')}, {r.get('time')})")
        return missing

    def _record_release(self, epsilon: float, delta: float, release_id: str, what: str, details: dict, *,
                        check: bool) -> dict:
        with self.book.transaction() as state:
            return self._charge(state, epsilon, delta, release_id, what, details, check=check)

    def _charge(self, state: LedgerState, epsilon: float, delta: float, release_id: str, what: str, details: dict,
                *, check: bool) -> dict:
        """Record a release of the view's rows in the transaction's ``state`` (:meth:`spend`)."""
        releases = state.meta["releases"]
        if release_id in releases:
            return dict(releases[release_id], release_id=release_id)
        found, position, hist = self._histories(state)
        reason = self._refusal(state, hist, epsilon, delta) if check else None
        if reason is not None:
            _refuse(reason)
        entry = {"epsilon": epsilon, "delta": delta, "what": what, "time": _now(),
                 "pid": os.getpid(), "rows": len(self._charged), "order": len(releases), **details}
        releases[release_id] = _jsonable(entry)
        self._remap(state, hist, found, position,
                    lambda record: {"releases": [*record["releases"], release_id], "budget": record["budget"]})
        return dict(releases[release_id], release_id=release_id)

    def _fold_legacy(self, state: LedgerState, data_rows: str | None) -> None:
        """Charge the releases of an earlier kahm-dask's ledger of exactly these rows
        (``<dir>/<fingerprint>.json``, one per data set) to the view's rows, once; its budget
        becomes theirs. The old file is left as it was."""
        if data_rows is None or data_rows in state.meta.setdefault("legacy", []):
            return
        old = self.book.path / f"{data_rows}.json"
        if not old.is_file():
            return
        try:
            legacy = json.loads(old.read_text(encoding="utf-8"))
            entries, budget = legacy["entries"], legacy.get("budget")
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"the earlier per-data-set ledger {old} of these rows is damaged ({exc}); restore "
                              "it from a backup. No release was made.") from None
        for e in entries:
            details = {k: v for k, v in e.items() if k not in ("release_id", "epsilon", "delta", "what", "time")}
            self._charge(state, float(e["epsilon"]), float(e["delta"]), str(e["release_id"]),
                         f"{e.get('what')} (from {old.name}, {e.get('time')})", details, check=False)
        if budget is not None:
            found, position, hist = self._histories(state)
            self._remap(state, hist, found, position, lambda record: {
                "releases": list(record["releases"]),
                "budget": [min(float(b), float(c)) for b, c in zip(record["budget"] or budget, budget, strict=True)]})
        state.meta["legacy"].append(data_rows)

    def summary(self) -> dict:
        """Releases, spend and budget of the view's rows, for reports: ``{"releases",
        "epsilon_total", "delta_total" (the most spent on a row), "budget", "remaining"
        (None without a budget), "rows", "levels"}``."""
        levels = self.levels()
        budget = self.budget
        eps, delta = (max(level["spent"][0] for level in levels), max(level["spent"][1] for level in levels))
        return {"releases": len({r for level in levels for r in level["releases"]}), "epsilon_total": eps,
                "delta_total": delta, "budget": None if budget is None else list(budget),
                "remaining": None if budget is None else list(self.remaining()), "rows": self.n_rows,
                "levels": levels}

    def __repr__(self) -> str:
        rows = "all rows" if self._digests is None else f"{len(self._digests)} row(s)"
        return f"PrivacyLedger({self.book}, {rows})"

    def __deepcopy__(self, memo: dict) -> PrivacyLedger:
        """A ledger is a handle on one account: copies (``sklearn.base.clone``) share it."""
        return self


def _check_lowered(stored: list[float], budget: tuple[float, float], whose: str) -> None:
    """:class:`BudgetChangeError` if ``budget`` raises the ``stored`` one (ε or δ)."""
    if budget[0] > stored[0] or budget[1] > stored[1]:
        raise BudgetChangeError(
            f"{whose} have the budget {_fmt(*stored)}; a caller may lower it but not raise it to "
            f"{_fmt(*budget)}. Raising it is the data owner's decision: PrivacyLedger.set_budget(..., "
            "allow_raise=True) or `kahm-dask ledger budget STORE EPS DELTA --raise`."
        )


def _data_rows(rows: RowsSpec) -> str | None:
    """The multiset fingerprint of ``rows`` (a matrix or a dataset store), which named the ledger
    file of an earlier kahm-dask; None for a digest function."""
    if hasattr(rows, "fingerprint"):
        return rows.fingerprint().rows
    if callable(rows):
        return None
    return fingerprint(np.asarray(rows)).rows


def _refuse(reason: str) -> None:
    warnings.warn(reason, BudgetRefusalWarning, stacklevel=3)
    raise BudgetExceededError(reason)


def _jsonable(entry: dict) -> dict:
    return json.loads(json.dumps(entry, default=str))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
