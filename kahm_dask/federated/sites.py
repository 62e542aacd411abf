"""Fitting one classifier per site: each site's seeds from one master seed (k-means only; the
DP noise of every site comes from the secure source), and :func:`fit_sites`."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from sklearn.base import clone

from kahm_dask._random import RandomState, as_seed_sequence, child_seed_sequence
from kahm_dask._validation import check_n_classes, site_fit
from kahm_dask.federated.protocol import Site
from kahm_dask.privacy.ledger import PrivacyLedger

__all__ = ["SITE_STREAM", "SITE_NOISE_STREAM", "site_seed", "site_noise_seed", "fit_sites"]

#: Child stream of the master seed that seeds the sites' k-means (``random_state``).
SITE_STREAM = 3
#: Child stream of a test-only insecure noise seed that gives each site its own noise seed.
SITE_NOISE_STREAM = 4


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
    ``ledger="auto"`` (the default) or a directory, every site's release is charged to its own
    rows in the ledger; a ``PrivacyLedger`` object on the estimator is refused (the sites keep
    their own ledgers).
    """
    X, y = np.asarray(X), np.asarray(y)
    check_n_classes(np.unique(y).tolist())  # pooled; a site may hold one class
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
        with site_fit():
            out.append(Site(model.fit(X[rows], y[rows], partition=part)))
    return out
