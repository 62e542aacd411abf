"""Lower bounds on ε from guesses: Clopper–Pearson limits, the one-run theorem, the sweep over k.

An auditor guesses the coin of ``k`` canaries (abstaining on the rest) and gets ``W`` right.

* **One run** (Steinke, Nasr & Jagielski 2023, "Privacy auditing with one (1) training run",
  Theorem 3.1, pure ε-DP with abstentions): whatever rule picks the ``k`` guesses after seeing
  the output, ``P[W ≥ v] ≤ P[Binomial(k, p(ε)) ≥ v]`` with ``p(ε) = e^ε / (1 + e^ε)``. So ε is
  rejected at level α when ``P[Binomial(k, p(ε)) ≥ W] ≤ α``, and the smallest ε not rejected is
  ``logit(p_lo)`` where ``p_lo`` is the one-sided Clopper–Pearson lower limit of ``W`` in ``k``
  (``P[Binomial(k, p_lo) ≥ W] = α``, the ``α`` quantile of Beta(W, k − W + 1)). The theorem is
  what makes the limit valid although the canaries guessed on are chosen from the output.
* **The sweep over k**: the auditor tries every ``k`` of a fixed grid (:func:`guess_grid`) and
  keeps the largest bound; each ``k`` is tested at ``α / len(grid)`` (Bonferroni), so the
  largest is wrong with probability at most α.
* **δ > 0**: the mechanism sets a canary's noise to 0 with probability δ, independently of
  the coin (the atom), and is pure ε-DP on the other canaries. At most ``ℓ`` canaries get the
  atom, except with probability ``α/2`` (``ℓ`` the ``1 − α/2`` quantile of Binomial(m, δ)); a
  guess on one of them is counted as right, so ``W − ℓ`` right guesses are left to the pure
  theorem, at ``α/2``.

Examples
--------
>>> round(clopper_pearson_lower(73, 100, 0.05), 4)
0.6474
>>> round(one_run_epsilon(730, 1000, 0.05), 3)
0.876
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import beta, binom

__all__ = ["clopper_pearson_lower", "logit", "one_run_epsilon", "guess_grid", "atom_leaks", "sweep_epsilon",
           "MIN_GUESSES"]

#: The smallest number of guesses the sweep tries.
MIN_GUESSES = 16


def clopper_pearson_lower(successes: int, trials: int, alpha: float) -> float:
    """The one-sided ``1 − α`` Clopper–Pearson lower limit of a binomial proportion: the ``p``
    with ``P[Binomial(trials, p) ≥ successes] = α`` (0 when ``successes = 0``)."""
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must lie in [0, trials], got {successes} of {trials}.")
    if successes == 0:
        return 0.0
    return float(beta.ppf(alpha, successes, trials - successes + 1))


def logit(p: float) -> float:
    """``ln(p / (1 − p))``: the ε whose ``p(ε) = e^ε / (1 + e^ε)`` is p (−inf at 0, inf at 1)."""
    if p <= 0.0:
        return -math.inf
    return math.inf if p >= 1.0 else math.log(p) - math.log1p(-p)


def one_run_epsilon(correct: int, guesses: int, alpha: float) -> float:
    """The ε lower bound, at confidence ``1 − α``, of ``correct`` right guesses out of
    ``guesses`` on a pure ε-DP mechanism (one run, module docstring); 0 when no ε > 0 is
    rejected."""
    return max(0.0, logit(clopper_pearson_lower(correct, guesses, alpha)))


def guess_grid(m: int) -> np.ndarray:
    """The numbers of guesses tried on m canaries: m, m/√2, m/2, … down to :data:`MIN_GUESSES`
    (rounded, distinct, descending)."""
    ks = {m}
    k = float(m)
    while k / math.sqrt(2.0) >= MIN_GUESSES:
        k /= math.sqrt(2.0)
        ks.add(round(k))
    return np.array(sorted(ks, reverse=True), dtype=np.int64)


def atom_leaks(m: int, delta: float, alpha: float) -> int:
    """``ℓ``: the number of the m canaries that get the atom (probability δ each) is at most
    ``ℓ`` except with probability α (0 when δ = 0)."""
    return 0 if delta == 0.0 else int(binom.ppf(1.0 - alpha, m, delta))


def sweep_epsilon(correct_by_k: np.ndarray, grid: np.ndarray, alpha: float, *, m: int,
                  delta: float = 0.0) -> tuple[float, int]:
    """The largest one-run bound over the grid (Bonferroni over its ``len(grid)`` values,
    δ > 0 as in the module docstring) and the k that gave it: ``(ε_lower, k)``.

    ``correct_by_k[i]``: right guesses among the ``grid[i]`` most confident canaries.
    """
    alpha_guess = alpha if delta == 0.0 else alpha / 2.0
    leaks = atom_leaks(m, delta, alpha / 2.0)
    each = alpha_guess / len(grid)
    best, best_k = 0.0, int(grid[0])
    for k, w in zip(grid.tolist(), np.asarray(correct_by_k).tolist(), strict=True):
        eps = one_run_epsilon(max(0, int(w) - leaks), int(k), each)
        if eps > best:
            best, best_k = eps, int(k)
    return best, best_k
