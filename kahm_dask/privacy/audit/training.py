"""The end-to-end audit: canary rows trained on with the real DP fit, scored by the model.

Canary rows are added to a copy of the training rows. Each canary row is made of public
values only (uniform in the public bounds, a class drawn at random), so no private row is
released twice; one entry of it, a feature drawn at random, is at ``lower`` or at
``lower + d`` by a fair coin. :class:`~kahm_dask.KAHMClassifier` then fits the copy with the
given ε: the same release (its ledger spends ε once, on the data set's ledger the caller
passes), smoother and class models as any fit. Each canary is scored by how much nearer the
model of its class is to the row at ``x + d`` than to the row at ``x``:

    s = Γ_c(row with x) − Γ_c(row with x + d),   c the canary's class,

and the guesses and the bound are those of the entry-level audit (:mod:`.scores`,
:mod:`.bounds`). The model is post-processing of the release, so this bound can only stay
below the entry-level one: a bound above the claim here too is a violation.
"""

from __future__ import annotations

import numpy as np

from kahm_dask._validation import check_positive_int, check_probability
from kahm_dask.privacy.audit.bounds import guess_grid, sweep_epsilon
from kahm_dask.privacy.audit.scores import correct_among_most_confident, roc_summary
from kahm_dask.privacy.bounds import public_bounds

__all__ = ["canary_rows", "audit_training", "DEFAULT_CANARY_ROWS"]

#: Canary rows of ``kahm-dask audit --store``.
DEFAULT_CANARY_ROWS = 1000


def canary_rows(m: int, lower: np.ndarray, upper: np.ndarray, d: np.ndarray,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``m`` canary rows of public values → ``(at_x, at_x_plus_d, feature, coins)``.

    ``at_x`` and ``at_x_plus_d`` (m, p) differ in entry ``feature[i]`` of row i only: ``lower``
    there, and ``lower + d`` clipped to ``upper``; ``coins`` (m,) bool says which one is trained on.
    """
    p = lower.shape[0]
    at_x = rng.uniform(lower, upper, size=(m, p))
    feature = rng.integers(0, p, size=m)
    rows = np.arange(m)
    at_x[rows, feature] = lower[feature]
    at_x_plus_d = at_x.copy()
    at_x_plus_d[rows, feature] = np.minimum(lower + d, upper)[feature]
    return at_x, at_x_plus_d, feature, rng.random(m) < 0.5


def audit_training(X: np.ndarray, y: np.ndarray, epsilon: float, *, bounds, delta: float = 0.0, d=None,
                   canaries: int = DEFAULT_CANARY_ROWS, confidence: float = 0.95, ledger="auto",
                   random_state=None, **params):
    """Audit a DP ``KAHMClassifier`` fit of X (N, p), y (N,) plus ``canaries`` canary rows
    (module docstring) against ``epsilon`` → :class:`~kahm_dask.privacy.audit.AuditResult`.

    ``bounds``: the public bounds (required: bounds from the rows would be no audit of a DP fit);
    ``ledger``: the data set's ledger, which pays for the release (the copy's rows hold X);
    ``params``: other parameters of the estimator.
    """
    from kahm_dask.classifier import KAHMClassifier
    from kahm_dask.privacy.audit import AuditResult

    check_positive_int(canaries, "canaries")
    check_probability(confidence, "confidence")
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y)
    if bounds is None:
        raise ValueError("the audit of a training needs public bounds (--bounds LOW HIGH, or a store that records "
                         "its public feature range).")
    lower, upper = public_bounds(bounds, X.shape[1])
    width = upper - lower
    d_entry = width if d is None else np.broadcast_to(np.asarray(d, dtype=np.float64), width.shape)
    rng = np.random.default_rng()
    at_x, at_x_plus_d, _, coins = canary_rows(canaries, lower, upper, d_entry, rng)
    classes = np.unique(y)
    canary_class = rng.integers(0, classes.size, size=canaries)
    trained = np.where(coins[:, None], at_x_plus_d, at_x)
    clf = KAHMClassifier(epsilon=epsilon, delta=delta, d=d, bounds=(lower, upper), ledger=ledger,
                         random_state=random_state, **params)
    clf.fit(np.vstack([X, trained]), np.concatenate([y, classes[canary_class]]))
    distances = clf.class_distances(np.vstack([at_x, at_x_plus_d]))
    column = np.searchsorted(clf.classes_, classes[canary_class])
    rows = np.arange(canaries)
    score = distances[rows, column] - distances[canaries + rows, column]
    grid = guess_grid(canaries)
    correct = correct_among_most_confident(score, coins, grid)
    bound, k = sweep_epsilon(correct, grid, 1.0 - confidence, m=canaries, delta=delta)
    auc, tpr = roc_summary(score, coins)
    return AuditResult(float(epsilon), bound, float(confidence), k, canaries, auc, tpr, "model distance")
