"""An empirical lower bound on the ε of the release mechanism, on the user's own machine.

:func:`audit_mechanism` releases ``m`` canary entries through a
:class:`~kahm_dask.privacy.noise.GridLaplace` (:mod:`.canaries`), scores each with the
optimal log-likelihood ratio, guesses the coin of the k most confident for every k of a grid
(:mod:`.scores`), and turns the right guesses into a lower bound on ε that holds with
probability ``confidence`` (:mod:`.bounds`: the one-run theorem of Steinke, Nasr & Jagielski
2023, Bonferroni over the grid). A bound above the claimed ε is a violation: the mechanism
leaks more than it claims. A bound below it does not prove the claim (no finite experiment
does); it shows that this attack, the strongest on one entry, finds no more than the claim.
:func:`~kahm_dask.privacy.audit.training.audit_training` audits a whole DP fit the same way.

:func:`audit_release` audits the mechanism a DP fit with these settings uses (``kahm-dask
audit``).

Examples
--------
>>> result = audit_release(1.0, canaries=200_000, confidence=1 - 1e-9)  # wrong w.p. ≤ 1e-9
>>> 0.5 < result.epsilon_lower <= 1.0, result.violation
(True, False)
"""

from __future__ import annotations

from dataclasses import dataclass

from kahm_dask._validation import check_positive_int, check_probability
from kahm_dask.privacy.audit.bounds import guess_grid, sweep_epsilon
from kahm_dask.privacy.audit.canaries import log_likelihood_ratio, release_canaries
from kahm_dask.privacy.audit.scores import correct_among_most_confident, roc_summary
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import NoiseSource

__all__ = ["AuditResult", "audit_mechanism", "audit_release", "DEFAULT_CANARIES", "DEFAULT_CONFIDENCE"]

#: Canaries of ``kahm-dask audit``: about 1 s at ε = 1, a bound within a few % of ε.
DEFAULT_CANARIES = 1_000_000
DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True)
class AuditResult:
    """One audit: the ``claimed`` ε, the lower bound ``epsilon_lower`` (at ``confidence``), the
    number of guesses ``guesses`` that gave it, the ``canaries`` released, the ``auc`` and
    ``tpr_at_1pct_fpr`` of the auditor's score, named ``score`` (the LLR of the released entry,
    or the trained model's distances: :mod:`.training`)."""

    claimed: float
    epsilon_lower: float
    confidence: float
    guesses: int
    canaries: int
    auc: float
    tpr_at_1pct_fpr: float
    score: str = "LLR"

    @property
    def violation(self) -> bool:
        """The bound exceeds the claim: the mechanism is not ε-DP as claimed."""
        return self.epsilon_lower > self.claimed

    def summary(self) -> str:
        """The result in one line (``kahm-dask audit`` prints it)."""
        flag = "VIOLATION: " if self.violation else ""
        return (f"{flag}empirical ε ≥ {self.epsilon_lower:.3f} ({100 * self.confidence:g} %) against the claimed "
                f"{self.claimed:g}; {self.score} score: AUC {self.auc:.3f}, TPR at 1 % FPR {self.tpr_at_1pct_fpr:.3f} "
                f"({self.canaries} canaries, bound from the {self.guesses} most confident)")


def audit_mechanism(mechanism: GridLaplace, claimed: float, *, canaries: int = DEFAULT_CANARIES,
                    confidence: float = DEFAULT_CONFIDENCE, source: NoiseSource | None = None) -> AuditResult:
    """Audit ``mechanism`` against the ``claimed`` ε (module docstring).

    The claim is separate from the mechanism so that a test can audit a wrong mechanism (e.g.
    its noise halved: ``GridLaplace(2ε, …)``) against ε. ``source``: the noise source of the
    release (OS entropy when None).
    """
    check_positive_int(canaries, "canaries")
    check_probability(confidence, "confidence")
    coins, v = release_canaries(mechanism, canaries, source)
    llr = log_likelihood_ratio(mechanism, v)
    grid = guess_grid(coins.size)
    correct = correct_among_most_confident(llr, coins, grid)
    bound, k = sweep_epsilon(correct, grid, 1.0 - confidence, m=coins.size, delta=mechanism.delta)
    auc, tpr = roc_summary(llr, coins)
    return AuditResult(float(claimed), bound, float(confidence), k, int(coins.size), auc, tpr)


def audit_release(epsilon: float, *, delta: float = 0.0, d=None, bounds=(0.0, 1.0),
                  canaries: int = DEFAULT_CANARIES, confidence: float = DEFAULT_CONFIDENCE) -> AuditResult:
    """Audit the release mechanism of a fit with ``epsilon``, ``delta``, ``d`` and public
    ``bounds`` (one feature: entries are noised independently) against ``epsilon``."""
    lower, upper = bounds
    return audit_mechanism(GridLaplace(epsilon, [lower], [upper], delta=delta, d=d), epsilon,
                           canaries=canaries, confidence=confidence)
