"""A DP data set to take away (the paper's Definition 14): released rows, their labels, the
same rows in the owner's raw units, and the statement that covers them.

:func:`release_dataset` makes one release of an in-memory matrix through the one release
sequence every path uses (:func:`~kahm_dask.privacy.release.begin_release`: planned, checked
and recorded in the data set's ledger before any noise is drawn), with the parameters and the
partition of ``KAHMClassifier`` (so ``dp_data="fabricated"`` gives the rows that
``KAHMClassifier(dp_data="fabricated")`` would fit). ``kahm-dask release`` does the same for a
dataset store on Dask (:mod:`kahm_dask.pipeline.release`).

Everything computed from a :class:`DPDataset` is post-processing: tuning any estimator on it
(``GridSearchCV(KAHMClassifier(), grid).fit(ds.X, ds.y, released_from=ds)``) spends nothing
more, and the fitted ``KAHMClassifier`` carries the release's statement
(docs/privacy.md#tuning-without-spending).

Examples
--------
>>> from kahm_dask import PrivacyLedger, release_dataset
>>> from kahm_dask.datasets import PUBLIC_BOUNDS, load_bundled, split_and_scale
>>> split = split_and_scale(*load_bundled("digits"), bounds=PUBLIC_BOUNDS["digits"])
>>> ds = release_dataset(split.X_train, split.y_train, epsilon=2.0, bounds=split.bounds,
...                      ledger=PrivacyLedger())
>>> ds.X.shape, ds.y.shape, float(ds.X_raw.min()) >= 0.0, float(ds.X_raw.max()) <= 16.0
((1257, 64), (1257,), True, True)
>>> ds.to_pandas().shape   # 64 features and the label, in raw units
(1257, 65)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_array, check_consistent_length

from kahm_dask._random import as_seed_sequence, child_seed_sequence
from kahm_dask._validation import check_label_types
from kahm_dask.privacy.bounds import Scaling
from kahm_dask.privacy.fabrication import fabricate_subset
from kahm_dask.privacy.statement import PrivacyStatement

__all__ = ["DPDataset", "release_dataset", "raw_units", "column_names", "fabricate_class", "release_markdown",
           "LABEL_COLUMN"]

#: The column of the labels in a written release.
LABEL_COLUMN = "label"


@dataclass(frozen=True, eq=False)
class DPDataset:
    """One DP release of a data set: what may leave the data owner's hands.

    X : (N, p) the DP rows in feature units (the units the release was made in: what the
        estimators were, or would be, trained on)
    y : (N,) their labels (published as they are: not covered, see ``statement``)
    X_raw : (N, p) the same rows in the owner's raw units (the scaling undone, clipped to the
        public raw bounds: post-processing), e.g. digits' pixel counts 0–16
    feature_names : p column names
    statement : the :class:`~kahm_dask.privacy.statement.PrivacyStatement` of the release
    release_id : its id in the data set's privacy ledger

    It has no ``shape`` or length on purpose: scikit-learn passes it through to ``fit`` as a
    whole (``released_from=ds``) instead of splitting it like a per-row fit parameter.
    """

    X: np.ndarray = field(repr=False)
    y: np.ndarray = field(repr=False)
    X_raw: np.ndarray = field(repr=False)
    feature_names: tuple[str, ...] = field(repr=False)
    statement: PrivacyStatement = field(repr=False)
    release_id: str

    def to_pandas(self, *, raw: bool = True):
        """A DataFrame (N, p + 1): one column per feature (raw units unless ``raw=False``) and
        the labels in :data:`LABEL_COLUMN`."""
        import pandas as pd

        frame = pd.DataFrame(self.X_raw if raw else self.X, columns=list(self.feature_names))
        frame[LABEL_COLUMN] = self.y
        return frame

    def to_parquet(self, path: str | Path) -> Path:
        """Write the rows (raw units) and labels to a Parquet file and the statement beside it
        (``<path>.PRIVACY.md``); returns the statement's path."""
        self.to_pandas().to_parquet(path, index=False)
        return self.write_statement(path)

    def to_csv(self, path: str | Path) -> Path:
        """As :meth:`to_parquet`, as CSV (a header of the column names)."""
        self.to_pandas().to_csv(path, index=False)
        return self.write_statement(path)

    def write_statement(self, path: str | Path) -> Path:
        """The statement as ``<path>.PRIVACY.md`` (publishable, with the rows)."""
        at = Path(f"{path}.PRIVACY.md")
        at.write_text(release_markdown(self.statement, self.release_id, self.X.shape))
        return at


def release_markdown(statement: PrivacyStatement, release_id: str, shape: tuple[int, int]) -> str:
    """The statement of a written release: what the file holds, then the guarantee."""
    n, p = shape
    return (f"# DP release {release_id}\n\n{n} rows × {p} features ({statement.dp_data} DP rows, in the data "
            f"owner's raw units) and their labels (column `{LABEL_COLUMN}`).\n\n" + statement.to_markdown())


