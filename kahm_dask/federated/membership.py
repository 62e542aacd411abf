"""Membership evaluation at each site: site q's model is asked about site q's own training rows
and the shared test rows only, and only per-site summaries are combined (docs/federated.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from kahm_dask._random import RandomState
from kahm_dask.federated.protocol import Site
from kahm_dask.privacy.membership import MembershipAttack, MembershipInference, membership_evaluation

__all__ = ["site_membership_evaluation", "membership_fields", "FederatedMembership", "membership_summary"]


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
