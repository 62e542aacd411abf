"""The audit of the release mechanism (kahm_dask.privacy.audit; the command: tests/system/test_cli_audit.py).

Every audit here runs at confidence 1 − 1e-6 (:data:`CONFIDENCE`): the one-run theorem with the
Bonferroni sweep makes a bound above the true ε happen with probability at most 1e-6 per
audit, so a test asserting "no violation" fails falsely with probability < 1e-6 (noise is from
OS entropy, there is no seed to fix). The assertions that a bound is *large* (≥ 0.8 ε, or a
violation for the halved noise) have a margin of more than 10 standard deviations of the
observed accuracy at these canary counts, far rarer still.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom, binomtest

from kahm_dask.privacy.audit import audit_mechanism, audit_release
from kahm_dask.privacy.audit.bounds import (
    MIN_GUESSES,
    atom_leaks,
    clopper_pearson_lower,
    guess_grid,
    one_run_epsilon,
    sweep_epsilon,
)
from kahm_dask.privacy.audit.canaries import canary_grid_points, log_likelihood_ratio, release_canaries
from kahm_dask.privacy.audit.scores import correct_among_most_confident
from kahm_dask.privacy.audit.training import audit_training, canary_rows
from kahm_dask.privacy.noise import GridLaplace

CONFIDENCE = 1 - 1e-6
CANARIES = 200_000


# ------------------------------------------------------------------ the audit of the real mechanism


@pytest.mark.parametrize("epsilon, delta", [(0.5, 0.0), (1.0, 0.0), (4.0, 0.0), (1.0, 1e-4)])
def test_the_real_mechanism_is_not_flagged_and_the_bound_is_close(epsilon, delta):
    result = audit_release(epsilon, delta=delta, canaries=CANARIES, confidence=CONFIDENCE)
    assert not result.violation and result.epsilon_lower <= epsilon
    assert result.epsilon_lower >= 0.8 * epsilon  # the attack is the optimal one: the bound is tight
    assert result.canaries == CANARIES and MIN_GUESSES <= result.guesses <= CANARIES


def test_halved_noise_is_flagged():
    """The control: noise of scale d/(2ε) (the mechanism of 2ε) audited against the claim ε."""
    result = audit_mechanism(GridLaplace(2.0, [0.0], [1.0]), 1.0, canaries=CANARIES, confidence=CONFIDENCE)
    assert result.violation and result.epsilon_lower > 1.5
    assert result.summary().startswith("VIOLATION: empirical ε ≥ ")


def test_bounds_and_d_are_those_of_the_audited_release():
    mech = GridLaplace(1.0, [-3.0], [3.0], d=1.5)
    q0, q1 = canary_grid_points(mech)
    assert (q0.tolist(), q1.tolist()) == ([0], [mech.resolution])
    result = audit_release(1.0, bounds=(-3.0, 3.0), d=1.5, canaries=CANARIES, confidence=CONFIDENCE)
    assert 0.8 <= result.epsilon_lower <= 1.0


def test_several_features_are_canaries_too():
    mech = GridLaplace(1.0, [0.0, 0.0, 0.0], [1.0, 2.0, 4.0])
    coins, v = release_canaries(mech, 10)
    assert coins.shape == v.shape == (4, 3)
    result = audit_mechanism(mech, 1.0, canaries=CANARIES, confidence=CONFIDENCE)
    assert 0.8 <= result.epsilon_lower <= 1.0


@pytest.mark.parametrize("kwargs, pattern", [
    ({"canaries": 0}, "canaries must be an integer >= 1"),
    ({"confidence": 1.0}, r"confidence must lie in \(0, 1\)"),
    ({"bounds": (1.0, 0.0)}, "upper must exceed lower"),
])
def test_bad_settings_are_refused_in_one_line(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        audit_release(1.0, **kwargs)


# ------------------------------------------------------------------ the score


@pytest.mark.parametrize("delta", [0.0, 0.01])
def test_the_llr_is_that_of_the_discrete_laplace_law(delta):
    mech = GridLaplace(1.0, [0.0], [1.0], delta=delta, resolution=8)
    q0, q1 = (int(q[0]) for q in canary_grid_points(mech))
    r = mech.ratio
    v = np.arange(-20, 30)

    def pmf(z):
        return (1 - delta) * (1 - r) / (1 + r) * r ** abs(z) + delta * (z == 0)

    expected = [math.log(pmf(x - q1)) - math.log(pmf(x - q0)) for x in v.tolist()]
    np.testing.assert_allclose(log_likelihood_ratio(mech, v[:, None])[:, 0], expected, rtol=1e-12, atol=1e-12)


def test_equal_llrs_tie_exactly_and_never_exceed_epsilon():
    mech = GridLaplace(1.0, [0.0], [1.0])
    v = np.arange(-3000, 4000)[:, None]
    llr = log_likelihood_ratio(mech, v)
    outside = (v <= 0) | (v >= mech.resolution)
    assert np.unique(np.abs(llr[outside])).size == 1
    assert np.abs(llr).max() <= mech.epsilon_used * mech.resolution / mech.sensitivity_steps


def test_right_guesses_are_counted_among_the_most_confident():
    llr = np.array([3.0, -3.0, 2.0, -1.0, 0.0, 0.5])  # LLR 0: never guessed on
    coins = np.array([True, True, True, False, True, True])
    assert correct_among_most_confident(llr, coins, np.array([6, 4, 2])).tolist() == [4, 3, 1]
    firsts = {int(correct_among_most_confident(llr, coins, np.array([1]))[0]) for _ in range(64)}
    assert firsts == {0, 1}  # the tie of |LLR| = 3 is broken at random (both orders in 64 tries: 1 − 2^-63)


# ------------------------------------------------------------------ the bounds' mathematics


@pytest.mark.parametrize("w, k", [(1, 1), (7, 10), (73, 100), (500, 1000), (999, 1000)])
def test_clopper_pearson_is_scipys_exact_interval_and_the_binomial_tail(w, k):
    lo = clopper_pearson_lower(w, k, 0.05)
    two_sided = binomtest(w, k).proportion_ci(confidence_level=0.90, method="exact").low
    assert lo == pytest.approx(two_sided, rel=1e-9)
    assert binom.sf(w - 1, k, lo) == pytest.approx(0.05, rel=1e-6)  # P[Bin(k, lo) ≥ w] = α


def test_clopper_pearson_is_monotone():
    by_w = [clopper_pearson_lower(w, 100, 0.05) for w in range(101)]
    assert by_w[0] == 0.0 and all(a < b for a, b in zip(by_w, by_w[1:], strict=False))
    by_alpha = [clopper_pearson_lower(60, 100, a) for a in (1e-6, 1e-3, 0.05, 0.3)]
    assert all(a < b for a, b in zip(by_alpha, by_alpha[1:], strict=False))
    by_k = [clopper_pearson_lower(60, k, 0.05) for k in (60, 80, 100, 200)]
    assert all(a > b for a, b in zip(by_k, by_k[1:], strict=False))


def test_one_run_epsilon_inverts_the_theorems_binomial_tail():
    """The largest ε with P[Bin(k, e^ε/(1+e^ε)) ≥ W] ≤ α, found by bisection."""
    w, k, alpha = 7300, 10_000, 0.01
    lo, hi = 0.0, 5.0
    for _ in range(100):
        mid = (lo + hi) / 2
        p = math.exp(mid) / (1 + math.exp(mid))
        lo, hi = (mid, hi) if binom.sf(w - 1, k, p) <= alpha else (lo, mid)
    assert one_run_epsilon(w, k, alpha) == pytest.approx(lo, abs=1e-9)
    assert one_run_epsilon(40, 100, 0.05) == 0.0  # worse than chance: nothing rejected


def test_the_sweep_is_bonferroni_over_the_grid_and_atoms_are_discounted():
    grid = guess_grid(10_000)
    assert grid[0] == 10_000 and grid[-1] >= MIN_GUESSES and np.all(np.diff(grid) < 0)
    correct = np.round(0.73 * grid).astype(int)
    eps, k = sweep_epsilon(correct, grid, 0.05, m=10_000)
    each = [one_run_epsilon(w, g, 0.05 / len(grid)) for w, g in zip(correct, grid, strict=True)]
    assert eps == pytest.approx(max(each))
    assert k == 10_000
    leaks = atom_leaks(10_000, 1e-3, 0.025)
    assert binom.cdf(leaks, 10_000, 1e-3) >= 0.975 > binom.cdf(leaks - 1, 10_000, 1e-3)
    eps_delta, _ = sweep_epsilon(correct, grid, 0.05, m=10_000, delta=1e-3)
    assert eps_delta == pytest.approx(one_run_epsilon(correct[0] - leaks, 10_000, 0.025 / len(grid)))


# ------------------------------------------------------------------ the end-to-end audit


def test_canary_rows_differ_in_one_entry_by_d_and_hold_public_values_only():
    lower, upper = np.zeros(5), np.full(5, 16.0)
    at_x, at_x_plus_d, feature, coins = canary_rows(300, lower, upper, np.full(5, 4.0), np.random.default_rng(0))
    diff = at_x_plus_d - at_x
    assert np.count_nonzero(diff, axis=1).tolist() == [1] * 300
    np.testing.assert_array_equal(diff[np.arange(300), feature], 4.0)
    assert at_x.min() >= 0.0 and at_x_plus_d.max() <= 16.0 and 0 < coins.sum() < 300


def test_a_dp_fit_is_audited_below_the_claim_and_the_entry_level_bound(digits):
    """Post-processing: the model's bound stays below the claim and the entry-level bound."""
    result = audit_training(digits.X_train[:500], digits.y_train[:500], 2.0, bounds=(0.0, 1.0), canaries=200,
                            confidence=CONFIDENCE, random_state=0)
    entry = audit_release(2.0, canaries=CANARIES, confidence=CONFIDENCE)
    assert not result.violation and result.epsilon_lower <= entry.epsilon_lower
    assert result.canaries == 200 and result.score == "model distance"


def test_the_audit_of_a_fit_needs_public_bounds(digits):
    with pytest.raises(ValueError, match="needs public bounds"):
        audit_training(digits.X_train[:100], digits.y_train[:100], 2.0, bounds=None)
