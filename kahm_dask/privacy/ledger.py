"""A privacy ledger: every DP release made from one data set, and the budget they spend.

Each release of noisy rows from a data set spends (ε, δ) of element-level privacy; releases
compose (basic composition: the ε add up, the δ add up). The ledger lives beside the data store
on the owner's side (like diffprivlib's ``BudgetAccountant``, but on disk), records each release
once (a resumed run that reuses its stored noisy rows spends nothing new), and refuses a release
that would take the total past an optional budget.

Examples
--------
>>> ledger = PrivacyLedger(budget=(3.0, 0.0))
>>> ledger.record(2.0, 0.0, release_id="a", what="fabricated rows")["epsilon"]
2.0
>>> ledger.spent()
(2.0, 0.0)
>>> ledger.check(2.0, 0.0)  # doctest: +NORMALIZE_WHITESPACE
Traceback (most recent call last):
...
kahm_dask.privacy.ledger.BudgetExceededError: this release (ε = 2, δ = 0) would take the total to
(ε = 4, δ = 0), beyond the budget (ε = 3, δ = 0).
"""

from __future__ import annotations

import time
from pathlib import Path

from kahm_dask.pipeline.location import Location, as_location

__all__ = ["PrivacyLedger", "BudgetExceededError", "LEDGER_SUFFIX", "ledger_path"]

LEDGER_SUFFIX = ".privacy-ledger.json"


class BudgetExceededError(RuntimeError):
    """A release would spend more privacy than the ledger's budget allows."""


def ledger_path(data_store: str | Path | Location) -> Path | Location:
    """The ledger beside a data store: ``<store>.privacy-ledger.json`` (a
    :class:`~kahm_dask.pipeline.location.Location` beside a remote store's location)."""
    if isinstance(data_store, Location) and not data_store.is_local:
        return data_store.with_name(data_store.name + LEDGER_SUFFIX)
    p = data_store.path if isinstance(data_store, Location) else Path(data_store)
    return p.with_name(p.name.rstrip("/") + LEDGER_SUFFIX)


class PrivacyLedger:
    """Releases of one data set, kept in memory or in a JSON file (written atomically).

    Parameters
    ----------
    path : file of the ledger (a local path or a :class:`~kahm_dask.pipeline.location.Location`),
        or None (in memory). An existing file is read.
    budget : (ε, δ) total allowed, or None (no limit; a budget stored in the file is kept).
    """

    def __init__(self, path: str | Path | Location | None = None, budget: tuple[float, float] | None = None) -> None:
        self._file = None if path is None else as_location(path)
        self.path = None if self._file is None else self._file.public()  # a Path, or a URL
        stored = self._file.read_json() if self._file is not None and self._file.exists() else {}
        self.entries: list[dict] = list(stored.get("entries", []))
        budget = budget if budget is not None else stored.get("budget")
        if budget is not None:
            eps, delta = (float(v) for v in budget)
            if eps <= 0 or not 0 <= delta < 1:
                raise ValueError(f"budget must be (ε > 0, δ in [0, 1)), got {budget!r}.")
            budget = (eps, delta)
        self.budget = budget

    def spent(self) -> tuple[float, float]:
        """Total (ε, δ) of the recorded releases (basic composition)."""
        return (sum(e["epsilon"] for e in self.entries), sum(e["delta"] for e in self.entries))

    def has(self, release_id: str) -> bool:
        return any(e["release_id"] == release_id for e in self.entries)

    def check(self, epsilon: float, delta: float) -> None:
        """Raise :class:`BudgetExceededError` if a release of (ε, δ) would exceed the budget."""
        if self.budget is None:
            return
        eps, dl = self.spent()
        if eps + epsilon > self.budget[0] * (1 + 1e-12) or dl + delta > self.budget[1] + 1e-15:
            raise BudgetExceededError(
                f"this release (ε = {epsilon:g}, δ = {delta:g}) would take the total to "
                f"(ε = {eps + epsilon:g}, δ = {dl + delta:g}), beyond the budget "
                f"(ε = {self.budget[0]:g}, δ = {self.budget[1]:g})."
            )

    def record(self, epsilon: float, delta: float, *, release_id: str, what: str, **details) -> dict:
        """Record one release (checked against the budget first); a known ``release_id`` is
        not recorded twice. Returns the entry."""
        for e in self.entries:
            if e["release_id"] == release_id:
                return e
        self.check(epsilon, delta)
        entry = {
            "release_id": release_id,
            "epsilon": float(epsilon),
            "delta": float(delta),
            "what": what,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **details,
        }
        self.entries.append(entry)
        self._save()
        return entry

    def summary(self) -> dict:
        eps, delta = self.spent()
        return {"releases": len(self.entries), "epsilon_total": eps, "delta_total": delta, "budget": self.budget}

    def _save(self) -> None:
        """Write the ledger file atomically (a reader sees the old or the new ledger)."""
        if self._file is None:
            return
        self._file.write_json({"budget": self.budget, "entries": self.entries}, indent=2)
