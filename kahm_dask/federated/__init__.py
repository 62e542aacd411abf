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
class, label skew, Dirichlet) and :func:`fit_sites` fits one classifier per site. A site may
hold one class: a classifier refuses training rows of one class unless fitted as a site's, by
:func:`fit_sites` or inside ``with site_fit():``.
:func:`site_seed` derives each site's ``random_state`` from one master seed: site q uses the
64-bit integer drawn from ``child(SeedSequence(seed), 3, q)``. That seed drives only what is
not private (the k-means steps); the DP noise of every site is drawn from the operating
system's secure generator (:mod:`kahm_dask.privacy.randomness`), never from a seed, so no two
sites (and no two fits) share noise. Tests that need reproducible noise set the estimator's
``insecure_noise_seed``; :func:`fit_sites` then gives site q its own
:func:`site_noise_seed` (stream 4), so even then no noise is reused across sites.
"""

from kahm_dask._validation import site_fit
from kahm_dask.federated.classifier import FederatedClassifier
from kahm_dask.federated.membership import (
    FederatedMembership,
    membership_fields,
    membership_summary,
    site_membership_evaluation,
)
from kahm_dask.federated.protocol import FederatedDecision, Site, SiteAnswer, combine, site_answer
from kahm_dask.federated.sites import fit_sites, site_noise_seed, site_seed
from kahm_dask.federated.splits import MIN_ROWS_PER_CLASS, SPLITS, label_heterogeneity, site_label_counts, split_sites

__all__ = [
    "SiteAnswer",
    "FederatedDecision",
    "Site",
    "site_answer",
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
    "site_fit",
    "FederatedMembership",
    "site_membership_evaluation",
    "membership_fields",
    "membership_summary",
]
