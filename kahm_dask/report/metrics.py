"""How close DP rows are to the private rows they were released from: pure functions on arrays.

Every score compares real rows ``R`` (N_r, p) with DP rows ``D`` (N_d, p) and has a fixed range
and goal, as SDMetrics' metrics do (their names are kept where the definition is the same). No
function here does I/O or plotting, and every randomness is seeded (the classifiers' splits and
row subsets are not private): the same arrays give the same scores.

* marginals: :func:`ks_complement` (continuous features), :func:`tv_complement` (discrete ones),
  chosen per feature by :func:`feature_kinds`;
* pairs: :func:`correlation_similarity`, :func:`correlation_attenuation`;
* ranges: :func:`boundary_adherence`;
* separability: :func:`detection_auc`;
* ML efficacy: :func:`efficacy`, e.g. train on synthetic, test on real (TSTR) beside train on real,
  test on real (TRTR).

All but :func:`dp_within_bounds` read the private rows: their results are for the data owner only.

Examples
--------
>>> rng = np.random.default_rng(0)
>>> real = rng.normal(size=(500, 3))
>>> float(ks_complement(real[:, 0], real[:, 0]))
1.0
>>> float(ks_complement(real[:, 0], real[:, 0] + 100.0))
0.0
>>> float(correlation_similarity(real, real))
1.0
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "DISCRETE_MAX_CATEGORIES",
    "feature_kinds",
    "ks_complement",
    "tv_complement",
    "marginal_similarity",
    "correlations",
    "correlation_similarity",
    "correlation_attenuation",
    "boundary_adherence",
    "dp_within_bounds",
    "detection_auc",
    "Efficacy",
    "efficacy",
]

#: A feature whose real rows take at most this many distinct values is discrete (TV complement).
DISCRETE_MAX_CATEGORIES = 10


def feature_kinds(real: np.ndarray, max_categories: int = DISCRETE_MAX_CATEGORIES) -> np.ndarray:
    """(p,) array of ``"discrete"`` (at most ``max_categories`` distinct real values) or ``"continuous"``."""
    distinct = np.array([np.unique(col).size for col in np.asarray(real).T])
    return np.where(distinct <= max_categories, "discrete", "continuous")


def ks_complement(real: np.ndarray, dp: np.ndarray) -> float:
    """1 − D, D = sup_x |F_R(x) − F_D(x)|, the two-sample Kolmogorov–Smirnov statistic of one
    feature's (N_r,) and (N_d,) values. Range [0, 1]: 1 the same empirical distribution, 0 disjoint."""
    real, dp = np.sort(np.ravel(real)), np.sort(np.ravel(dp))
    grid = np.concatenate([real, dp])
    f_real = np.searchsorted(real, grid, side="right") / real.size
    f_dp = np.searchsorted(dp, grid, side="right") / dp.size
    return float(1.0 - np.abs(f_real - f_dp).max())


def tv_complement(real: np.ndarray, dp: np.ndarray) -> float:
    """1 − ½ Σ_k |r_k − s_k| over the categories k of one discrete feature: r_k, s_k the shares of
    real and DP values in k. A DP value counts in the real category nearest to it (the noise moves
    values off the categories). Range [0, 1]: 1 the same shares, 0 no category in common."""
    categories = np.unique(real)
    r = np.searchsorted(categories, real)
    s = _nearest(categories, np.ravel(dp))
    k = categories.size
    shares_r = np.bincount(r, minlength=k) / r.size
    shares_s = np.bincount(s, minlength=k) / s.size
    return float(1.0 - 0.5 * np.abs(shares_r - shares_s).sum())


