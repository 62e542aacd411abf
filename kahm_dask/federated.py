"""Federated KAHM classification by minimum distance (docs/federated.md).

Parties ("sites") q = 1..Q each fit their own (non-private or DP) :class:`KAHMClassifier`
on their own rows, for the classes they hold. To classify queries, every site answers with
two arrays only, its :class:`SiteAnswer` ``(ρ_q, ĉ_q)``:

    ρ_q(y) = min_{c ∈ C_q} Γ_{W_c^(q)}(y),     ĉ_q(y) = argmin_{c ∈ C_q} Γ_{W_c^(q)}(y),

and :func:`combine` takes ``q̂ = argmin_q ρ_q(y)`` (ties → lowest site index) and returns
``ĉ_q̂(y)``. Neither rows nor models cross the site boundary: a :class:`Site` keeps its
classifier private and exposes only :meth:`Site.answer`.

Membership evaluation is site-local too (:meth:`FederatedClassifier.membership_evaluation`):
site q's model is asked about site q's own training rows and the shared test rows only, and
only per-site summaries (:class:`FederatedMembership`) are combined.

For simulations, :func:`split_sites` cuts one labelled data set into sites (IID, one site per
class, label skew, Dirichlet) and :func:`fit_sites` fits one classifier per site.
:func:`site_seed` derives each site's ``random_state`` from one master seed: site q uses the
64-bit integer drawn from ``child(SeedSequence(seed), 3, q)``. That seed drives only what is
not private (the k-means steps); the DP noise of every site is drawn from the operating
system's secure generator (:mod:`kahm_dask.privacy.randomness`), never from a seed, so no two
sites (and no two fits) share noise. Tests that need reproducible noise set the estimator's
``insecure_noise_seed``; :func:`fit_sites` then gives site q its own
:func:`site_noise_seed` (stream 4), so even then no noise is reused across sites.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from sklearn.base import clone
from sklearn.utils.validation import check_is_fitted

from kahm_dask._random import RandomState, as_generator, as_seed_sequence, child_seed_sequence
from kahm_dask._validation import check_positive_float, check_positive_int
from kahm_dask.privacy.ledger import PrivacyLedger
from kahm_dask.privacy.membership import (
    MembershipAttack,
    MembershipInference,
    membership_evaluation,
)

__all__ = [
    "SiteAnswer",
    "FederatedDecision",
    "Site",
    "combine",
    "FederatedClassifier",
    "SPLITS",
    "MIN_ROWS_PER_CLASS",
    "split_sites",
    "site_label_counts",
    "label_heterogeneity",
    "site_seed",
    "site_noise_seed",
    "fit_sites",
    "FederatedMembership",
    "site_membership_evaluation",
    "membership_fields",
    "membership_summary",
]

#: Child stream of the master seed that seeds the sites' k-means (``random_state``).
SITE_STREAM = 3
#: Child stream of a test-only insecure noise seed that gives each site its own noise seed.
SITE_NOISE_STREAM = 4
SPLITS = ("iid", "per_class", "label_skew", "dirichlet")
#: A site's share of a class needs this many rows (a KAHM needs two samples).
MIN_ROWS_PER_CLASS = 2
#: Dirichlet proportions are redrawn at most this often when a site ends up empty.
MAX_DIRICHLET_DRAWS = 100


# ----------------------------------------------------------------------------------------------
# What crosses the boundary
# ----------------------------------------------------------------------------------------------


def _frozen_array(values: ArrayLike, dtype: Any = None) -> np.ndarray:
    """A read-only 1-D copy of ``values``."""
    arr = np.array(values, dtype=dtype, copy=True)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True)
class SiteAnswer:
    """One site's answer for m queries: the only thing a site releases.

    ``min_distance`` (m,) float64 is ρ_q ≥ 0 (+∞ allowed), ``label`` (m,) is ĉ_q, the
    site's class of minimum distance. Both are read-only copies.
    """

    min_distance: np.ndarray
    label: np.ndarray

    def __post_init__(self) -> None:
        dist = _frozen_array(self.min_distance, np.float64)
        label = _frozen_array(self.label)
        if dist.ndim != 1 or label.shape != dist.shape:
            raise ValueError(
                "a SiteAnswer needs min_distance and label of the same shape (m,), got "
                f"{dist.shape} and {label.shape}."
            )
        if np.isnan(dist).any() or (dist < 0).any():
            raise ValueError(
                "min_distance must hold distances >= 0 (+inf allowed), found NaN or negatives."
            )
        object.__setattr__(self, "min_distance", dist)
        object.__setattr__(self, "label", label)


@dataclass(frozen=True)
class FederatedDecision:
    """Global decision for m queries.

    ``label`` (m,) the global class ĉ_q̂, ``min_distance`` (m,) the global minimum distance
    min_q ρ_q, ``site`` (m,) int64 the winning site index q̂.
    """

    label: np.ndarray
    min_distance: np.ndarray
    site: np.ndarray


class Site:
    """One party: a fitted classifier behind the site boundary.

    ``model`` is a fitted classifier with ``classes_`` and ``class_distances(X) -> (m, C_q)``
    (a :class:`~kahm_dask.KAHMClassifier`, non-private or DP, on any subset of the classes).
    It is kept private; the only public method is :meth:`answer`.
    """

    __slots__ = ("_model",)

    def __init__(self, model: Any) -> None:
        if not callable(getattr(model, "class_distances", None)):
            raise TypeError(
                "a Site needs a classifier with a class_distances(X) -> (m, n_classes) method, "
                f"got {type(model).__name__}."
            )
        check_is_fitted(model)
        self._model = model

    def answer(self, X: ArrayLike) -> SiteAnswer:
        """``(ρ_q, ĉ_q)`` for the query rows X (m, p): min and argmin over this site's classes
        (ties → lowest class index, Definition 7)."""
        D = np.asarray(self._model.class_distances(X), dtype=np.float64)
        best = np.argmin(D, axis=1)
        return SiteAnswer(
            min_distance=D[np.arange(D.shape[0]), best], label=self._model.classes_[best]
        )


def combine(answers: Sequence[SiteAnswer]) -> FederatedDecision:
    """Minimum-distance combination: for every query the site with the smallest ρ_q wins
    (ties → lowest site index) and its ĉ_q is the global label.

    answers : Q ≥ 1 :class:`SiteAnswer` of the same m queries, in site order. Labels of all
    sites are stacked into one array, so they should share one type (all ints or all str).
    """
    if len(answers) == 0:
        raise ValueError("combine needs the answers of at least one site.")
    for q, a in enumerate(answers):
        if not isinstance(a, SiteAnswer):
            raise TypeError(f"answer {q} is a {type(a).__name__}, not a SiteAnswer.")
    sizes = {a.min_distance.shape[0] for a in answers}
    if len(sizes) > 1:
        raise ValueError(f"the sites answered different numbers of queries: {sorted(sizes)}.")
    dist = np.stack([a.min_distance for a in answers])  # (Q, m)
    site = np.argmin(dist, axis=0)  # first minimum = lowest site index
    rows = np.arange(dist.shape[1])
    labels = np.stack([a.label for a in answers])  # (Q, m)
    return FederatedDecision(label=labels[site, rows], min_distance=dist[site, rows], site=site)


class FederatedClassifier:
    """The global classifier over fitted :class:`Site` objects.

    Every prediction asks every site for its :class:`SiteAnswer` and passes only those to
    :func:`combine`. Membership is evaluated site by site (:meth:`membership_evaluation`).
    """

    def __init__(self, sites: Sequence[Site]) -> None:
        sites = tuple(sites)
        if not sites:
            raise ValueError("a FederatedClassifier needs at least one site.")
        for q, s in enumerate(sites):
            if not isinstance(s, Site):
                raise TypeError(
                    f"site {q} is a {type(s).__name__}; wrap each classifier in Site(...)."
                )
        self.sites = sites

    @property
    def n_sites(self) -> int:
        return len(self.sites)

    def answers(self, X: ArrayLike) -> list[SiteAnswer]:
        """Every site's answer for the query rows X (m, p), in site order."""
        return [s.answer(X) for s in self.sites]

    def decide(self, X: ArrayLike) -> FederatedDecision:
        """Global labels, minimum distances and winning sites for X (m, p)."""
        return combine(self.answers(X))

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Global class ĉ_q̂ (m,)."""
        return self.decide(X).label

    def min_distance(self, X: ArrayLike) -> np.ndarray:
        """Global minimum distance min_q ρ_q (m,) = min over all sites' class distances.

        X are queries, sent to every site: never a site's training rows (that would hand
        them to every other site; see :meth:`membership_evaluation`)."""
        return self.decide(X).min_distance

    def score(self, X: ArrayLike, y: ArrayLike) -> float:
        """Accuracy of :meth:`predict` on X (m, p) against y (m,)."""
        return float(np.mean(self.predict(X) == np.asarray(y)))

    def membership_evaluation(
        self,
        site_train: Sequence[ArrayLike],
        X_test: ArrayLike,
        *,
        max_train_rows: int | None = None,
        random_state: RandomState = 0,
        **lsdd_kwargs: Any,
    ) -> FederatedMembership:
        """Membership reports (mis, mis_norm; threshold attack) of every site, site-locally.

        ``site_train`` : one (n_q, p) array per site, in site order: the **original** training
        rows of that site. Site q's model is asked about its own rows and ``X_test`` (m, p),
        the shared evaluation queries, and nothing else (:func:`site_membership_evaluation`,
        which runs at the site); no site sees another site's training rows, and only the
        per-site summaries are combined. ``max_train_rows`` caps the rows used per site (a
        seeded subset); one ``random_state`` seeds every site's evaluation (it is public).
        """
        if isinstance(site_train, np.ndarray) or not isinstance(site_train, Sequence):
            raise TypeError(
                "membership_evaluation needs one array of training rows per site (each site "
                "evaluates its own model on its own rows only), got "
                f"{type(site_train).__name__}."
            )
        if len(site_train) != self.n_sites:
            raise ValueError(
                f"got training rows of {len(site_train)} site(s) for {self.n_sites} sites."
            )
        return FederatedMembership(tuple(
            site_membership_evaluation(site, rows, X_test, max_train_rows=max_train_rows,
                                       random_state=random_state, **lsdd_kwargs)
            for site, rows in zip(self.sites, site_train, strict=True)
        ))


# ----------------------------------------------------------------------------------------------
# Membership evaluation at each site
# ----------------------------------------------------------------------------------------------


class _AnswerDistances:
    """A site seen through its answers: ``class_distances(X)`` is ρ_q as one (m, 1) column."""

    __slots__ = ("_site",)

    def __init__(self, site: Site) -> None:
        self._site = site

    def class_distances(self, X: np.ndarray) -> np.ndarray:
        return self._site.answer(X).min_distance[:, None]


def site_membership_evaluation(
    site: Site,
    X_own: ArrayLike,
    X_test: ArrayLike,
    *,
    max_train_rows: int | None = None,
    random_state: RandomState = 0,
    **lsdd_kwargs: Any,
) -> tuple[MembershipInference, MembershipAttack]:
    """Membership reports of one site, computed **at that site** on the owner side.

    ``X_own`` (n_q, p): the site's own original training rows (members); ``X_test`` (m, p):
    the shared evaluation queries (non-members). The scores are the site's own answers ρ_q
    (its minimum class distance), as in
    :func:`~kahm_dask.privacy.membership.membership_evaluation` (same subset and seeds): for a
    single site holding every row, the results are the centralised ones. The member
    distances are computed on private rows: they stay at the site; the returned reports are
    a few scalars (not DP) that the site may choose to share.
    """
    if not isinstance(site, Site):
        raise TypeError(f"site must be a Site, got {type(site).__name__}.")
    return membership_evaluation(
        _AnswerDistances(site), X_own, X_test, max_train_rows=max_train_rows,
        random_state=random_state, **lsdd_kwargs,
    )


def membership_fields(inference: MembershipInference, attack: MembershipAttack) -> dict:
    """The report fields of one membership evaluation (flat dict of numbers).

    A true-positive rate at a false-positive rate f is reported only where the non-members can
    resolve it (f · n_nonmembers ≥ 1: at least one non-member may be misflagged); else None. With
    540 non-members the rate "at 0.1 % FPR" is the rate at 0 false positives, not at 0.1 %.
    """
    return {
        "mis": inference.mis,
        "mis_norm": inference.mis_norm,
        "median_distance": inference.median_distance,
        "n_train_used": inference.n_train_used,
        "n_infinite": inference.n_infinite,
        "attack_auc": attack.auc,
        "attack_advantage": attack.advantage,
        "attack_tpr_at_1pct_fpr": _resolved(attack.tpr_at_1pct_fpr, 0.01, attack.n_nonmembers),
        "attack_tpr_at_0_1pct_fpr": _resolved(attack.tpr_at_0_1pct_fpr, 0.001, attack.n_nonmembers),
    }


def _resolved(tpr: float, fpr: float, n_nonmembers: int) -> float | None:
    """``tpr`` if ``n_nonmembers`` non-members resolve a false-positive rate of ``fpr``, else None."""
    return tpr if fpr * n_nonmembers >= 1 else None


#: Summary fields of a federation: the largest value over the sites (the most exposed site).
_WORST_OVER_SITES = ("mis", "mis_norm", "attack_auc", "attack_advantage",
                     "attack_tpr_at_1pct_fpr", "attack_tpr_at_0_1pct_fpr")


@dataclass(frozen=True)
class FederatedMembership:
    """Per-site membership reports, combined from per-site summaries only.

    ``sites`` : one ``(MembershipInference, MembershipAttack)`` per site, each computed by the
    site on its own training rows against the shared test rows. There is no pooled attack
    over all sites' members: it would need every site's model queried with every site's
    rows. ``worst_site`` is the site of the largest attack AUC (its members are the easiest
    to tell from non-members); :attr:`inference` and :attr:`attack` are its reports.
    """

    sites: tuple[tuple[MembershipInference, MembershipAttack], ...]

    @property
    def worst_site(self) -> int:
        return int(np.argmax([attack.auc for _, attack in self.sites]))

    @property
    def inference(self) -> MembershipInference:
        return self.sites[self.worst_site][0]

    @property
    def attack(self) -> MembershipAttack:
        return self.sites[self.worst_site][1]

    def summary(self) -> dict:
        """Report fields, see :func:`membership_summary`."""
        return membership_summary([membership_fields(i, a) for i, a in self.sites])


def _largest(values) -> float | None:
    """The largest value, None where any site's value is None (not resolved)."""
    values = list(values)
    return None if any(v is None for v in values) else max(values)


