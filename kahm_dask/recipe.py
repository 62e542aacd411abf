"""The per-cluster training recipe: one cluster's DP rows, then one deep KAHM on them.

Definition 12 with the paper's fabrication (docs/algorithm.md#dp-classifier): a cluster of a
class (a branch of its wide KAHM, a Remark 4 subset) gets

* ``epsilon=None``: its original rows, no DP rows;
* ``dp_data="noisy"``: its noisy rows ``Y⁺`` (Algorithm 1) as the DP rows;
* ``dp_data="fabricated"``: the DP rows ``Ỹ = F_n(Y⁺, r)`` fabricated from its noisy rows
  (:func:`~kahm_dask.privacy.fabrication.fabricate_subset`, docs/algorithm.md#stopping-rule),
  reading its private rows only for the paper's private threshold ``r_source="private"``;

and one :class:`~kahm_dask.DeepKAHM` fitted on those rows. :class:`TrainParams` holds the
recipe's parameters (small, frozen, picklable: it travels to every Dask task) and
:meth:`TrainParams.fit_cluster` applies it. ``KAHMClassifier.fit`` calls it per branch of each
class and the Dask pipeline's ``train_cluster`` per (class, cluster) task.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from kahm_dask.deep import DeepKAHM
from kahm_dask.params import PARAMS, unused_fabrication_settings
from kahm_dask.privacy.fabrication import fabricate_subset

__all__ = ["TrainParams", "ClusterFit"]


class ClusterFit(NamedTuple):
    """Output of :meth:`TrainParams.fit_cluster` for one cluster of N_s rows and p features.

    model : the :class:`~kahm_dask.DeepKAHM` fitted on the DP rows (on the original rows when
        not private)
    dp_rows : (N_s, p) DP rows the model was fitted on (releasable), None when not private
    n_passes : smoother passes M̃ of the fabrication (eq. 105); None unless fabricated, or when
        the threshold r was not reached within ``max_passes``
    """

    model: DeepKAHM
    dp_rows: np.ndarray | None
    n_passes: int | None


@dataclass(frozen=True)
class TrainParams:
    """Parameters of the per-cluster recipe (see the module doc).

    n_components, n_layers, min_range : the :class:`~kahm_dask.DeepKAHM` (and of every KAHM of
        the fabrication's smoother)
    epsilon : None for the non-private model, else ε of the release the noisy rows come from
        (the release itself happens before, on the whole matrix)
    dp_data : "fabricated" or "noisy"
    r_source, r_value, max_passes : the fabrication's stopping rule
        (:func:`~kahm_dask.privacy.fabrication.fabricate_subset`)
    chunk_size : the fitted DeepKAHM's evaluation chunk (memory only)

    Examples
    --------
    >>> import numpy as np
    >>> rows = np.random.default_rng(0).uniform(size=(40, 3))
    >>> fit = TrainParams(2, 2, epsilon=1.0, dp_data="fabricated", r_value=3).fit_cluster(rows)
    >>> fit.dp_rows.shape, fit.n_passes, fit.model.layer_dims_
    ((40, 3), 3, [2, 1])
    """

    n_components: int = PARAMS["n_components"].default
    n_layers: int = PARAMS["n_layers"].default
    min_range: float | None = PARAMS["min_range"].default
    epsilon: float | None = PARAMS["epsilon"].default
    dp_data: str = PARAMS["dp_data"].default
    r_source: str = PARAMS["r_source"].default
    r_value: float | int | None = PARAMS["r_value"].default
    max_passes: int = PARAMS["max_passes"].default
    chunk_size: int = PARAMS["chunk_size"].default

    def __post_init__(self) -> None:
        unused = unused_fabrication_settings(self.to_dict()) if self.private else []
        if unused:
            warnings.warn(
                f"{', '.join(unused)} set{'s' if len(unused) == 1 else ''} the fabrication, but dp_data='noisy' "
                "fits the class models on the noisy rows and fabricates nothing: set dp_data='fabricated' "
                "to fabricate (docs/privacy.md#choosing-the-defaults).",
                UserWarning,
                stacklevel=4,
            )

    @property
    def private(self) -> bool:
        return self.epsilon is not None

    @property
    def fabricates(self) -> bool:
        """True when the DP rows are fabricated from the noisy rows."""
        return self.private and self.dp_data == "fabricated"

    @property
    def reads_private_rows(self) -> bool:
        """True when :meth:`fit_cluster` needs the cluster's private rows (the paper's private
        stopping threshold, which leaks; docs/privacy.md)."""
        return self.fabricates and self.r_source == "private"

    def to_dict(self) -> dict:
        return asdict(self)

    def fit_cluster(self, rows: np.ndarray, private_rows: np.ndarray | None = None) -> ClusterFit:
        """Apply the recipe to one cluster.

        rows : (N_s, p) the cluster's noisy rows ``Y⁺_s`` when private, else its original rows.
        private_rows : (N_s, p) its original rows, aligned with ``rows``; read only when
            :attr:`reads_private_rows` (pass None otherwise, so they need not be loaded).

        The model's weights are kept in the precision of the rows it is fitted on: ``rows``'
        dtype (float32 rows give float32 weights), or float64 for fabricated rows
        (docs/algorithm.md#weights-precision).
        """
        dp_rows, n_passes = (rows if self.private else None), None
        if self.fabricates:
            result = fabricate_subset(  # in float64 (it converts): the fabricated rows and weights are float64
                private_rows if self.reads_private_rows else None,
                rows,
                self.n_components,
                r_source=self.r_source,
                r_value=self.r_value,
                max_passes=self.max_passes,
                min_range=self.min_range,
            )
            dp_rows, n_passes = result.data, result.n_passes
        model = DeepKAHM(self.n_components, self.n_layers, min_range=self.min_range, chunk_size=self.chunk_size)
        return ClusterFit(model.fit(rows if dp_rows is None else dp_rows), dp_rows, n_passes)
