"""KAHM classifier (Definitions 7–8) and its differentially private variants (Definition 12).

One wide conditionally deep KAHM per class; a query gets the class of minimum distance.
With ``epsilon`` set, every class model is built only on DP data: the noisy rows of
Algorithm 1 (``dp_data="noisy"``, Definition 12) or the rows fabricated from them
(``dp_data="fabricated"``, the paper's proposal). Definitions and Algorithm 1 are the paper's;
the implementation is described in docs/algorithm.md#classifier, docs/algorithm.md#fabrication
and docs/algorithm.md#dp-classifier.

The noise of a DP fit comes from the operating system's secure generator
(:mod:`kahm_dask.privacy.noise`), never from ``random_state``. ``random_state`` seeds only what
is not private, from one root ``SeedSequence(random_state)``: ``child(root, 1, c)`` the k-means
partition of class index c, whose parts are the branches of its model and, when fabricating,
the Remark 4 subsets (as in the Dask pipeline).
"""

from __future__ import annotations

import numpy as np
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from kahm_dask._batching import row_chunks
from kahm_dask._random import as_seed_sequence, child_seed_sequence
from kahm_dask._threads import in_threads
from kahm_dask._validation import (
    as_data_matrix,
    check_label_types,
    check_n_classes,
    check_n_components,
)
from kahm_dask.base import KAHMClassifierBase
from kahm_dask.deep import WideKAHM
from kahm_dask.float32_bound import candidate_classes, certified_argmin
from kahm_dask.kahm import EVAL_BLOCK_ROWS, eval_dtype
from kahm_dask.params import CLASSIFIER_PARAMS, PARAMS, parameter_constraints
from kahm_dask.partition import KMEANS_DIMS, check_partition
from kahm_dask.privacy.accounting import entry_epsilon
from kahm_dask.privacy.bounds import clipped_share, resolve_bounds, warn_if_clipped
from kahm_dask.privacy.ledger import check_budget
from kahm_dask.privacy.randomness import as_noise_source
from kahm_dask.privacy.release import begin_release
from kahm_dask.recipe import TrainParams

__all__ = ["KAHMClassifier", "DP_DATA", "PARTITION_STREAM"]

DP_DATA = PARAMS["dp_data"].choices
#: The k-means partition of class index c is seeded by ``child(SeedSequence(random_state), 1, c)``,
#: in the estimator and the Dask pipeline alike.
PARTITION_STREAM = 1

#: Query rows per prediction block with routing (``n_probe``): each branch is evaluated on the
#: block's rows that probe it, about ``n_probe / S`` of them, so blocks are larger than
#: EVAL_BLOCK_ROWS to keep those sub-blocks BLAS-sized.
ROUTED_BLOCK_ROWS = 4096

