"""Simulated federations: one labelled data set cut into sites (IID, one site per class, label
skew, Dirichlet), and how far a split is from IID (docs/federated.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from kahm_dask._random import RandomState, as_generator
from kahm_dask._validation import check_positive_float, check_positive_int

__all__ = ["SPLITS", "MIN_ROWS_PER_CLASS", "MAX_DIRICHLET_DRAWS", "split_sites", "site_label_counts",
           "label_heterogeneity"]

SPLITS = ("iid", "per_class", "label_skew", "dirichlet")
#: A site's share of a class needs this many rows (a KAHM needs two samples).
MIN_ROWS_PER_CLASS = 2
#: Dirichlet proportions are redrawn at most this often when a site ends up empty.
MAX_DIRICHLET_DRAWS = 100


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
