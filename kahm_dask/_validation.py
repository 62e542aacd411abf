"""One place for input checks: 2-D finite float64 data, enough rows, parameters.

Every public entry point of the core calls these helpers so that bad input fails
early with a message naming the problem and the fix, never deep inside NumPy.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.utils.validation import check_array

__all__ = [
    "as_data_matrix",
    "as_float_rows",
    "weights_dtype",
    "check_n_rows",
    "check_positive_int",
    "check_positive_float",
    "check_probability",
    "check_n_features",
    "check_label_types",
    "check_class_sizes",
    "check_n_classes",
    "site_fit",
    "check_n_components",
    "check_finite_rows",
]


def as_data_matrix(Y: Any, name: str = "Y", *, min_rows: int = 1) -> np.ndarray:
    """Return ``Y`` as a C-contiguous float64 array of shape (N, p).

    Raises ``ValueError`` for a wrong rank, NaN/inf, or fewer than ``min_rows`` rows and
    ``TypeError`` for sparse or non-numeric data. Dask arrays are computed (callers that
    must stay lazy use the pipeline layer instead).
    """
    if hasattr(Y, "dask") and hasattr(Y, "compute"):
        Y = Y.compute()
    if sp.issparse(Y):
        raise TypeError(
            f"{name} is a sparse matrix; KAHM models need dense data (use {name}.toarray())."
        )
    arr = np.asarray(Y)
    if arr.dtype.kind in "USV":
        raise TypeError(f"{name} must hold numbers, got an array of dtype {arr.dtype}.")
    if arr.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D array of shape (n_samples, n_features), got {arr.ndim}-D "
            f"with shape {arr.shape}. Reshape your data with .reshape(-1, 1) for a single "
            "feature or .reshape(1, -1) for a single sample."
        )
    try:
        return check_array(
            arr,
            dtype=np.float64,
            order="C",
            ensure_all_finite=True,
            ensure_min_samples=min_rows,
            input_name=name,
        )
    except ValueError as exc:
        raise ValueError(f"Invalid {name}: {exc}") from None


def weights_dtype(Y: Any) -> np.dtype:
    """The precision a model fitted on the rows ``Y`` keeps its kernel weights β in
    (docs/algorithm.md#weights-precision): float32 for float32 rows, float64 for anything else.

    Checked before :func:`as_data_matrix` turns ``Y`` into float64, so that float32 data give a
    model stored at the data's size (scikit-learn's habit of preserving float32).
    """
    return np.dtype(np.float32) if getattr(Y, "dtype", None) == np.float32 else np.dtype(np.float64)


def as_float_rows(x: Any) -> np.ndarray:
    """``x`` as an array in its own float dtype (float32 or float64), other numbers as float64:
    the rows a cluster's fit reads, so that :func:`weights_dtype` still sees the stored dtype."""
    x = np.asarray(x)
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float64)


def check_n_rows(n_rows: int, min_rows: int, what: str) -> None:
    """Raise ``ValueError`` if ``what`` has fewer than ``min_rows`` rows."""
    if n_rows < min_rows:
        raise ValueError(
            f"{what} has {n_rows} sample(s); at least {min_rows} are needed."
        )


def check_positive_int(value: Any, name: str, *, minimum: int = 1) -> int:
    """Return ``value`` as int, or raise if it is not an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}.")
    return int(value)


def check_positive_float(value: Any, name: str) -> float:
    """Return ``value`` as float, or raise if it is not a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive number, got {value!r}.")
    value = float(value)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value}.")
    return value


def check_probability(value: Any, name: str, *, allow_zero: bool = False) -> float:
    """Return ``value`` as float, or raise if it is not in (0, 1) ([0, 1) with ``allow_zero``)."""
    interval = "[0, 1)" if allow_zero else "(0, 1)"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number in {interval}, got {value!r}.")
    value = float(value)
    if not ((0.0 <= value if allow_zero else 0.0 < value) and value < 1.0):
        raise ValueError(f"{name} must lie in {interval}, got {value}.")
    return value


def check_n_features(n_features: int, expected: int, estimator: str) -> None:
    """Raise ``ValueError`` if a query has another feature count than the training data."""
    if n_features != expected:
        raise ValueError(
            f"X has {n_features} features, but {estimator} is expecting {expected} features "
            "as input (the number of columns it was fitted on)."
        )


def _label_kind(value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, numbers.Number):
        return "number"
    if isinstance(value, (str, bytes)):
        return "string"
    return type(value).__name__