def membership_summary(per_site: Sequence[dict]) -> dict:
    """Combine per-site report fields (:func:`membership_fields`, in site order) into the
    federation's: the largest value of each over the sites (``mis``, ``mis_norm``,
    ``attack_auc``, ``attack_advantage``, ``attack_tpr_at_*``: the most exposed site),
    ``attack_auc_mean`` (weighted by the members used), ``n_train_used`` and ``n_infinite``
    (summed), ``worst_site`` (largest attack AUC, lowest index on ties) and the per-site
    fields under ``sites``. Only these summaries are combined: no site's distances."""
    if not per_site:
        raise ValueError("membership_summary needs the summary of at least one site.")
    per_site = [{**fields, "site": q} for q, fields in enumerate(per_site)]
    used = np.array([s["n_train_used"] for s in per_site], dtype=np.float64)
    aucs = np.array([s["attack_auc"] for s in per_site], dtype=np.float64)
    return {
        **{name: _largest(s[name] for s in per_site) for name in _WORST_OVER_SITES},
        "attack_auc_mean": float(np.sum(aucs * used) / np.sum(used)),
        "n_train_used": int(used.sum()),
        "n_infinite": int(sum(s["n_infinite"] for s in per_site)),
        "worst_site": int(np.argmax(aucs)),
        "sites": per_site,
    }