class KAHMClassifier(KAHMClassifierBase):
    """Minimum-distance classifier over per-class wide deep KAHMs (Definitions 7, 8, 12).

    Parameters
    ----------
    n_components : int, default=20
        Subspace dimension n of every KAHM (capped per layer and branch,
        docs/algorithm.md#kahm-guards).
    n_layers : int, default=1
        Layers L of each deep KAHM (layer dimension max(n − l + 1, 1)). 1 by evidence: deeper
        layers did not change one prediction on five data sets with the same noise
        (docs/decisions.md#decision-default-depth), and each layer adds a fit per branch and a
        pass over the queries.
    block_size : int, default=1000
        N_b: a class of N_c rows gets S_c = max(1, round(N_c / N_b)) branches
        (docs/algorithm.md#s-rule).
    random_state : None, int, SeedSequence or Generator
        Seeds the k-means steps only (not private). The DP noise never depends on it.
    epsilon : float or None, default=None
        None: the non-private model. Otherwise ε > 0 of the element-level guarantee: the
        release is ε-DP (or (ε, δ)-DP) for a change of one entry of X by at most ``d``.
        A whole record of p features is covered at (p·ε, p·δ) by basic composition, and at the
        far smaller PLD ε of the statement. See docs/privacy.md.
    record_epsilon : float or None, default=None
        In place of ``epsilon``: the ε of a whole record (p entries) at ``record_delta``. The ε
        per entry (``epsilon_``) is solved from it and p at fit with the PLD accountant
        (:func:`~kahm_dask.privacy.accounting.entry_epsilon`): ``record_epsilon=4`` on 30
        features is ε ≈ 0.18 per entry. Set at most one of the two.
    record_delta : float, default=1e-5
        δ in (0, 1) of the record-level ε: the δ ``record_epsilon`` is met at and the privacy
        statement's per-record ε is stated at.
    delta : float, default=0.0
        δ in [0, 1): the probability that an entry is released without noise (the paper's
        atom at 0). 0 gives pure ε-DP.
    bounds : (lower, upper) or None, default=None
        Public bounds of the features (scalars or (p,) arrays), known without looking at X;
        X is clipped to them before noise. None with ``epsilon`` set: taken from X with a
        :class:`~kahm_dask.privacy.randomness.PrivacyLeakWarning` (not covered).
    d : float, (p,) array or None, default=None
        Adjacency bound; None: the bound width ``upper − lower``.
    dp_data : {"noisy", "fabricated"}, default="noisy"
        Rows the DP class models are fitted on: the noisy rows themselves, or rows fabricated
        from them (the paper's method; docs/algorithm.md#dp-classifier). Both are DP; on the
        data sets measured the noisy rows were as accurate and several times cheaper to fit
        (docs/privacy.md#choosing-the-defaults).
    r_source : {"passes", "threshold", "private"}, default="passes"
        Stopping rule of the fabrication (docs/algorithm.md#stopping-rule): a fixed number of
        smoother passes ``r_value`` (default :data:`~kahm_dask.privacy.fabrication.DEFAULT_PASSES`),
        a public per-row error ``r_value``, or the paper's r from the private rows (leaks:
        warns with ``PrivacyLeakWarning``).
    r_value : float, int or None, default=None
        The stopping rule's number: the smoother passes for "passes" (an int; None: the
        default), the public per-row error for "threshold"; "private" takes none.
    cluster_on : {"noisy", "original"}, default="noisy"
        Rows each class's k-means partition (its branches and, when fabricating, the Remark 4
        subsets) is computed on; "original" (the paper's order) partitions private rows and warns
        with ``PrivacyLeakWarning``.
    max_passes : int, default=100
        Cap of the smoother M_max.
    s_rule : {"round", "ceil"}, default="round"
        Rounding of N_c / N_b to the branch count S_c (docs/decisions.md#decision-s-rule).
    min_range : float or None, default=1e-3
        Code range below which a KAHM direction is dropped; None or 0: no such rule
        (docs/algorithm.md#kahm-guards).
    chunk_size : int, default=1000
        Rows per block when a KAHM is evaluated (bounds the memory of an evaluation, not its
        result).
    n_init : int, default=1
        k-means restarts of every k-means: the partition of each class into its branches and,
        of a DP fit, into its Remark 4 subsets.
    kmeans_dims : int or None, default=50
        Principal coordinates every k-means runs in; None: all features
        (docs/algorithm.md#kmeans-space).
    n_probe : int or None, default=None
        Routing: a query is evaluated, per class, on the ``n_probe`` branches whose centres are
        nearest to it (docs/algorithm.md#routing), so the prediction cost stops growing with
        the number of branches. None (or ``n_probe ≥`` the branches of a class) evaluates every
        branch, exactly eq. 64.
    eval_dtype : {"auto", "float64", "float32"}, default="auto"
        Precision of the kernel block and its GEMM at prediction
        (docs/algorithm.md#evaluation-precision). "auto": distances in float64, and ``predict``
        in float32 with a proven bound, a row whose class the bound does not decide again in
        float64, so the predictions are float64's (docs/algorithm.md#certified-prediction;
        routed or not; deeper models predict from the float64 distances). "float64": everything in
        float64. "float32": the dominant GEMM ~2.5× faster everywhere, distances within ~1e-5
        relative of float64 (queries and distances stay float64). Passed to every class model at
        each prediction, so ``set_params`` after ``fit`` takes effect.
    n_jobs : int or None, default=None
        Threads for ``fit`` (over classes) and prediction (over blocks of rows), joblib's
        convention: None is 1, -1 all cores. With more than one thread, BLAS and OpenMP run one
        thread each inside them (threadpoolctl, process-wide for the duration of the call);
        with one, the BLAS thread count is left as it is.
    ledger : "auto", str or path, :class:`~kahm_dask.PrivacyLedger` or None, default="auto"
        Where the release of a DP fit is recorded, charged to each row of X, and checked against
        the rows' budget (docs/privacy.md#ledger): "auto", the ledger in the default ledger
        directory (``$KAHM_DASK_LEDGER_DIR``, else ``~/.local/share/kahm-dask/ledgers``); a
        directory, the ledger there; a ``PrivacyLedger``, the ledger it views; None, no
        accounting (warns with ``PrivacyLeakWarning``). Every entry point (this class,
        ``DaskKAHMClassifier``, the ``kahm-dask`` commands) recognises the same rows, in any
        subset, split, fold or float32 copy.
    budget : (ε, δ) or None, default=None
        A cap on the spending of each row of X: it lowers the rows' stored budget (or sets the
        first one) and cannot raise it. A fit that would take any row beyond it raises
        ``BudgetExceededError`` (and warns with ``BudgetRefusalWarning``) before any noise is
        drawn; in model selection pass ``error_score="raise"`` (docs/privacy.md#ledger).
    insecure_noise_seed : int or None, default=None
        Tests only: draws the noise from this seed, which voids the guarantee (anyone with
        the seed removes the noise); warns with ``PrivacyLeakWarning``.

    Attributes
    ----------
    classes_ : (C,) class labels
    models_ : list of C fitted :class:`~kahm_dask.WideKAHM`
    n_branches_ : (C,) branches per class
    dp_data_ : dict label → (N_c, p) DP rows each class model was built on (releasable);
        only when ``epsilon`` or ``record_epsilon`` is set
    epsilon_ : float or None
        The ε per entry of the release: ``epsilon``, or the one solved from ``record_epsilon``.
    fabrication_passes_ : dict label → list of M̃ per branch (fabricated only)
    privacy_statement_ : :class:`~kahm_dask.privacy.statement.PrivacyStatement` (DP only, or
        the release's when fitted with ``released_from``)
    release_id_ : str, the id of the release in the data set's ledger (DP only)
    n_features_in_ : int

    Notes
    -----
    ``predict_proba`` returns the class-matching scores normalised to sum to 1 per row. They
    rank classes like the distances do but are not calibrated probabilities.

    Examples
    --------
    >>> from kahm_dask import KAHMClassifier, PrivacyLedger
    >>> from kahm_dask.datasets import PUBLIC_BOUNDS, load_bundled, split_and_scale
    >>> # digits count pixels 0 to 16: public bounds, so the scaling uses no private statistic
    >>> split = split_and_scale(*load_bundled("digits"), bounds=PUBLIC_BOUNDS["digits"])
    >>> clf = KAHMClassifier(random_state=0).fit(split.X_train, split.y_train)
    >>> round(clf.score(split.X_test, split.y_test), 2) >= 0.95
    True
    >>> # ledger: an in-memory one for this example; by default the rows' own ledger on disk
    >>> dp = KAHMClassifier(epsilon=2.0, bounds=split.bounds, random_state=0, ledger=PrivacyLedger())
    >>> dp.fit(split.X_train, split.y_train).privacy_statement_.weakenings
    []
    >>> dp.ledger.spent()
    (2.0, 0.0)
    >>> record = KAHMClassifier(record_epsilon=8.0, bounds=split.bounds, random_state=0, ledger=PrivacyLedger())
    >>> round(record.fit(split.X_train, split.y_train).epsilon_, 3)   # ε per entry for 8 per record, p = 64
    0.214
    """

    #: The rule of every parameter, from kahm_dask/params.py (``r_value`` is also checked
    #: against ``r_source``).
    _parameter_constraints: dict = parameter_constraints(*CLASSIFIER_PARAMS)
    _fitted_attribute = "models_"

    def __init__(
        self,
        n_components: int = 20,
        n_layers: int = 1,
        block_size: int = 1000,
        random_state=None,
        *,
        epsilon: float | None = None,
        record_epsilon: float | None = None,
        record_delta: float = 1e-5,
        delta: float = 0.0,
        bounds=None,
        d=None,
        dp_data: str = "noisy",
        r_source: str = "passes",
        r_value: float | int | None = None,
        cluster_on: str = "noisy",
        max_passes: int = 100,
        s_rule: str = "round",
        min_range: float | None = 1e-3,
        chunk_size: int = 1000,
        n_init: int = 1,
        kmeans_dims: int | None = KMEANS_DIMS,
        n_probe: int | None = None,
        eval_dtype: str = "auto",
        n_jobs: int | None = None,
        ledger="auto",
        budget: tuple[float, float] | None = None,
        insecure_noise_seed: int | None = None,
    ) -> None:
        self.n_components = n_components
        self.n_layers = n_layers
        self.block_size = block_size
        self.random_state = random_state
        self.epsilon = epsilon
        self.record_epsilon = record_epsilon
        self.record_delta = record_delta
        self.delta = delta
        self.bounds = bounds
        self.d = d
        self.dp_data = dp_data
        self.r_source = r_source
        self.r_value = r_value
        self.cluster_on = cluster_on
        self.max_passes = max_passes
        self.s_rule = s_rule
        self.min_range = min_range
        self.chunk_size = chunk_size
        self.n_init = n_init
        self.kmeans_dims = kmeans_dims
        self.n_probe = n_probe
        self.eval_dtype = eval_dtype
        self.n_jobs = n_jobs
        self.ledger = ledger
        self.budget = budget
        self.insecure_noise_seed = insecure_noise_seed

    # ------------------------------------------------------------------ fitting
    def _wide(self, seed: np.random.SeedSequence) -> WideKAHM:
        return WideKAHM(
            self.n_components,
            self.n_layers,
            self.block_size,
            random_state=seed,
            n_init=self.n_init,
            kmeans_dims=self.kmeans_dims,
            s_rule=self.s_rule,
            min_range=self.min_range,
            chunk_size=self.chunk_size,
            eval_dtype=self.eval_dtype,
        )

    def fit(self, X, y, *, partition=None, partition_public: bool = False, released_from=None) -> KAHMClassifier:
        """Fit one wide deep KAHM per class.

        X : (N, p) training rows; y : (N,) labels of any type.
        partition : optional (N,) integer branch labels within each class. When given, it
            replaces every k-means step: it is the Remark 4 partition and the branches of
            the class models (this is what the Dask pipeline does with dask-ml labels).
        partition_public : whether ``partition`` was made without looking at the private rows
            (e.g. from public metadata). By default a DP fit treats a given partition as
            computed from them: it warns with ``PrivacyLeakWarning`` and the privacy statement
            names it.
        released_from : the :class:`~kahm_dask.dp_dataset.DPDataset` whose published rows X and
            labels y are (or a subset of them, e.g. a cross-validation split; the caller vouches).
            Fitting on a DP release is post-processing: it needs ``epsilon=None`` (the rows are
            DP already), spends nothing, and ``privacy_statement_`` is the release's, marked
            "trained on a DP release" (:meth:`PrivacyStatement.post_processing
            <kahm_dask.privacy.statement.PrivacyStatement.post_processing>`).
        """
        self._check_params()
        if released_from is not None and self.epsilon is not None:
            raise ValueError("released_from: the rows of a DP release are private already; fit them with "
                             "epsilon=None (post-processing spends nothing), not with a second release.")
        y = check_label_types(y)
        X, y = validate_data(self, X, y, dtype=[np.float64, np.float32], ensure_min_samples=2)
        check_n_components(self.n_components, X.shape[1], stacklevel=2)
        check_classification_targets(y)
        classes, y_idx = np.unique(y, return_inverse=True)
        check_n_classes(classes.tolist())
        self.classes_ = classes
        counts = np.bincount(y_idx, minlength=len(self.classes_))
        if counts.min() < 2:
            bad = self.classes_[counts < 2].tolist()
            raise ValueError(
                f"class(es) {bad} have 1 sample; a KAHM needs at least 2 samples per class."
            )
        labels = None if partition is None else check_partition(partition, X.shape[0], 1)[0]
        root = as_seed_sequence(self.random_state)
        private = self._set_entry_epsilon(X.shape[1]) is not None
        X_noisy = self._release(X, caller_partition=labels is not None and not partition_public) if private else None
        recipe = self._recipe()

        def fit_class(c: int) -> tuple[WideKAHM, np.ndarray | None, list[int | None] | None]:
            rows = y_idx == c
            return self._fit_class(
                recipe,
                X[rows],
                None if X_noisy is None else X_noisy[rows],
                None if labels is None else labels[rows],
                self._wide(child_seed_sequence(root, PARTITION_STREAM, c)),
            )

        fitted = in_threads(fit_class, range(len(self.classes_)), self.n_jobs)
        models = [model for model, _, _ in fitted]
        dp_rows = {label: dp for label, (_, dp, _) in zip(self.classes_, fitted, strict=True)}
        passes = {label: n for label, (_, _, n) in zip(self.classes_, fitted, strict=True)}
        self.models_ = models
        self.n_branches_ = np.array([m.n_branches_ for m in models])
        if private:
            self.dp_data_ = dp_rows
            if self.dp_data == "fabricated":
                self.fabrication_passes_ = passes
        elif released_from is not None:
            self.privacy_statement_ = released_from.statement.post_processing(released_from.release_id)
        return self

    def _set_entry_epsilon(self, n_features: int) -> float | None:
        """Set and return ``epsilon_``, the ε per entry of a release of rows with ``n_features``
        features: ``epsilon`` as given, else the one solved from ``record_epsilon`` (and
        ``record_delta``, ``delta``) by :func:`~kahm_dask.privacy.accounting.entry_epsilon`, else
        None (no release). ``fit``, :func:`~kahm_dask.dp_dataset.release_dataset` and
        ``kahm-dask release``'s fabrication all set it here."""
        self.epsilon_ = entry_epsilon(self.epsilon, self.record_epsilon, n_features, record_delta=self.record_delta,
                                      delta=self.delta)
        return self.epsilon_

    def _recipe(self) -> TrainParams:
        return TrainParams(
            self.n_components,
            self.n_layers,
            self.min_range,
            self.epsilon_,
            self.dp_data,
            self.r_source,
            self.r_value,
            self.max_passes,
            self.chunk_size,
        )

    def _fit_class(
        self,
        recipe: TrainParams,
        X_c: np.ndarray,
        X_noisy_c: np.ndarray | None,
        part: np.ndarray | None,
        wide: WideKAHM,
    ) -> tuple[WideKAHM, np.ndarray | None, list[int | None] | None]:
        """The model of one class from its rows X_c (N_c, p) and noisy rows X⁺_c (N_c, p) or None.

        Returns the fitted ``wide``, the (N_c, p) DP rows it was built on (None when not
        private) and the M̃ of each fabricated branch (None unless fabricated). As in the Dask
        pipeline: one partition (``part``, or the k-means of ``wide`` on the noisy rows; on X_c
        when not private or with ``cluster_on="original"``), whose parts are at once the
        Remark 4 subsets and the branches, and one application of the per-cluster recipe
        (:meth:`TrainParams.fit_cluster <kahm_dask.recipe.TrainParams.fit_cluster>`) per part
        (docs/algorithm.md#pipeline).
        """
        rows, branch, ids = self._branches(X_c, X_noisy_c, part, wide)
        fits = [
            recipe.fit_cluster(
                rows[branch == s],
                X_c[branch == s] if recipe.reads_private_rows else None,
            )
            for s in ids
        ]
        model = wide.assemble([fit.model for fit in fits], branch)
        if not recipe.private:
            return model, None, None
        dp = np.empty(rows.shape, dtype=fits[0].dp_rows.dtype)  # noisy: the rows' dtype; fabricated: float64
        for s, fit in zip(ids, fits, strict=True):
            dp[branch == s] = fit.dp_rows
        return model, dp, [fit.n_passes for fit in fits] if recipe.fabricates else None

    def _branches(
        self, X_c: np.ndarray, X_noisy_c: np.ndarray | None, part: np.ndarray | None, wide: WideKAHM
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One class's partition: the rows the recipe reads (X⁺_c when private, else X_c), their
        (N_c,) branch labels (``part``, or the k-means of ``wide``: on X_c with
        ``cluster_on="original"``) and the (S,) distinct labels."""
        rows = X_c if X_noisy_c is None else X_noisy_c  # in the data's dtype: the weights' precision
        data = as_data_matrix(rows, "X")
        on_private = X_noisy_c is not None and self.cluster_on == "original"
        branch, ids = wide.branch_labels(as_data_matrix(X_c, "X") if on_private else data, part)
        return rows, branch, ids

    def _release(self, X: np.ndarray, *, caller_partition: bool, what: str | None = None) -> np.ndarray:
        """The DP release of X (clip, exact discrete noise), paid for by its rows in the ledger
        before the noise is drawn (:func:`~kahm_dask.privacy.release.begin_release`); sets
        ``privacy_statement_`` and ``release_id_``. ``what``: the ledger entry's description."""
        bounds = resolve_bounds(self.bounds, X, stacklevel=3)
        warn_if_clipped(clipped_share(X, bounds.lower, bounds.upper), bounds.lower, bounds.upper, stacklevel=3)
        release = begin_release(
            self.epsilon_,
            bounds.lower,
            bounds.upper,
            bounds.source,
            scaling=bounds.scaling,
            ledger=self.ledger,
            data=X,
            budget=check_budget(self.budget),
            what=what or f"KAHMClassifier.fit: {self.dp_data} rows of a {X.shape[0]} x {X.shape[1]} matrix",
            delta=self.delta,
            record_delta=self.record_delta,
            d=self.d,
            dp_data=self.dp_data,
            r_source=self.r_source,
            cluster_on=self.cluster_on,
            caller_partition=caller_partition,
            insecure_noise=self.insecure_noise_seed is not None,
            stacklevel=3,
        )
        X_noisy = release.mechanism.release(X, as_noise_source(self.insecure_noise_seed), dtype=X.dtype)
        self.privacy_statement_ = release.statement
        self.release_id_ = release.release_id
        return X_noisy

    # --------------------------------------------------------------- evaluation
    def class_distances(self, X) -> np.ndarray:
        """Per-class distances ``Γ_{W_c}(x)`` (eq. 64) of the rows of X → (m, C), evaluated with
        the current ``n_probe`` and ``eval_dtype``. Nothing is cached: to reuse one evaluation for
        several reports, compute it once and pass the distances on (e.g.
        :func:`~kahm_dask.privacy.membership.membership_evaluation`)."""
        check_is_fitted(self, "models_")
        X = validate_data(self, X, dtype=np.float64, reset=False)
        eval_dtype(self.eval_dtype, type(self).__name__)
        return self._class_distances(X)

    def _class_distances(self, X: np.ndarray) -> np.ndarray:
        out = np.empty((X.shape[0], len(self.models_)))
        n_probe, dtype = self.n_probe, self.eval_dtype

        def one_block(rows: slice) -> None:
            for c, model in enumerate(self.models_):
                out[rows, c] = model._distance_rows(X[rows], n_probe=n_probe, dtype=dtype)[0]

        in_threads(one_block, row_chunks(X.shape[0], self._block_rows()), self.n_jobs)
        return out

    def _block_rows(self) -> int:
        """Rows per block of an evaluation: one cache/BLAS-sized block goes through every class,
        branch and layer while it is hot (docs/performance.md); with routing, larger blocks, so
        that each branch meets enough of the rows that probe it."""
        return min(self.chunk_size, EVAL_BLOCK_ROWS if self.n_probe is None else ROUTED_BLOCK_ROWS)

    def _map_distances(self, X, fn, *, rows: bool, dtype) -> np.ndarray:
        return fn(self.class_distances(X))

    def _certified_labels(self, X) -> np.ndarray:
        """Labels (m,) by the certified prediction (docs/algorithm.md#certified-prediction): per
        block of rows, every class model in float32 with its proven bound (on the ``n_probe``
        branches of nearest centre when routing); the rows whose class the bounds do not decide,
        again in float64 under the classes that may still be theirs
        (:func:`~kahm_dask.float32_bound.candidate_classes`). Equal to the argmin of the float64
        :meth:`class_distances`."""
        check_is_fitted(self, "models_")
        X = validate_data(self, X, dtype=np.float64, reset=False)
        codes = np.empty(X.shape[0], dtype=np.int64)
        n_probe = self.n_probe

        def one_block(rows: slice) -> None:
            x = X[rows]
            lower, upper = np.empty((x.shape[0], len(self.models_))), np.empty((x.shape[0], len(self.models_)))
            for c, model in enumerate(self.models_):
                _, lower[:, c], upper[:, c] = model._distance_intervals(x, "float32", n_probe)
            found = certified_argmin(lower, upper)
            again = np.flatnonzero(found < 0)
            if again.size:
                candidates = candidate_classes(lower[again], upper[again])
                D = np.full(candidates.shape, np.inf)
                for c, model in enumerate(self.models_):
                    which = np.flatnonzero(candidates[:, c])
                    if which.size:
                        D[which, c] = model._distance_rows(x[again[which]], n_probe=n_probe, dtype="float64")[0]
                found[again] = np.argmin(D, axis=1)
            codes[rows] = found

        in_threads(one_block, row_chunks(X.shape[0], self._block_rows()), self.n_jobs)
        return self.classes_[codes]
