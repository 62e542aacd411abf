"""The global classifier over fitted sites: every prediction asks each site for its answer and
combines the answers only (docs/federated.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from kahm_dask._random import RandomState
from kahm_dask.federated.membership import FederatedMembership, site_membership_evaluation
from kahm_dask.federated.protocol import FederatedDecision, Site, SiteAnswer, combine

__all__ = ["FederatedClassifier"]


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
