"""The Dask estimator, :class:`~kahm_dask.pipeline.estimator.estimator.DaskKAHMClassifier`: the
scikit-learn API (:mod:`.estimator`), where it computes (:mod:`.clients`), its stores
(:mod:`.stores`) and the conversion to and from the in-memory classifier (:mod:`.conversion`)."""

from kahm_dask.pipeline.estimator.estimator import DaskKAHMClassifier
from kahm_dask.pipeline.estimator.stores import ESTIMATOR_PARAMS_KEY

__all__ = ["DaskKAHMClassifier", "ESTIMATOR_PARAMS_KEY"]