def column_names(names, n_features: int) -> tuple[str, ...]:
    """``names`` as p strings (checked), or ``x0 … x{p−1}`` when None."""
    if names is None:
        return tuple(f"x{j}" for j in range(n_features))
    names = tuple(str(n) for n in names)
    if len(names) != n_features or len(set(names)) != n_features or LABEL_COLUMN in names:
        raise ValueError(f"feature_names must be {n_features} distinct names other than {LABEL_COLUMN!r}, "
                         f"got {len(names)}.")
    return names


def raw_units(X: np.ndarray, lower: np.ndarray, upper: np.ndarray, scaling: Scaling | None) -> np.ndarray:
    """DP rows X (n, p) in the owner's raw units: clipped to the public feature bounds
    ``[lower, upper]`` (p,), then the ``scaling`` undone (:meth:`Scaling.invert
    <kahm_dask.privacy.bounds.Scaling.invert>`; None: the features are the raw values). Both
    steps read public numbers only: post-processing."""
    clipped = np.clip(X, lower, upper)
    return clipped if scaling is None else scaling.invert(clipped)


def release_dataset(X, y, *, epsilon: float | None, bounds=None, dp_data: str = "noisy", feature_names=None,
                    **params: Any) -> DPDataset:
    """One DP release of X (N, p) with labels y (N,): the noisy rows, or with
    ``dp_data="fabricated"`` the rows fabricated from them class by class (Definition 14), in
    the rows' order.

    ``bounds``: public bounds, as for ``KAHMClassifier`` (a
    :class:`~kahm_dask.privacy.bounds.FeatureBounds` of :func:`~kahm_dask.datasets.split_and_scale`
    also gives the raw units); ``params``: the other privacy, fabrication and partition parameters
    of :class:`~kahm_dask.KAHMClassifier` (``delta``, ``d``, ``ledger``, ``budget``, ``r_source``,
    ``r_value``, ``cluster_on``, ``n_components``, ``block_size``, ``random_state`` …); with
    ``epsilon=None`` and ``record_epsilon``, the ε per entry is solved as ``KAHMClassifier.fit``
    solves it (its ``epsilon_``). The release is
    recorded in the data set's ledger before any noise is drawn; bad input raises before that.
    """
    from kahm_dask.classifier import KAHMClassifier

    spec = KAHMClassifier(epsilon=epsilon, bounds=bounds, dp_data=dp_data, **params)
    spec._check_params()
    y = check_label_types(y)
    X = check_array(X, dtype=[np.float64, np.float32], ensure_min_samples=2)
    check_consistent_length(X, y)
    check_classification_targets(y)
    names = column_names(feature_names, X.shape[1])
    classes, y_idx = np.unique(y, return_inverse=True)
    if np.bincount(y_idx).min() < 2:
        raise ValueError("every class needs at least 2 rows (the fabrication's smoother fits a KAHM per class).")
    if spec._set_entry_epsilon(X.shape[1]) is None:
        raise ValueError("release_dataset needs epsilon (or record_epsilon): a release without noise is the "
                         "private rows themselves.")
    noisy = spec._release(X, caller_partition=False,
                          what=f"release_dataset: {dp_data} rows of a {X.shape[0]} x {X.shape[1]} matrix")
    rows = noisy if dp_data == "noisy" else _fabricate(spec, X, noisy, y_idx, len(classes))
    mech = spec.privacy_statement_.mechanism
    scaling = getattr(bounds, "scaling", None)
    raw = raw_units(rows, np.asarray(mech["lower"]), np.asarray(mech["upper"]), scaling)
    return DPDataset(rows, np.asarray(y), raw, names, spec.privacy_statement_, spec.release_id_)



def _fabricate(spec, X: np.ndarray, noisy: np.ndarray, y_idx: np.ndarray, n_classes: int) -> np.ndarray:
    """The fabricated rows (N, p) of every class from its noisy rows, in the rows' order."""
    out = np.empty(noisy.shape, dtype=np.float64)
    for c in range(n_classes):
        at = np.flatnonzero(y_idx == c)
        out[at] = fabricate_class(spec, X[at], noisy[at], c)
    return out


def fabricate_class(spec, X_c: np.ndarray | None, noisy_c: np.ndarray, code: int) -> np.ndarray:
    """The fabricated rows (N_c, p), float64, of class ``code`` from its noisy rows ``noisy_c``
    (N_c, p): the partition and the per-branch fabrication that ``spec.fit`` (a
    ``KAHMClassifier`` with ``dp_data="fabricated"``) would make, with the same seed. ``X_c``,
    the class's private rows, is read only where a setting reads them (``cluster_on="original"``,
    ``r_source="private"``; both warn); None otherwise."""
    from kahm_dask.classifier import PARTITION_STREAM

    recipe = spec._recipe()
    wide = spec._wide(child_seed_sequence(as_seed_sequence(spec.random_state), PARTITION_STREAM, code))
    rows, branch, ids = spec._branches(noisy_c if X_c is None else X_c, noisy_c, None, wide)
    out = np.empty(noisy_c.shape, dtype=np.float64)
    for s in ids:
        part = branch == s
        out[part] = fabricate_subset(
            X_c[part] if recipe.reads_private_rows else None, rows[part], recipe.n_components,
            r_source=recipe.r_source, r_value=recipe.r_value, max_passes=recipe.max_passes,
            min_range=recipe.min_range,
        ).data
    return out
