"""The run-level settings of a training run (:class:`TrainSettings`), on top of the per-task
recipe :class:`~kahm_dask.recipe.TrainParams`; made from an estimator's parameters by
:meth:`~kahm_dask.DaskKAHMClassifier.train_settings`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kahm_dask.partition import KMEANS_DIMS
from kahm_dask.privacy.release import AUTO_LEDGER
from kahm_dask.recipe import TrainParams

__all__ = ["TrainSettings"]


@dataclass(frozen=True)
class TrainSettings:
    """Run-level settings on top of the per-task :class:`TrainParams`.

    ``seed`` seeds the k-means steps only (not private; None: drawn once per work store and
    kept there). ``bounds`` = ``(lower, upper)``, the bounds of the features the DP release
    clips to (scalars or (p,) arrays, broadcast to the store's features at release time; a
    :class:`~kahm_dask.privacy.bounds.FeatureBounds` carries its provenance and scaling), with
    ``bounds_source`` (:data:`~kahm_dask.privacy.bounds.BOUNDS_PUBLIC`, the
    default when bounds are given, or ``BOUNDS_PRIVATE``). Without bounds a DP run uses the
    store's public ``feature_range`` attribute, else each feature's min/max of the store
    (private: warns). ``d`` None = the bound width. ``ledger`` and ``budget``: the data set's
    privacy ledger (:func:`~kahm_dask.privacy.release.resolve_ledger`: ``"auto"``, a ledger
    directory, a ``PrivacyLedger`` or None) and a cap on its budget.
    ``insecure_noise_seed``: tests only, fixes the noise and voids the guarantee.
    """

    params: TrainParams
    seed: int | None = None
    delta: float = 0.0
    d: float | None = None
    bounds: tuple | None = field(default=None, compare=False)
    bounds_source: str | None = None
    block_size: int = 1000
    s_rule: str = "round"
    min_cluster_size: int | None = None
    cluster_on: str = "noisy"
    n_init: int = 1
    kmeans_dims: int | None = KMEANS_DIMS
    oversampling_factor: float | None = None
    init_max_iter: int = 5
    kmeans_max_iter: int = 100
    max_cluster_rows: int | None = None
    kmeans_persist_fraction: float = 0.25
    ledger: Any = field(default=AUTO_LEDGER, compare=False)
    budget: tuple[float, float] | None = None
    insecure_noise_seed: int | None = None

    @property
    def needs_private_rows(self) -> bool:
        """True when a stage after the noise reads the private rows (the k-means with
        ``cluster_on="original"``, the paper's private r, or a non-private run)."""
        p = self.params
        if not p.private:
            return True
        return self.cluster_on == "original" or (p.dp_data == "fabricated" and p.r_source == "private")