# ----------------------------------------------------------------------------------------------
# Simulated splits
# ----------------------------------------------------------------------------------------------


def _iid(codes: np.ndarray, n_sites: int, rng: np.random.Generator, **_: Any) -> np.ndarray:
    """Rows dealt at random into ``n_sites`` sites of equal size (±1)."""
    site_of = np.empty(codes.size, dtype=np.int64)
    site_of[rng.permutation(codes.size)] = np.arange(codes.size) % n_sites
    return site_of


def _per_class(codes: np.ndarray, n_sites: int, rng: np.random.Generator, **_: Any) -> np.ndarray:
    """Site q holds exactly the q-th class (in sorted label order)."""
    n_classes = int(codes.max()) + 1
    if n_sites != n_classes:
        raise ValueError(
            f"split 'per_class' needs one site per class: n_sites = {n_classes}, got {n_sites}."
        )
    return codes.astype(np.int64, copy=True)


def _deal_evenly(rows: np.ndarray, holders: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Site of each of ``rows`` when they are shuffled and dealt evenly to ``holders``."""
    out = np.empty(rows.size, dtype=np.int64)
    out[rng.permutation(rows.size)] = holders[np.arange(rows.size) % holders.size]
    return out


def _label_skew_holders(
    n_classes: int, n_sites: int, k: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Classes of each site: a random permutation of all classes dealt round-robin (every
    class is held), then each site filled up to ``k`` distinct random classes."""
    perm = rng.permutation(n_classes)
    holders = []
    for q in range(n_sites):
        own = perm[q::n_sites]
        rest = np.setdiff1d(np.arange(n_classes), own)
        extra = rng.choice(rest, k - own.size, replace=False)
        holders.append(np.sort(np.concatenate([own, extra])))
    return holders


def _label_skew(
    codes: np.ndarray, n_sites: int, rng: np.random.Generator, *, classes_per_site: int, **_: Any
) -> np.ndarray:
    """Each site holds ``classes_per_site`` random classes; a class's rows are split evenly
    among the sites holding it."""
    n_classes = int(codes.max()) + 1
    if classes_per_site > n_classes:
        raise ValueError(
            f"classes_per_site ({classes_per_site}) exceeds the number of classes ({n_classes})."
        )
    if n_sites * classes_per_site < n_classes:
        raise ValueError(
            f"label_skew with {n_sites} sites × {classes_per_site} classes per site cannot cover "
            f"all {n_classes} classes; need n_sites · classes_per_site >= {n_classes}."
        )
    site_classes = _label_skew_holders(n_classes, n_sites, classes_per_site, rng)
    site_of = np.empty(codes.size, dtype=np.int64)
    for c in range(n_classes):
        rows = np.flatnonzero(codes == c)
        holders = np.array([q for q in range(n_sites) if c in site_classes[q]])
        site_of[rows] = _deal_evenly(rows, holders, rng)
    return site_of


def _dirichlet(
    codes: np.ndarray, n_sites: int, rng: np.random.Generator, *, alpha: float, **_: Any
) -> np.ndarray:
    """Per class, site shares ~ Dirichlet(α·1_Q) of the class's shuffled rows."""
    site_of = np.empty(codes.size, dtype=np.int64)
    for c in range(int(codes.max()) + 1):
        rows = rng.permutation(np.flatnonzero(codes == c))
        shares = rng.dirichlet(np.full(n_sites, alpha))
        cuts = (np.cumsum(shares) * rows.size).astype(np.int64)[:-1]
        for q, part in enumerate(np.split(rows, cuts)):
            site_of[part] = q
    return site_of


_OPTION_OF = {"classes_per_site": "label_skew", "alpha": "dirichlet"}
_BUILDERS: dict[str, Callable[..., np.ndarray]] = {
    "iid": _iid,
    "per_class": _per_class,
    "label_skew": _label_skew,
    "dirichlet": _dirichlet,
}


def _merge_small_shares(codes: np.ndarray, site_of: np.ndarray, n_sites: int) -> np.ndarray:
    """Move every share of fewer than :data:`MIN_ROWS_PER_CLASS` rows of a class to the site
    holding the most rows of that class (ties → lowest index); returns a new assignment."""
    site_of = site_of.copy()
    for c in range(int(codes.max()) + 1):
        rows = codes == c
        counts = np.bincount(site_of[rows], minlength=n_sites)
        target = int(np.argmax(counts))
        small = np.flatnonzero((counts > 0) & (counts < MIN_ROWS_PER_CLASS))
        site_of[rows & np.isin(site_of, small[small != target])] = target
    return site_of


def _empty_sites(site_of: np.ndarray, n_sites: int) -> np.ndarray:
    return np.flatnonzero(np.bincount(site_of, minlength=n_sites) == 0)


def _check_split_options(scheme: str, classes_per_site: Any, alpha: Any) -> dict[str, Any]:
    """Keyword options of ``scheme``; the option of another scheme must be None."""
    if scheme not in SPLITS:
        raise ValueError(f"scheme must be one of {SPLITS}, got {scheme!r}.")
    given = {"classes_per_site": classes_per_site, "alpha": alpha}
    for name, owner in _OPTION_OF.items():
        if scheme != owner and given[name] is not None:
            raise ValueError(f"{name} is only used by the split {owner!r}, not by {scheme!r}.")
    if scheme == "label_skew":
        if classes_per_site is None:
            raise ValueError("split 'label_skew' needs classes_per_site.")
        return {"classes_per_site": check_positive_int(classes_per_site, "classes_per_site")}
    if scheme == "dirichlet":
        if alpha is None:
            raise ValueError("split 'dirichlet' needs alpha.")
        return {"alpha": check_positive_float(alpha, "alpha")}
    return {}


def split_sites(
    y: ArrayLike,
    n_sites: int,
    scheme: str,
    *,
    classes_per_site: int | None = None,
    alpha: float | None = None,
    random_state: RandomState = None,
) -> list[np.ndarray]:
    """Simulated federation: row indices of each of ``n_sites`` sites.

    y : (N,) labels. Returns ``n_sites`` sorted int64 index arrays, disjoint, covering all rows.

    * ``"iid"``: rows dealt at random, equal sizes (±1);
    * ``"per_class"``: site q holds the q-th class of ``np.unique(y)``; needs
      ``n_sites`` = number of classes (GIKM's MNIST setting);
    * ``"label_skew"``: each site holds ``classes_per_site`` random classes, every class is
      held by at least one site (so ``n_sites · classes_per_site`` ≥ #classes), and a class's
      rows are split evenly among the sites holding it;
    * ``"dirichlet"``: per class, the site shares are Dirichlet(``alpha``) (smaller α = more
      skew).

    Validation, the same for every scheme: every class needs ≥ 2 rows (else ``ValueError``).
    A site's share of a class with fewer than :data:`MIN_ROWS_PER_CLASS` = 2 rows (a KAHM
    cannot be fitted to one sample) is **merged** into the site holding most rows of that
    class. A site left without rows raises ``ValueError`` — except for ``"dirichlet"``, whose
    proportions are redrawn (up to :data:`MAX_DIRICHLET_DRAWS` times, then ``ValueError``).
    Seeded by ``random_state``.
    """
    y = np.asarray(y)
    if y.ndim != 1 or y.size == 0:
        raise ValueError(f"y must be a non-empty 1-D array of labels, got shape {y.shape}.")
    n_sites = check_positive_int(n_sites, "n_sites")
    options = _check_split_options(scheme, classes_per_site, alpha)
    classes, codes = np.unique(y, return_inverse=True)
    counts = np.bincount(codes)
    if counts.min() < MIN_ROWS_PER_CLASS:
        few = classes[counts < MIN_ROWS_PER_CLASS].tolist()
        raise ValueError(f"class(es) {few} have fewer than {MIN_ROWS_PER_CLASS} rows.")
    rng = as_generator(random_state)
    draws = MAX_DIRICHLET_DRAWS if scheme == "dirichlet" else 1
    for _ in range(draws):
        site_of = _BUILDERS[scheme](codes, n_sites, rng, **options)
        site_of = _merge_small_shares(codes, site_of, n_sites)
        empty = _empty_sites(site_of, n_sites)
        if empty.size == 0:
            return [np.flatnonzero(site_of == q) for q in range(n_sites)]
    hint = f" in {draws} Dirichlet draws; use a larger alpha or" if draws > 1 else "; use"
    raise ValueError(
        f"split {scheme!r} of {y.size} rows leaves site(s) {empty.tolist()} without rows after "
        f"merging class shares of fewer than {MIN_ROWS_PER_CLASS} rows{hint} fewer sites."
    )


def site_label_counts(y: ArrayLike, sites: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Rows per (site, class): counts (Q, C) int64 and the classes (C,) = ``np.unique(y)``."""
    classes, codes = np.unique(np.asarray(y), return_inverse=True)
    counts = np.stack([np.bincount(codes[rows], minlength=classes.size) for rows in sites])
    return counts, classes


def label_heterogeneity(y: ArrayLike, sites: Sequence[np.ndarray]) -> float:
    """Non-IID-ness of a split: mean over sites of the total-variation distance between the
    site's label distribution and the pooled one, in [0, 1) (0 = every site has the pooled
    class proportions; per_class splits of C balanced classes give about 1 − 1/C)."""
    counts, _ = site_label_counts(y, sites)
    pooled = counts.sum(axis=0) / counts.sum()
    local = counts / counts.sum(axis=1, keepdims=True)
    return float(np.mean(0.5 * np.abs(local - pooled).sum(axis=1)))


# ----------------------------------------------------------------------------------------------
# Fitting sites
# ----------------------------------------------------------------------------------------------


def _check_site_index(q: Any) -> int:
    if isinstance(q, bool) or not isinstance(q, numbers.Integral) or q < 0:
        raise ValueError(f"site index must be an int >= 0, got {q!r}.")
    return int(q)


def site_seed(random_state: RandomState, q: int) -> int:
    """Seed (int in [0, 2**64)) of site q derived from the master seed: the 64-bit integer
    drawn from ``child(SeedSequence(random_state), 3, q)``.

    It becomes site q's ``random_state``, which seeds only the k-means steps (not private).
    It does not determine any DP noise: a site's noise comes from the secure source.
    """
    seq = child_seed_sequence(as_seed_sequence(random_state), SITE_STREAM, _check_site_index(q))
    return int(seq.generate_state(1, dtype=np.uint64)[0])


def site_noise_seed(insecure_noise_seed: int, q: int) -> int:
    """Site q's own test-only noise seed derived from ``insecure_noise_seed``: the 63-bit
    integer drawn from ``child(SeedSequence(insecure_noise_seed), 4, q)``.

    Only for tests that replay one federation's noise in two code paths (in memory and the
    Dask pipeline): a seeded noise source voids the guarantee. Distinct per site, so two
    sites never add the same noise even then.
    """
    seq = child_seed_sequence(
        as_seed_sequence(insecure_noise_seed), SITE_NOISE_STREAM, _check_site_index(q)
    )
    return int(seq.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def fit_sites(
    estimator: Any,
    X: ArrayLike,
    y: ArrayLike,
    sites: Sequence[np.ndarray],
    *,
    partitions: Sequence[np.ndarray | None] | None = None,
    ledgers: Sequence[Any] | None = None,
) -> list[Site]:
    """Fit one clone of ``estimator`` per site on its rows and wrap it in a :class:`Site`.

    X : (N, p), y : (N,), sites : row indices per site (e.g. from :func:`split_sites`).
    Site q's clone gets ``random_state = site_seed(estimator.random_state, q)`` (k-means
    only). A DP site's noise comes from the secure source, fresh for every site; with the
    test-only ``insecure_noise_seed`` set, site q gets ``site_noise_seed(seed, q)``.
    partitions : optional per-site (N_q,) branch labels passed as ``fit(..., partition=)``
    (they replace every k-means step).
    ledgers : optional per-site ledgers (a :class:`~kahm_dask.privacy.ledger.PrivacyLedger`, a
    ledger directory or "auto"): each site accounts for its own rows. With the estimator's
    ``ledger="auto"`` (the default) or a directory, every site finds its own data set's ledger
    by its rows' fingerprint; a ``PrivacyLedger`` object on the estimator is refused (it is one
    data set's, and the sites would share it).
    """
    X, y = np.asarray(X), np.asarray(y)
    if partitions is not None and len(partitions) != len(sites):
        raise ValueError(f"got {len(partitions)} partitions for {len(sites)} sites.")
    if ledgers is not None and len(ledgers) != len(sites):
        raise ValueError(f"got {len(ledgers)} ledgers for {len(sites)} sites.")
    params = estimator.get_params(deep=False)
    if ledgers is None and isinstance(params.get("ledger"), PrivacyLedger):
        raise ValueError(
            "each site keeps its own privacy ledger: pass ledgers=[...] (one per site) to "
            "fit_sites, or ledger='auto' (each site's own, by its rows), instead of one ledger on the estimator."
        )
    noise_seed = params.get("insecure_noise_seed")
    out = []
    for q, rows in enumerate(sites):
        own = {"random_state": site_seed(estimator.random_state, q)}
        if noise_seed is not None:
            own["insecure_noise_seed"] = site_noise_seed(noise_seed, q)
        if ledgers is not None:
            own["ledger"] = ledgers[q]
        model = clone(estimator).set_params(**own)
        part = None if partitions is None else partitions[q]
        out.append(Site(model.fit(X[rows], y[rows], partition=part)))
    return out
