"""The DP release sequence, one function for every path (in memory and on Dask).

:func:`begin_release` is what ``KAHMClassifier.fit`` and the pipeline's training
(``kahm-dask train``, ``kahm-dask run``, ``DaskKAHMClassifier``) both call before any noise is
drawn::

    bounds → plan (mechanism + statement, a warning per weakening)
           → the data set's ledger → spend (check + record: one locked transaction)
           → [the caller draws the noise with ``release.mechanism``]

Spending *before* drawing is what makes concurrent releases safe: a release that the budget
refuses draws nothing, and two releases that race are both recorded or the second is refused
(:meth:`~kahm_dask.privacy.ledger.PrivacyLedger.spend`). A release that fails after spending
(an interrupted run) stays charged, the conservative side; a pipeline run that resumes it
reuses its release id and is not charged again.

The ledger is chosen by the ``ledger`` parameter of the estimators (:func:`resolve_ledger`):
``"auto"`` (the default) is the data set's ledger in the default ledger directory
(:func:`~kahm_dask.privacy.ledger.default_ledger_dir`), a path is the data set's ledger in that
directory, a :class:`~kahm_dask.privacy.ledger.PrivacyLedger` is used as it is, and None opts
out of accounting, with a :class:`~kahm_dask.privacy.randomness.PrivacyLeakWarning`.

Examples
--------
>>> import numpy as np
>>> from kahm_dask.privacy.bounds import BOUNDS_PUBLIC
>>> from kahm_dask.privacy.ledger import PrivacyLedger
>>> ledger = PrivacyLedger(budget=(2.0, 0.0))
>>> release = begin_release(2.0, np.zeros(3), np.ones(3), BOUNDS_PUBLIC, ledger=ledger, data=None,
...                         what="example")
>>> ledger.spent(), release.mechanism.epsilon
((2.0, 0.0), 2.0)
"""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kahm_dask.params import PARAMS
from kahm_dask.privacy.accounting import at_unit
from kahm_dask.privacy.bounds import Scaling
from kahm_dask.privacy.fingerprint import DataFingerprint
from kahm_dask.privacy.ledger import PrivacyLedger
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import PrivacyLeakWarning
from kahm_dask.privacy.statement import PrivacyStatement, plan_release

__all__ = ["Release", "UtilityWarning", "begin_release", "resolve_ledger", "warn_if_no_signal", "AUTO_LEDGER",
           "NO_LEDGER_WARNING", "NO_SIGNAL_RATIO"]

#: The default ``ledger``: the data set's ledger in the default ledger directory.
AUTO_LEDGER = "auto"
NO_LEDGER_WARNING = (
    "ledger=None: this DP release is recorded in no privacy ledger, so the data set's budget "
    "cannot see or refuse it. Leave ledger='auto' (the data set's own ledger) unless another "
    "accountant records it."
)


#: Noise s.d. over the bounds' width from which a release is warned about (:func:`warn_if_no_signal`):
#: two orders of magnitude (at the default d, about ε < 0.014). Each DP row is then noise; a
#: mean over N rows still has an s.d. of 100/√N widths, about one width at N = 10 000.
NO_SIGNAL_RATIO = 100.0


class UtilityWarning(UserWarning):
    """A setting leaves the model little or no accuracy (the guarantee is not weakened)."""


def warn_if_no_signal(mechanism: GridLaplace, *, stacklevel: int = 2) -> None:
    """Warn with :class:`UtilityWarning` when even the least noisy feature's noise s.d.
    (:attr:`~kahm_dask.privacy.noise.GridLaplace.noise_sd`) is at least :data:`NO_SIGNAL_RATIO`
    times its bounds' width ``upper − lower``: the DP rows carry no signal, and the model scores
    about chance (measured: 0.103 on ten digit classes at ε = 1e-9)."""
    ratio = float(np.min(mechanism.noise_sd / (mechanism.upper - mechanism.lower)))
    if ratio >= NO_SIGNAL_RATIO:
        warnings.warn(
            f"epsilon = {mechanism.epsilon:g}: the noise s.d. is {ratio:.2g} x the bounds' width, so the DP rows "
            f"carry no signal and the model will score about chance (the s.d. is below {NO_SIGNAL_RATIO:g} x the "
            f"width from epsilon = {mechanism.epsilon * ratio / NO_SIGNAL_RATIO:.2g} at these settings).",
            UtilityWarning, stacklevel=stacklevel + 1,
        )


