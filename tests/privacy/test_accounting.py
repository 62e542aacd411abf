"""The accountant (kahm_dask/privacy/accounting.py): the PLD ε of a record against the exact
binomial composition, its properties, the oracle table of issue 39, the inverse, ``compose``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import binom

from kahm_dask.privacy.accounting import (
    PLD_MAX_EPSILON,
    SOLVE_RTOL,
    compose,
    entry_epsilon_for_record,
    record_epsilon,
)

#: The reported ε of p equal releases is the exact one (losses on the grid), up to the float
#: error of sums of 2p + 1 terms (here and in dp-accounting) and its truncated tails (< 1e-15).
EXACT_RTOL = 1e-10

#: (p, ε per entry) → (basic p·ε, PLD ε at δ = 1e-5), as published (3 significant digits).
RECORD_ORACLE = [
    (30, 0.1, 3.0, 2.11), (30, 1.0, 30.0, 29.9), (64, 0.5, 32.0, 22.7),
    (64, 2.0, 128.0, 128.0), (784, 0.01, 7.84, 1.05), (784, 0.1, 78.4, 15.2),
]
#: (p, record target) → ε per entry (PLD, basic), as published (2 significant digits).
INVERSE_ORACLE = [
    (30, 1.0, 0.051, 0.033), (30, 4.0, 0.179, 0.133), (30, 8.0, 0.329, 0.267),
    (784, 1.0, 0.0096, 0.0013), (784, 8.0, 0.060, 0.010),
]


def exact_record_epsilon(eps: float, p: int, delta: float = 1e-5) -> float:
    """The optimal p-fold composition of the worst pure ε-DP release (binomial losses (p − 2k)ε,
    k ~ Bin(p, 1/(1 + e^ε))): the ε' with E[(1 − e^(ε' − L))₊] = δ."""
    k = np.arange(p + 1)
    loss, weight = (p - 2 * k) * eps, binom.pmf(k, p, 1 / (1 + math.exp(eps)))

    def excess(e):
        return float(np.sum(weight * np.clip(-np.expm1(np.minimum(e - loss, 50.0)), 0, None))) - delta

    return 0.0 if excess(0.0) <= 0 else brentq(excess, 0.0, p * eps, xtol=1e-13)


@pytest.mark.parametrize("p", [1, 2, 30, 64, 784])
@pytest.mark.parametrize("eps", [1e-3, 0.05, 0.5, 2.0, 8.0])
def test_pld_is_the_exact_composition_from_above(p, eps):
    exact, pld = exact_record_epsilon(eps, p), record_epsilon(eps, p).pld
    if exact < 700:
        assert pld == pytest.approx(exact, rel=EXACT_RTOL, abs=1e-12)
    else:  # e^-loss underflows: dp-accounting answers the composed loss above, one step (2ε) at most
        assert exact <= pld <= exact + 2 * eps


@pytest.mark.parametrize(("p", "eps", "basic", "pld"), RECORD_ORACLE)
def test_record_oracle(p, eps, basic, pld):
    r = record_epsilon(eps, p)
    assert r.basic == pytest.approx(basic)
    assert r.pld == pytest.approx(pld, abs=0.05 * 10 ** math.floor(math.log10(pld) - 1) * 10 + 1e-9)  # ± half a digit


@pytest.mark.parametrize(("p", "target", "pld_entry", "basic_entry"), INVERSE_ORACLE)
def test_inverse_oracle(p, target, pld_entry, basic_entry):
    eps = entry_epsilon_for_record(target, p)
    digit = 10 ** (math.floor(math.log10(pld_entry)) - 1)
    assert eps == pytest.approx(pld_entry, abs=1.01 * digit)  # the published value, ± one in its last digit
    assert target / p == pytest.approx(basic_entry, abs=0.5 * 10 ** (math.floor(math.log10(basic_entry)) - 1))
    assert record_epsilon(eps, p).pld <= target  # never above the target ...
    assert record_epsilon(eps * (1 + 4 * SOLVE_RTOL), p).pld > target  # ... and within the tolerance of it


def test_one_release_is_its_own_epsilon():
    # a single pure ε-DP release at δ: ε + ln(1 − δ(1 + e^−ε)), a hair below ε
    for eps in (0.01, 0.5, 3.0):
        expected = eps + math.log1p(-1e-5 * (1 + math.exp(-eps)))
        assert record_epsilon(eps, 1).pld == pytest.approx(expected, rel=EXACT_RTOL)


def test_monotone_in_epsilon_and_p_and_below_basic():
    grid = np.geomspace(1e-3, 30, 25)
    for p in (1, 13, 30, 784):
        values = [record_epsilon(float(e), p).pld for e in grid]
        assert np.all(np.diff(values) > 0)
        assert all(v <= float(e) * p for v, e in zip(values, grid, strict=True))
    for eps in (0.01, 0.3, 2.0):
        values = [record_epsilon(eps, p).pld for p in range(1, 60)]
        assert np.all(np.diff(values) > 0)


def test_huge_epsilon_is_the_basic_bound_without_overflow():
    assert record_epsilon(1e6, 784).pld == record_epsilon(1e6, 784).basic == 784e6
    just_below = record_epsilon(PLD_MAX_EPSILON, 784)
    assert just_below.pld == pytest.approx(just_below.basic, rel=1e-12)
    assert compose([(1e6, 0.0), (0.1, 0.0)]).pld == pytest.approx(1e6 + record_epsilon(0.1, 1).pld)


def test_entry_delta_adds_to_the_record_delta():
    r = record_epsilon(0.1, 30, 1e-5, 1e-8)
    assert record_epsilon(0.1, 30).pld < r.pld < r.basic and r.basic_delta == pytest.approx(3e-7)
    assert record_epsilon(0.1, 30, 1e-5, 1e-6).pld == math.inf  # 30 entries' δ already exceed 1e-5
    with pytest.raises(ValueError, match="cannot be met at record_delta"):
        entry_epsilon_for_record(4.0, 30, 1e-5, 1e-6)


def test_compose_mixed_releases_within_its_grid_error():
    same = compose([(0.1, 0.0)] * 40)
    assert same.pld == record_epsilon(0.1, 40).pld
    nudged = compose([(0.1, 0.0)] * 39 + [(0.1 + 1e-12, 0.0)])  # a shared grid, not the exact path
    assert same.pld <= nudged.pld <= same.pld + nudged.basic / 1000
    mixed = compose([(0.1, 0.0)] * 20 + [(0.2, 0.0)] * 5)
    assert record_epsilon(0.1, 25).pld < mixed.pld < record_epsilon(0.2, 25).pld
    assert mixed.basic == pytest.approx(3.0) and compose([]).pld == 0.0


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan, "1"])
def test_bad_epsilon_is_refused(bad):
    with pytest.raises(ValueError, match="must be a finite number > 0"):
        record_epsilon(bad, 30)
    with pytest.raises(ValueError, match="record_epsilon must be a finite number > 0"):
        entry_epsilon_for_record(bad, 30)
