"""kahm-dask: differentially private classification with Kernel Affine Hull Machines on Dask.

The core (this namespace) is pure NumPy/SciPy/scikit-learn; the Dask pipeline lives in
:mod:`kahm_dask.pipeline` and is imported only when used (``DaskKAHMClassifier``, its
scikit-learn estimator, and ``write_dataset`` / ``open_dataset``, its dataset stores, are
loaded from there on first access).
"""

from kahm_dask._version import __version__
from kahm_dask.base import class_matching_scores
from kahm_dask.classifier import KAHMClassifier
from kahm_dask.deep import DeepKAHM, WideKAHM
from kahm_dask.dp_dataset import DPDataset, release_dataset
from kahm_dask.federated import FederatedClassifier, Site, SiteAnswer, combine, split_sites
from kahm_dask.kahm import KAHM, DegenerateWeightsWarning
from kahm_dask.privacy import PrivacyLeakWarning, PrivacyLedger
from kahm_dask.regularization import LambdaFixedPoint, solve_lambda

__all__ = [
    "KAHM",
    "DeepKAHM",
    "WideKAHM",
    "KAHMClassifier",
    "DaskKAHMClassifier",
    "write_dataset",
    "open_dataset",
    "class_matching_scores",
    "DPDataset",
    "release_dataset",
    "solve_lambda",
    "LambdaFixedPoint",
    "DegenerateWeightsWarning",
    "FederatedClassifier",
    "Site",
    "SiteAnswer",
    "combine",
    "split_sites",
    "PrivacyLeakWarning",
    "PrivacyLedger",
    "__version__",
]



_LAZY = {
    "DaskKAHMClassifier": "kahm_dask.pipeline.estimator",
    "write_dataset": "kahm_dask.pipeline.stores.dataset",
    "open_dataset": "kahm_dask.pipeline.stores.dataset",
}


def __getattr__(name: str):
    """The pipeline's names (:data:`_LAZY`) on first access, so that importing the core does not
    import Dask."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
