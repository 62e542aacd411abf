"""The run-level settings of a training run (:class:`TrainSettings`), on top of the per-task
recipe :class:`~kahm_dask.recipe.TrainParams`; made from an estimator's parameters by
:meth:`~kahm_dask.DaskKAHMClassifier.train_settings`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from kahm_dask.params import PARAMS
from kahm_dask.privacy.accounting import entry_epsilon
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
    ``record_epsilon`` (with ``record_delta``): the record-level target in place of the recipe's
    ε, which :meth:`for_features` solves once the number of features is known.
    """

    params: TrainParams
    seed: int | None = PARAMS["random_state"].default
    record_epsilon: float | None = PARAMS["record_epsilon"].default
    record_delta: float = PARAMS["record_delta"].default
    delta: float = PARAMS["delta"].default
    d: float | None = PARAMS["d"].default
    bounds: tuple | None = field(default=None, compare=False)
    bounds_source: str | None = None
    block_size: int = PARAMS["block_size"].default
    s_rule: str = PARAMS["s_rule"].default
    min_cluster_size: int | None = PARAMS["min_cluster_size"].default
    cluster_on: str = PARAMS["cluster_on"].default
    n_init: int = PARAMS["n_init"].default
    kmeans_dims: int | None = PARAMS["kmeans_dims"].default
    oversampling_factor: float | None = PARAMS["oversampling_factor"].default
    init_max_iter: int = PARAMS["init_max_iter"].default
    kmeans_max_iter: int = PARAMS["kmeans_max_iter"].default
    max_cluster_rows: int | None = PARAMS["max_cluster_rows"].default
    persist_fraction: float = PARAMS["persist_fraction"].default
    ledger: Any = field(default=PARAMS["ledger"].default, compare=False)
    budget: tuple[float, float] | None = PARAMS["budget"].default
    insecure_noise_seed: int | None = PARAMS["insecure_noise_seed"].default

    #: Settings named otherwise in the parameter table (:data:`kahm_dask.params.PARAMS`).
    RENAMED = {"seed": "random_state"}
    #: Settings that are not parameters: where the bounds came from (the run finds it).
    RUN_ONLY = ("params", "bounds_source")

    @classmethod
    def from_params(
        cls, params: Mapping[str, Any], *, r_value: Any, bounds_source: str | None = None,
        budget: tuple[float, float] | None = None,
    ) -> TrainSettings:
        """The settings of estimator parameters ``params`` (names of the parameter table, checked
        before): the recipe's (:class:`TrainParams`, with ``r_value`` as ``r_source`` takes it) and
        every run-level setting, each read by its name (:data:`RENAMED`)."""
        recipe = TrainParams(**{f.name: params[f.name] for f in fields(TrainParams) if f.name != "r_value"},
                             r_value=r_value)
        own = {f.name: params[cls.RENAMED.get(f.name, f.name)] for f in fields(cls) if f.name not in cls.RUN_ONLY}
        return cls(recipe, **{**own, "budget": params["budget"] if budget is None else budget},
                   bounds_source=bounds_source)

    def to_params(self) -> dict[str, Any]:
        """The parameters these settings were made from (names of the parameter table), as a model
        store's manifest records them (the owner's ``ledger`` and ``budget`` and the test-only
        ``insecure_noise_seed`` left out)."""
        out = {k: v for k, v in self.params.to_dict().items()}
        for f in fields(self):
            if f.name not in self.RUN_ONLY and f.name not in ("ledger", "budget", "insecure_noise_seed"):
                out[self.RENAMED.get(f.name, f.name)] = getattr(self, f.name)
        if self.record_epsilon is not None:
            out["epsilon"] = None  # as given: the ε solved per entry is in the privacy statement
        return out

    @property
    def private(self) -> bool:
        """True for a DP run (``epsilon`` or ``record_epsilon`` set)."""
        return self.params.private or self.record_epsilon is not None

    def for_features(self, n_features: int) -> TrainSettings:
        """These settings for data of ``n_features`` features: the recipe's ε per entry solved from
        ``record_epsilon`` (:func:`~kahm_dask.privacy.accounting.entry_epsilon`, which refuses a
        target too small to be useful); the settings themselves without a record-level target."""
        if self.record_epsilon is None:
            return self
        eps = entry_epsilon(None, self.record_epsilon, n_features, record_delta=self.record_delta, delta=self.delta)
        return replace(self, params=replace(self.params, epsilon=eps))

    @property
    def needs_private_rows(self) -> bool:
        """True when a stage after the noise reads the private rows (the k-means with
        ``cluster_on="original"``, the paper's private r, or a non-private run)."""
        p = self.params
        if not self.private:
            return True
        return self.cluster_on == "original" or (p.dp_data == "fabricated" and p.r_source == "private")