def _nearest(categories: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Index of the nearest of the sorted ``categories`` to each value."""
    right = np.clip(np.searchsorted(categories, values), 1, max(categories.size - 1, 1))
    left = right - 1
    if categories.size == 1:
        return np.zeros(values.size, dtype=np.intp)
    closer_left = np.abs(values - categories[left]) <= np.abs(values - categories[right])
    return np.where(closer_left, left, right)


def marginal_similarity(real: np.ndarray, dp: np.ndarray, kinds: np.ndarray | None = None) -> np.ndarray:
    """(p,) per-feature similarity of the marginals: :func:`ks_complement` for continuous features,
    :func:`tv_complement` for discrete ones (``kinds`` from :func:`feature_kinds` by default)."""
    kinds = feature_kinds(real) if kinds is None else kinds
    return np.array([(tv_complement if kind == "discrete" else ks_complement)(real[:, j], dp[:, j])
                     for j, kind in enumerate(kinds)])


def correlations(X: np.ndarray) -> np.ndarray:
    """(p, p) Pearson correlations of the columns of X; NaN in the rows and columns of a constant feature."""
    X = np.asarray(X, dtype=np.float64)
    centred = X - X.mean(axis=0)
    sd = np.sqrt((centred**2).mean(axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        z = centred / np.where(sd > 0, sd, np.nan)
    return (z.T @ z) / X.shape[0]


def _pairs(rho_real: np.ndarray, rho_dp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The upper-triangle pairs (i < j) where both correlations are defined."""
    i, j = np.triu_indices_from(rho_real, k=1)
    a, b = rho_real[i, j], rho_dp[i, j]
    ok = np.isfinite(a) & np.isfinite(b)
    return a[ok], b[ok]


def correlation_similarity(real: np.ndarray, dp: np.ndarray) -> float:
    """Mean over feature pairs i < j of 1 − |ρ_R(i, j) − ρ_D(i, j)| / 2 (Pearson ρ; pairs with a
    constant feature left out). Range [0, 1]: 1 the same correlations, 0 each one reversed from ±1.
    NaN when no pair is defined."""
    a, b = _pairs(correlations(real), correlations(dp))
    return float(np.mean(1.0 - np.abs(a - b) / 2.0)) if a.size else float("nan")


def correlation_attenuation(real: np.ndarray, dp: np.ndarray) -> float:
    """Σ ρ_R ρ_D / Σ ρ_R² over the defined pairs: the least-squares slope of the DP correlations on
    the real ones. Independent noise of variance σ² shrinks a correlation by about
    var(x)/(var(x) + σ²), so 1 is kept and below 1 attenuated by the noise. NaN when no pair is
    correlated."""
    a, b = _pairs(correlations(real), correlations(dp))
    denom = float(a @ a)
    return float(a @ b) / denom if denom > 0 else float("nan")


def boundary_adherence(real: np.ndarray, dp: np.ndarray) -> np.ndarray:
    """(p,) share of each feature's DP values within the real rows' [min, max] of the feature
    (SDMetrics' BoundaryAdherence). Range [0, 1]: 1 every DP value inside the real range."""
    low, high = real.min(axis=0), real.max(axis=0)
    return ((dp >= low) & (dp <= high)).mean(axis=0)


def dp_within_bounds(dp: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """(p,) share of each feature's DP values within the public bounds [lower, upper] (publishable:
    reads only the DP rows and the bounds). The noise is added after the clipping, so noisy rows
    leave the bounds; this says how often."""
    return ((dp >= lower) & (dp <= upper)).mean(axis=0)


def detection_auc(real: np.ndarray, dp: np.ndarray, *, max_rows: int = 2000, n_splits: int = 5,
                  seed: int = 0) -> float:
    """ROC AUC of a logistic regression that tells real rows from DP rows, out of fold.

    At most ``max_rows`` rows of each (a seeded subset, the same number of each); features
    standardised z and their squares z² (so that a wider spread, what zero-mean noise adds, is
    seen as well as a shift); ``n_splits``-fold stratified cross-validation (seeded); AUC of the
    pooled out-of-fold scores. Range [0, 1]: 0.5 best (the classifier cannot tell them apart), 1
    fully separable. For two samples of one distribution it is within a few
    √((n_r + n_d + 1) / (12 n_r n_d)) of 0.5 (the null spread of the Mann–Whitney statistic).
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer, StandardScaler

    rng = np.random.default_rng(seed)
    n = min(len(real), len(dp), max_rows)
    rows = np.vstack([real[rng.choice(len(real), n, replace=False)], dp[rng.choice(len(dp), n, replace=False)]])
    is_dp = np.repeat([0, 1], n)
    with_squares = FunctionTransformer(lambda z: np.hstack([z, z**2]))
    model = make_pipeline(StandardScaler(), with_squares, LogisticRegression(max_iter=1000))
    folds = StratifiedKFold(n_splits=n_splits, shuffle=True, random_state=seed)
    scores = cross_val_predict(model, rows, is_dp, cv=folds, method="decision_function")
    return float(roc_auc_score(is_dp, scores))


class Efficacy(NamedTuple):
    """One model trained on one set of rows, tested on the test rows.

    ``model``: its name; ``trained_on``: the name of the rows it was trained on;
    ``accuracy``: share of test rows predicted right; ``recall``: (C,) per class, in ``classes``'s order.
    """

    model: str
    trained_on: str
    accuracy: float
    recall: np.ndarray
    classes: np.ndarray


def efficacy(train_sets: dict, test_X: np.ndarray, test_y: np.ndarray, *, seed: int = 0) -> list[Efficacy]:
    """Each model trained on each set of rows, tested on the test rows: a KAHM
    (:class:`~kahm_dask.KAHMClassifier`, non-private: fitting on DP rows is post-processing) and a
    logistic regression. ``train_sets``: name → (X (N, p), y (N,)), e.g. the DP rows (train on
    synthetic, test on real: TSTR) and the real rows (TRTR). Rows model by model, sets in their
    order. ``seed`` fixes the KAHM's k-means (not private); the KAHM has its default settings,
    ``n_components`` capped at p."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import recall_score

    from kahm_dask.classifier import KAHMClassifier

    n_components = min(20, test_X.shape[1])  # the KAHM's default, capped at p
    models = {
        "KAHM": lambda: KAHMClassifier(n_components=n_components, random_state=seed),
        "LogisticRegression": lambda: LogisticRegression(max_iter=1000),
    }
    classes = np.unique(np.concatenate([np.asarray(y) for _, y in train_sets.values()] + [test_y]))
    out = []
    for name, make in models.items():
        for trained_on, (X, y) in train_sets.items():
            predicted = make().fit(X, y).predict(test_X)
            recall = recall_score(test_y, predicted, labels=classes, average=None, zero_division=0.0)
            out.append(Efficacy(name, trained_on, float(np.mean(predicted == test_y)), recall, classes))
    return out