def check_label_types(y: Any, name: str = "y") -> Any:
    """Return ``y`` unchanged, or raise ``ValueError`` if its labels mix types.

    ``[0, "a"]`` would become the strings ``["0", "a"]`` under ``np.asarray`` and an object
    array of them is "unknown" to scikit-learn: both are ambiguous, so they are rejected with
    the fix. Only lists, tuples and object arrays can mix types; typed arrays pass through.
    """
    if isinstance(y, np.ndarray) and y.dtype != object:
        return y
    if not isinstance(y, (list, tuple, np.ndarray)):
        return y
    values = np.asarray(y, dtype=object).ravel()
    kinds = sorted({_label_kind(v) for v in values})
    if len(kinds) > 1:
        raise ValueError(
            f"{name} mixes label types ({', '.join(kinds)}); the labels of a classifier must "
            f"all be numbers or all be strings. Convert them to one type first, e.g. "
            f"{name} = np.asarray({name}).astype(str)."
        )
    return y


#: True inside :func:`site_fit`: the rows being fitted are one site's of a federation.
_SITE_FIT: ContextVar[bool] = ContextVar("kahm_dask_site_fit", default=False)


@contextmanager
def site_fit() -> Iterator[None]:
    """Within it, training rows of a single class are accepted: a federated site may hold one
    class (its model answers its distance to that class), and the federation checks that the
    pooled rows hold two or more (:func:`check_n_classes`)."""
    token = _SITE_FIT.set(True)
    try:
        yield
    finally:
        _SITE_FIT.reset(token)


def check_n_classes(classes: Sequence[Any]) -> None:
    """Raise ``ValueError`` when the training rows hold fewer than two classes (outside
    :func:`site_fit`): a classifier of one class answers that label whatever the input, and a
    DP fit would spend its ε on it. Called before anything is spent or written.

    >>> check_n_classes([3])
    Traceback (most recent call last):
    ...
    ValueError: the training rows hold one class (3); a classifier needs at least two.
    """
    if len(classes) < 2 and not _SITE_FIT.get():
        held = f"one class ({', '.join(map(str, classes))})" if len(classes) else "no class"
        raise ValueError(f"the training rows hold {held}; a classifier needs at least two.")


def check_class_sizes(counts: Mapping[Any, int], min_rows: int = 2) -> None:
    """Raise ``ValueError`` for fewer than two classes (:func:`check_n_classes`) or naming every
    class with fewer than ``min_rows`` rows.

    ``counts`` maps each class label to its number of rows (e.g. ``DatasetStore.class_counts``).
    """
    check_n_classes(list(counts))
    small = [label for label, n in counts.items() if n < min_rows]
    if small:
        sizes = ", ".join(f"{label!r}: {counts[label]}" for label in small)
        raise ValueError(
            f"class(es) {small} have fewer than {min_rows} samples ({sizes}); a KAHM needs at "
            f"least {min_rows} samples per class. Remove these classes or add samples."
        )


def check_n_components(n_components: int, n_features: int, stacklevel: int = 2) -> None:
    """Warn when ``n_components`` exceeds ``n_features``: the subspace is capped
    (docs/algorithm.md#kahm-guards, docs/decisions.md#decision-dimension-caps).

    Not an error: every KAHM caps its dimension at ``min(n, N − 1, p, rank)`` per layer and
    branch by design, and the default ``n_components=20`` must keep working on data with
    fewer features (scikit-learn's estimator checks use 1 to 10 features).
    """
    if n_components > n_features:
        warnings.warn(
            f"n_components={n_components} exceeds the number of features ({n_features}); every "
            f"KAHM subspace is capped at {n_features} dimensions (docs/algorithm.md#kahm-guards). Set "
            f"n_components <= {n_features} to silence this warning.",
            UserWarning,
            stacklevel=stacklevel + 1,
        )


def check_finite_rows(X: np.ndarray, name: str = "X", row_offset: int = 0) -> np.ndarray:
    """Return ``X``, or raise ``ValueError`` naming the first NaN/inf entry (row, column).

    ``row_offset`` is added to the reported row (for blocks of a larger array).
    """
    finite = np.isfinite(X)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        raise ValueError(
            f"{name} has a non-finite value at row {row_offset + int(row)}, column {int(col)}: "
            f"{X[row, col]}. Remove or impute NaN/inf values before predicting."
        )
    return X