def resolve_ledger(
    spec: Any,
    data: DataFingerprint | Callable[[], DataFingerprint] | None,
    budget: tuple[float, float] | None = None,
    *,
    stacklevel: int = 2,
) -> PrivacyLedger | None:
    """The ledger a ``ledger`` parameter names (module docstring), with the caller's ``budget``
    applied (it may lower a stored budget, never raise it). ``data``: the data set's fingerprint,
    or a function computing it (called only when the ledger is found by fingerprint)."""
    if spec is None:
        warnings.warn(NO_LEDGER_WARNING, PrivacyLeakWarning, stacklevel=stacklevel + 1)
        if budget is not None:
            raise ValueError("a budget needs a ledger to count against: set ledger='auto' (or a ledger directory).")
        return None
    if isinstance(spec, PrivacyLedger):
        if budget is not None:
            spec.set_budget(*budget)  # lowers, or sets the first budget; raising is refused
        return spec
    if spec == AUTO_LEDGER or isinstance(spec, str | os.PathLike):
        fp = data() if callable(data) else data
        if fp is None:
            raise ValueError("the data set's fingerprint is needed to find its ledger.")
        return PrivacyLedger.for_data(fp, None if spec == AUTO_LEDGER else spec, budget)
    raise TypeError(f"ledger must be 'auto', a ledger directory, a PrivacyLedger or None, got {spec!r}.")


@dataclass(frozen=True)
class Release:
    """A release that has been planned and paid for: draw its noise with ``mechanism``.

    ``statement`` is its privacy statement, ``release_id`` its id in the ``ledger`` (None when
    opted out), ``entry`` the ledger's record of it, ``reused`` whether an earlier release (a
    resumed run's stored noise) is continued instead of a new one drawn.
    """

    mechanism: GridLaplace
    statement: PrivacyStatement
    release_id: str
    ledger: PrivacyLedger | None
    entry: dict | None
    reused: bool


def begin_release(
    epsilon: float,
    lower,
    upper,
    bounds_source: str,
    *,
    ledger: Any,
    data: DataFingerprint | Callable[[], DataFingerprint] | None,
    what: str,
    budget: tuple[float, float] | None = None,
    delta: float = PARAMS["delta"].default,
    record_delta: float = PARAMS["record_delta"].default,
    d=PARAMS["d"].default,
    dp_data: str = PARAMS["dp_data"].default,
    r_source: str = PARAMS["r_source"].default,
    cluster_on: str = PARAMS["cluster_on"].default,
    caller_partition: bool = False,
    insecure_noise: bool = False,
    scaling: Scaling | None = None,
    stored: Callable[[GridLaplace], str | None] | None = None,
    details: dict | None = None,
    stacklevel: int = 2,
) -> Release:
    """Plan a release of (ε, δ) with public bounds ``[lower, upper]`` and pay for it in the
    data set's ledger (module docstring); returns the :class:`Release` whose noise the caller
    then draws.

    One unit: the ledger is charged at the data set's unit of change, one entry moving anywhere
    in its bounds. With d below the bound width that is k = ⌈width/d⌉ changes of d, charged by
    group privacy (:func:`~kahm_dask.privacy.accounting.at_unit`: k·ε), with k recorded in the
    entry as ``unit_factor`` (docs/privacy.md#one-unit).

    ``stored`` (the pipeline's): given the planned mechanism, the release id of stored noisy
    rows that a resumed run continues (spent once, so not charged again), or None for a new
    release; it raises when stored noise belongs to other rows. ``what`` and ``details`` go
    into the ledger's entry. The other arguments are those of
    :func:`~kahm_dask.privacy.statement.plan_release`.
    """
    mechanism, statement = plan_release(
        epsilon, lower, upper, bounds_source, delta=delta, record_delta=record_delta, d=d, dp_data=dp_data,
        r_source=r_source,
        cluster_on=cluster_on, caller_partition=caller_partition, insecure_noise=insecure_noise,
        scaling=scaling, stacklevel=stacklevel + 1,
    )
    warn_if_no_signal(mechanism, stacklevel=stacklevel + 1)
    book = resolve_ledger(ledger, data, budget, stacklevel=stacklevel + 1)
    previous = None if stored is None else stored(mechanism)
    release_id = previous or uuid.uuid4().hex
    entry = None
    if book is not None:
        charged = at_unit(mechanism.epsilon, mechanism.delta, statement.unit_factor)
        entry = book.spend(*charged, release_id=release_id, what=what, unit="entry", unit_factor=statement.unit_factor,
                           mechanism=mechanism.describe(), bounds_source=bounds_source, **(details or {}))
    return Release(mechanism, statement, release_id, book, entry, previous is not None)
