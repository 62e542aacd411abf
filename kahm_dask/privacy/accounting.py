"""Composition of releases: what a whole record (or a row's many releases) costs, one place.

A release protects one entry at (ε, δ). A record of p features differs from its neighbour in up
to p entries, so it is covered by the p-fold composition of the release. Two bounds:

* basic: ``(p·ε, p·δ)``, the sum of the losses;
* PLD (privacy loss distribution, Google's ``dp-accounting``): the ε of the exact p-fold
  composition at a record δ. Every (ε, δ)-DP release is dominated by the pessimistic two-point
  PLD (loss +ε with probability (1 − δ)/(1 + e^−ε), −ε with (1 − δ)/(1 + e^ε), +∞ with δ), so
  its composition bounds any such release, and is tight for the worst one (randomised
  response). It is far below p·ε when ε is small: 2.11 instead of 3.0 for p = 30 at ε = 0.1.

Discretisation. ``dp-accounting`` rounds each loss *up* to a multiple of its discretisation
interval (pessimistic, so the reported ε is an upper bound). For p copies of one release the
interval is ε itself: the losses ±ε lie on the grid, nothing is rounded, the composed PLD is
the exact binomial law of ``(p − 2k)·ε`` and the reported ε is the exact optimal composition
ε (the tests compare it with the binomial formula to a relative 1e-10), computed on 2p + 1
points (about 10 ms at p = 784). Only the tail mass that ``dp-accounting`` truncates (below
1e-15) is added to δ, on the pessimistic side; and above a record ε of about 700, where
``e^−loss`` underflows, ``dp-accounting`` answers the composed loss just above the exact ε (at
most 2ε over). Releases of different ε (:func:`compose`) share the interval ``Σε / (1000·k)``
for k releases: each loss moves up by less than one interval, so the reported ε is at most
``Σε / 1000`` (a thousandth of the basic bound) above the exact one, never below.

Above ε = :data:`PLD_MAX_EPSILON` per release the −ε mass ``1/(1 + e^ε)`` is below 1e-17, the PLD
equals the basic bound to float precision, and the basic bound (p·ε) is reported: no overflow of
``e^ε`` for huge ε.

Examples
--------
>>> r = record_epsilon(0.1, 30)
>>> round(r.pld, 2), round(r.basic, 2), r.delta
(2.11, 3.0, 1e-05)
>>> round(entry_epsilon_for_record(4.0, 30), 3)
0.18
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.common import DifferentialPrivacyParameters
from scipy.optimize import brentq

__all__ = [
    "RECORD_DELTA",
    "PLD_MAX_EPSILON",
    "SOLVE_RTOL",
    "RecordEpsilon",
    "record_epsilon",
    "entry_epsilon_for_record",
    "compose",
    "MIN_USEFUL_ENTRY_EPSILON",
    "entry_epsilon",
    "unit_factor",
    "at_unit",
]

#: The δ at which a record-level ε is stated (and the default ``record_delta``).
RECORD_DELTA = 1e-5
#: Per-release ε above which the PLD equals the basic bound to float precision (module docstring).
PLD_MAX_EPSILON = 40.0
#: Relative tolerance of :func:`entry_epsilon_for_record`.
SOLVE_RTOL = 1e-6
#: The smallest ε per entry a record-level target may ask for: below it the noise's scale d/ε
#: is over 1000 times the adjacency bound (the bound width by default), and the rows carry no
#: usable signal.
MIN_USEFUL_ENTRY_EPSILON = 1e-3
#: Intervals per mean ε of the shared grid of :func:`compose` (its error: Σε / this, at most).
_GRID_PER_EPSILON = 1000


class RecordEpsilon(NamedTuple):
    """The ε of a composition at ``delta``: ``pld`` (tight, an upper bound) and ``basic``
    (the sum of the ε); ``basic_delta``: the δ of the basic bound (the sum of the δ)."""

    pld: float
    basic: float
    delta: float
    basic_delta: float


def _check(epsilon: float, entry_delta: float, name: str = "entry_epsilon") -> None:
    if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {epsilon!r}.")
    if not 0 <= entry_delta < 1:
        raise ValueError(f"entry_delta must be in [0, 1), got {entry_delta!r}.")


def _pld(epsilon: float, delta: float, interval: float) -> pld_lib.PrivacyLossDistribution:
    return pld_lib.from_privacy_parameters(DifferentialPrivacyParameters(epsilon, delta),
                                           value_discretization_interval=interval)


@lru_cache(maxsize=1024)
def record_epsilon(
    entry_epsilon: float, n_features: int, delta: float = RECORD_DELTA, entry_delta: float = 0.0
) -> RecordEpsilon:
    """The ε of a whole record: the ``n_features``-fold composition of an (ε, δ_e) release,
    at the record δ ``delta`` (PLD), beside the basic bound ``(p·ε, p·δ_e)``.

    ``pld`` is ``inf`` when the entries' δ alone, ``1 − (1 − δ_e)^p``, reaches ``delta``
    (no finite ε holds at that δ). Exact to about 1e-9 (module docstring).

    >>> record_epsilon(0.5, 1).pld < 0.5   # one release: its ε at δ = 1e-5 is a hair below ε
    True
    """
    _check(entry_epsilon, entry_delta)
    if not (isinstance(n_features, int) and n_features >= 1):
        raise ValueError(f"n_features must be an int >= 1, got {n_features!r}.")
    basic = RecordEpsilon(n_features * entry_epsilon, n_features * entry_epsilon, delta, n_features * entry_delta)
    if entry_epsilon > PLD_MAX_EPSILON:
        return basic._replace(pld=math.inf if 1 - (1 - entry_delta) ** n_features >= delta else basic.pld)
    composed = _pld(entry_epsilon, entry_delta, entry_epsilon).self_compose(n_features)
    return basic._replace(pld=min(float(composed.get_epsilon_for_delta(delta)), math.inf))


def entry_epsilon_for_record(
    target_epsilon: float, n_features: int, delta: float = RECORD_DELTA, entry_delta: float = 0.0
) -> float:
    """The largest ε per entry whose record ε (PLD, :func:`record_epsilon`) is at most
    ``target_epsilon`` at ``delta``: solved by Brent's method on the monotone PLD ε in log ε,
    to a relative :data:`SOLVE_RTOL`, then stepped down until its record ε is within the target
    (so the target is never exceeded).

    >>> round(entry_epsilon_for_record(1.0, 784), 4)
    0.0096
    """
    _check(target_epsilon, entry_delta, "record_epsilon")
    if 1 - (1 - entry_delta) ** n_features >= delta:
        raise ValueError(
            f"record_epsilon cannot be met at record_delta = {delta:g}: the {n_features} entries' delta "
            f"({entry_delta:g} each) already adds up to {1 - (1 - entry_delta) ** n_features:.3g}."
        )

    def excess(log_eps: float) -> float:
        return record_epsilon(math.exp(log_eps), n_features, delta, entry_delta).pld - target_epsilon

    low = math.log(target_epsilon / n_features)  # PLD <= basic = target there
    if excess(low) >= 0:
        return target_epsilon / n_features
    high = math.log(target_epsilon) + 1.0
    while excess(high) <= 0:  # the record ε is at least about the entry ε: found at once in practice
        low, high = high, high + 1.0
    log_eps = brentq(excess, low, high, xtol=SOLVE_RTOL / 4, rtol=4 * 2.0**-52)
    while excess(log_eps) > 0:
        log_eps -= SOLVE_RTOL / 4
    return math.exp(log_eps)


def compose(releases: Iterable[tuple[float, float]], delta: float = RECORD_DELTA) -> RecordEpsilon:
    """The ε at ``delta`` of the composition of ``releases``, (ε, δ) pairs of one unit (say
    every release charged to one row), beside the basic bound (Σε, Σδ).

    Identical releases are composed exactly (:func:`record_epsilon`); different ones on a
    shared grid, at most Σε/1000 above the exact ε (module docstring). A release above
    :data:`PLD_MAX_EPSILON` is added by the basic bound.

    >>> compose([(0.1, 0.0)] * 30).pld == record_epsilon(0.1, 30).pld
    True
    >>> round(compose([(0.1, 0.0)] * 20 + [(0.2, 0.0)] * 5).pld, 2)   # basic: 3.0
    2.36
    """
    counts = Counter((float(e), float(d)) for e, d in releases)
    if not counts:
        return RecordEpsilon(0.0, 0.0, delta, 0.0)
    for eps, d in counts:
        _check(eps, d, "epsilon")
    basic = sum(e * n for (e, _), n in counts.items())
    basic_delta = sum(d * n for (_, d), n in counts.items())
    if len(counts) == 1:
        ((eps, d), n), = counts.items()
        return record_epsilon(eps, n, delta, d)
    large = {k: n for k, n in counts.items() if k[0] > PLD_MAX_EPSILON}
    small = {k: n for k, n in counts.items() if k[0] <= PLD_MAX_EPSILON}
    added = sum(e * n for (e, _), n in large.items())  # basic composition of the large ones
    added_delta = sum(d * n for (_, d), n in large.items())
    if not small:
        pld = basic if added_delta < delta else math.inf
        return RecordEpsilon(pld, basic, delta, basic_delta)
    k = sum(small.values())
    interval = sum(e * n for (e, _), n in small.items()) / (_GRID_PER_EPSILON * k)
    composed = None
    for (eps, d), n in small.items():
        part = _pld(eps, d, interval).self_compose(n)
        composed = part if composed is None else composed.compose(part)
    rest = delta - added_delta
    pld = added + float(composed.get_epsilon_for_delta(rest)) if rest > 0 else math.inf
    return RecordEpsilon(min(pld, math.inf), basic, delta, basic_delta)


def entry_epsilon(
    epsilon: float | None,
    record_epsilon: float | None,
    n_features: int,
    *,
    record_delta: float = RECORD_DELTA,
    delta: float = 0.0,
) -> float | None:
    """The ε per entry of a fit on ``n_features`` features: ``epsilon`` as given, else the one
    that meets ``record_epsilon`` at ``record_delta`` (:func:`entry_epsilon_for_record`), else
    None (the non-private model). A target that needs less than
    :data:`MIN_USEFUL_ENTRY_EPSILON` per entry is refused with the reason.

    >>> round(entry_epsilon(None, 4.0, 30), 2)
    0.18
    """
    if record_epsilon is None:
        return epsilon
    eps = entry_epsilon_for_record(record_epsilon, n_features, record_delta, delta)
    if eps < MIN_USEFUL_ENTRY_EPSILON:
        raise ValueError(
            f"record_epsilon = {record_epsilon:g} over {n_features} features needs epsilon = {eps:.2g} per entry: "
            f"below {MIN_USEFUL_ENTRY_EPSILON:g} the noise (scale d/epsilon, over 1000 times d) swamps the bounds "
            "and the model learns nothing. Raise record_epsilon or use fewer features."
        )
    return eps


def unit_factor(lower, upper, d) -> int:
    """k = max over features of ⌈(upper_j − lower_j) / d_j⌉: the changes of at most d that make
    up the data set's unit of change, one entry moving anywhere in its public bounds (1 when d
    is the bound width, the default).

    >>> unit_factor(np.zeros(2), np.ones(2), [0.01, 1.0])
    100
    """
    width = np.asarray(upper, dtype=np.float64) - np.asarray(lower, dtype=np.float64)
    ratio = np.broadcast_to(width / np.asarray(d, dtype=np.float64), np.broadcast_shapes(np.shape(width), np.shape(d)))
    return max(1, math.ceil(float(ratio.max(initial=1.0))))


def at_unit(epsilon: float, delta: float, factor: int) -> tuple[float, float]:
    """Group privacy: an (ε, δ) guarantee for a change of d is ``(k·ε, δ·Σ_{i<k} e^{iε})`` for a
    change of k·d (``factor`` k; the δ capped at 1, and 1 where e^{iε} would overflow).

    >>> at_unit(2.0, 0.0, 100)
    (200.0, 0.0)
    """
    if factor == 1 or delta == 0:
        return factor * epsilon, delta
    if factor * epsilon > 700:
        return factor * epsilon, 1.0
    return factor * epsilon, min(1.0, delta * math.expm1(factor * epsilon) / math.expm1(epsilon))
