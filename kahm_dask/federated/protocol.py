"""What crosses a site's boundary: its :class:`SiteAnswer` ``(ρ_q, ĉ_q)`` for m queries, and
the minimum-distance :func:`combine` of the sites' answers into the :class:`FederatedDecision`
(docs/federated.md). A :class:`Site` keeps its classifier private and exposes only
:meth:`Site.answer`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from sklearn.utils.validation import check_is_fitted

__all__ = ["SiteAnswer", "FederatedDecision", "Site", "site_answer", "combine"]


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


def site_answer(D: ArrayLike, classes: ArrayLike) -> SiteAnswer:
    """The answer ``(ρ_q, ĉ_q)`` of a site from its class distances D (m, C_q) of m queries
    and its classes (C_q,): the minimum over the classes and the class where it is reached
    (ties → lowest class index, Definition 7). The one place a site turns distances into its
    answer (:meth:`Site.answer`, and the Dask pipeline block by block)."""
    D = np.asarray(D, dtype=np.float64)
    best = np.argmin(D, axis=1)
    return SiteAnswer(min_distance=D[np.arange(D.shape[0]), best], label=np.asarray(classes)[best])


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
        return site_answer(self._model.class_distances(X), self._model.classes_)


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
