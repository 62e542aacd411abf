"""The rules of the model and privacy parameters, each declared once.

:data:`PARAMS` gives every parameter its rule: the values it accepts, as a tuple of
scikit-learn constraints (``sklearn.utils._param_validation``; a value is valid when it
satisfies one of them), and a one-line meaning. :data:`R_VALUE_RULES` is the one cross-field
rule: what ``r_value`` must be for each ``r_source`` (:func:`check_r_value`).

Everything that takes these parameters reads them from here: ``KAHMClassifier``
(``_parameter_constraints``), the fabrication and S-rule functions (:func:`check_params`), the
pipeline YAML schema (:func:`kahm_dask.pipeline.config.schema.param`: defaults, ranges and
choices) and the options of ``kahm-dask train`` (generated: types, defaults, help).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import numpy as np
from sklearn.utils._param_validation import (
    HasMethods,
    Interval,
    InvalidParameterError,
    StrOptions,
    validate_parameter_constraints,
)

__all__ = [
    "Range",
    "Choices",
    "Param",
    "PARAMS",
    "CLASSIFIER_PARAMS",
    "PARTITION_PARAMS",
    "NOT_STORED_PARAMS",
    "PREDICTION_PARAMS",
    "defaults",
    "DEFAULT_PASSES",
    "RValueRule",
    "R_VALUE_RULES",
    "RuleError",
    "parameter_constraints",
    "check_params",
    "check_estimator_params",
    "check_r_value",
    "check_privacy_target",
    "FABRICATION_PARAMS",
    "unused_fabrication_settings",
]


class Range(Interval):
    """scikit-learn's ``Interval`` without booleans (``True`` is not the number 1 here), worded
    ``an int >= 1``, ``a float >= 0 and < 1``, ``a finite float > 0``."""

    def __init__(self, *args: Any, text: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.text = text

    def is_satisfied_by(self, val: Any) -> bool:
        return not isinstance(val, bool) and super().is_satisfied_by(val)

    def bounds_text(self) -> str:
        """``>= 1``, ``> 0``, ``>= 0 and < 1``; ``in (0, 1)`` when both ends are open; ``text``
        when given (a bound better said in words)."""
        if self.text is not None:
            return self.text
        if self.closed == "neither" and self.left is not None and self.right is not None:
            return f"in ({self.left}, {self.right})"
        left = ">=" if self.closed in ("left", "both") else ">"
        right = "<=" if self.closed in ("right", "both") else "<"
        ends = ((left, self.left), (right, self.right))
        return " and ".join(f"{op} {end}" for op, end in ends if end is not None)

    def __str__(self) -> str:
        kind = "an int" if self.type is Integral else "a float" if self.right is not None else "a finite float"
        return f"{kind} {self.bounds_text()}"


class Choices(StrOptions):
    """scikit-learn's ``StrOptions`` in the declared order (for messages, the CLI's choices and
    the YAML schema's literals)."""

    def __init__(self, *choices: str) -> None:
        super().__init__(set(choices))
        self.choices = choices

    def __str__(self) -> str:
        return "one of " + ", ".join(map(repr, self.choices))


@dataclass(frozen=True)
class Param:
    """One parameter: ``rule``, the constraints of which a valid value satisfies one,
    ``meaning``, and ``default``, its value when not given (the estimators' signatures and the
    pipeline file's keys are checked against it)."""

    rule: tuple[Any, ...]
    meaning: str
    default: Any = None

    @property
    def choices(self) -> tuple[str, ...]:
        """The allowed strings of a choice parameter; () for the others."""
        return next((c.choices for c in self.rule if isinstance(c, Choices)), ())

    @property
    def range(self) -> Range | None:
        """The allowed numbers of a number parameter; None for the others."""
        return next((c for c in self.rule if isinstance(c, Range)), None)


#: The smallest ε the release mechanism serves at its default grid (sensitivity 1025 steps):
#: below it exp(−ε/1025) rounds to 1.0 in float64 and there is no noise law to sample
#: (:func:`kahm_dask.privacy.noise.smallest_epsilon`; a test checks the two agree).
MIN_EPSILON = 2.8449465006019646e-13

#: The largest ε a release states: ln of the largest float64, above which the bound e^ε on the
#: change of any output's probability (the privacy statement's) is not a number (a test checks
#: that ``math.exp`` overflows just above it). No ε near it protects anything: e^709 ≈ 10^308.
MAX_EPSILON = 709.782712893384


def _at_least(low: int) -> Range:
    return Range(Integral, low, None, closed="left")


#: Smoother passes M̃ of ``r_source="passes"`` when ``r_value`` is None (chosen by accuracy,
#: docs/privacy.md "Choosing the defaults").
DEFAULT_PASSES = 8

PARAMS: dict[str, Param] = {
    "n_components": Param(
        (_at_least(1),), "subspace dimension n of every KAHM (docs/algorithm.md#kahm-guards)", default=20
    ),
    "n_layers": Param((_at_least(1),), "layers L of each deep KAHM (docs/algorithm.md#layer-dimensions)", default=1),
    "block_size": Param(
        (_at_least(1),), "N_b: a class of N_c rows gets about N_c / N_b branches (docs/algorithm.md#s-rule)",
        default=1000,
    ),
    "s_rule": Param(
        (Choices("round", "ceil"),), "rounding of N / N_b to the branch count S (docs/decisions.md#decision-s-rule)",
        default="round",
    ),
    "chunk_size": Param(
        (_at_least(1),), "rows per block when a KAHM is evaluated (docs/algorithm.md#batched-evaluation)",
        default=1000,
    ),
    "n_init": Param(
        (_at_least(1),), "k-means restarts of every partition (docs/decisions.md#decision-kmeans-settings)",
        default=1,
    ),
    "kmeans_dims": Param(
        (None, _at_least(1)),
        "principal coordinates every k-means runs in; None: all features (docs/algorithm.md#kmeans-space)",
        default=50,
    ),
    "n_probe": Param(
        (None, _at_least(1)),
        "branches per class evaluated for a query, those with the nearest centres; None: all "
        "(docs/algorithm.md#routing)",
        default=None,
    ),
    "eval_dtype": Param(
        (Choices("auto", "float64", "float32"),),
        "precision of the kernel block and its GEMM when queries are evaluated: auto (the default) gives "
        "float64 distances and predicts in float32 where a proof shows the float64 class (the rest again in "
        "float64; docs/algorithm.md#certified-prediction); float64 everywhere; or float32 everywhere, faster, "
        "distances within ~1e-5 relative (docs/algorithm.md#evaluation-precision)",
        default="auto",
    ),
    "n_jobs": Param(
        (None, Range(Integral, 1, None, closed="left"), Range(Integral, None, -1, closed="right")),
        "threads of fit and predict, one BLAS thread each (joblib convention: None 1, -1 all cores, -2 all but one)",
        default=None,
    ),
    "min_cluster_size": Param(
        (None, _at_least(1)),
        "smallest k-means part; None: max(30, n + 2) (docs/decisions.md#decision-min-cluster-size)",
        default=None,
    ),
    "oversampling_factor": Param(
        (None, Range(Real, 0, None, closed="neither")),
        "k-means|| candidates drawn per round for a class too large for one task; None: 2·S "
        "(docs/algorithm.md#kmeans-partition)",
        default=None,
    ),
    "init_max_iter": Param(
        (_at_least(1),), "k-means|| initialisation rounds of a class too large for one task", default=5
    ),
    "kmeans_max_iter": Param((_at_least(1),), "Lloyd iterations of every k-means partition", default=100),
    "max_cluster_rows": Param(
        (None, _at_least(2)),
        "rows above which a cluster is split further, bounding every training task's memory; None: no cap",
        default=None,
    ),
    "persist_fraction": Param(
        (Range(Real, 0, 1, closed="left"),),
        "a class too large for one task is held in worker memory during its k-means when its rows take at "
        "most this share of the workers' total memory, and all rows are partitioned in worker memory "
        "(no reordered copies in the work store) when they take at most this share and every class fits "
        "one task; 0: always through Zarr",
        default=0.25,
    ),
    "min_range": Param(
        (None, Range(Real, 0, None, closed="left")),
        "code range below which a KAHM direction is dropped; None or 0: no such rule (docs/algorithm.md#kahm-guards)",
        default=1e-3,
    ),
    "regularization": Param(
        (None, Range(Real, 0, None, closed="neither")),
        "a fixed λ of one KAHM in place of λ* of the fixed point (tests and ablations only; "
        "docs/algorithm.md#lambda-star)",
        default=None,
    ),
    "lambda_rtol": Param(
        (Range(Real, 0, None, closed="left"),),
        "the λ* fixed point stops when ê changes by at most lambda_rtol·s (docs/algorithm.md#lambda-star)",
        default=1e-10,
    ),
    "lambda_atol": Param(
        (None, Range(Real, 0, None, closed="neither")),
        "the author's stopping rule instead: when λ changes by at most this; None: lambda_rtol "
        "(docs/decisions.md#decision-lambda-stopping)",
        default=None,
    ),
    "lambda_max_iter": Param((_at_least(1),), "cap of the λ* fixed-point iterations", default=1000),
    "random_state": Param(
        (None, Range(Integral, 0, None, closed="left"), np.random.SeedSequence, np.random.Generator),
        "seeds the k-means steps only, never the DP noise (docs/algorithm.md#seed-streams)",
        default=None,
    ),
    "epsilon": Param(
        (None, Range(Real, MIN_EPSILON, MAX_EPSILON, closed="both",
                     text=f"> 0 (at least {MIN_EPSILON:.2g}) and at most {MAX_EPSILON:.6g} (e^ε overflows above it)")),
        "ε of the element-level DP release; None: the non-private model (docs/algorithm.md#adjacency)",
        default=None,
    ),
    "record_epsilon": Param(
        (None, Range(Real, 0, None, closed="neither")),
        "ε of a whole record (a row of p entries) at record_delta, in place of epsilon: the ε per entry "
        "is solved from it and p at fit by the PLD accountant (docs/privacy.md#record-level)",
        default=None,
    ),
    "record_delta": Param(
        (Range(Real, 0, 1, closed="neither"),),
        "δ of the record-level ε: the δ record_epsilon is met at and the privacy statement's per-record "
        "ε is stated at (docs/privacy.md#record-level)",
        default=1e-5,
    ),
    "delta": Param(
        (Range(Real, 0, 1, closed="left"),),
        "δ: probability that an entry is released without noise; 0: pure ε-DP (docs/decisions.md#decision-delta-zero)",
        default=0.0,
    ),
    "d": Param(
        (None, Range(Real, 0, None, closed="neither"), "array-like"),
        "adjacency bound, the largest change of one entry covered (per feature or one for all); "
        "None: the bound width (docs/algorithm.md#adjacency)",
        default=None,
    ),
    "bounds": Param(
        (None, "array-like"),
        "public (lower, upper) feature bounds the rows are clipped to; None: the data's min/max, "
        "which leaks (docs/decisions.md#decision-public-bounds)",
        default=None,
    ),
    "dp_data": Param(
        (Choices("fabricated", "noisy"),),
        "rows the DP class models are fitted to: the noisy rows, or rows fabricated from them "
        "(docs/algorithm.md#dp-classifier, docs/privacy.md#choosing-the-defaults)",
        default="noisy",
    ),
    "r_source": Param(
        (Choices("passes", "threshold", "private"),),
        "stopping rule of the fabrication; 'private' (r from the private rows) leaks "
        "(docs/algorithm.md#stopping-rule)",
        default="passes",
    ),
    "r_value": Param(
        (None, Range(Real, 0, None, closed="left")),
        f"the stopping rule's number: smoother passes for r_source 'passes' (None: {DEFAULT_PASSES}), the public "
        "per-row error for 'threshold', none for 'private' (docs/algorithm.md#stopping-rule)",
        default=None,
    ),
    "cluster_on": Param(
        (Choices("noisy", "original"),),
        "rows each class's k-means partition (its branches, the fabrication's subsets) runs on; 'original' "
        "(the private rows) leaks "
        "(docs/algorithm.md#big-data-fabrication)",
        default="noisy",
    ),
    "max_passes": Param(
        (_at_least(1),), "cap M_max of the smoother passes of an r rule (docs/decisions.md#decision-smoother-cap)",
        default=100,
    ),
    "ledger": Param(
        (None, str, os.PathLike, HasMethods(["spend", "remaining"])),
        "privacy ledger of the data set: 'auto' (its ledger in the default ledger directory), a ledger "
        "directory, a PrivacyLedger, or None (no accounting: warns) (docs/privacy.md#ledger)",
        default="auto",
    ),
    "budget": Param(
        (None, "array-like"),
        "(ε, δ) cap on each released row's spend in the ledger: lowers a stored budget, never raises it; "
        "None: the stored one (docs/privacy.md#ledger)",
        default=None,
    ),
    "insecure_noise_seed": Param(
        (None, Range(Integral, 0, None, closed="left")),
        "tests only: draws the noise from this seed, which voids the DP guarantee",
        default=None,
    ),
}


@dataclass(frozen=True)
class RValueRule:
    """What ``r_value`` must be for one ``r_source``: in ``values`` (None: absent), or absent
    when ``optional``; ``meaning`` completes the error message."""

    values: Range | None
    optional: bool
    meaning: str

    def reason(self, r_source: str) -> str:
        if self.values is None:
            others = " or ".join(repr(s) for s, r in R_VALUE_RULES.items() if r.values is not None)
            return f"r_source {r_source!r} {self.meaning}; remove r_value or set r_source to {others}"
        absent = " or no r_value (the default)" if self.optional else ""
        return f"r_source {r_source!r} needs {self.values} ({self.meaning}){absent}"


#: The parameters of :class:`~kahm_dask.KAHMClassifier`, in signature order.
CLASSIFIER_PARAMS: tuple[str, ...] = (
    "n_components", "n_layers", "block_size", "random_state", "epsilon", "record_epsilon", "record_delta", "delta",
    "bounds", "d", "dp_data",
    "r_source", "r_value", "cluster_on", "max_passes", "s_rule", "min_range", "chunk_size", "n_init",
    "kmeans_dims", "n_probe", "eval_dtype", "n_jobs", "ledger", "budget", "insecure_noise_seed",
)
#: The partition parameters of the out-of-core k-means, which only the Dask pipeline has: with
#: :data:`CLASSIFIER_PARAMS`, the parameters :class:`~kahm_dask.DaskKAHMClassifier` shares with
#: every face (pipeline file, ``kahm-dask train``, the model store's manifest).
PARTITION_PARAMS: tuple[str, ...] = (
    "min_cluster_size", "oversampling_factor", "init_max_iter", "kmeans_max_iter", "max_cluster_rows",
    "persist_fraction",
)
#: Not written to a model store: where the fit ran and test-only settings (``ledger``, ``budget``:
#: the owner's accounting; ``insecure_noise_seed``: a test's noise; ``n_jobs``: this machine's threads).
NOT_STORED_PARAMS: tuple[str, ...] = ("ledger", "budget", "insecure_noise_seed", "n_jobs")


#: Parameters of the prediction, not of the model: a fitted estimator may change them, and a
#: training run neither reads nor records them (``n_probe``: the routing; ``eval_dtype``: the precision).
PREDICTION_PARAMS: tuple[str, ...] = ("n_probe", "eval_dtype")


#: Parameters that only the fabrication reads: with ``dp_data="noisy"`` nothing is fabricated.
FABRICATION_PARAMS: tuple[str, ...] = ("r_source", "r_value", "max_passes")


def unused_fabrication_settings(values: Mapping[str, Any]) -> list[str]:
    """The names of :data:`FABRICATION_PARAMS` that ``values`` sets away from their defaults
    while its ``dp_data`` (default :data:`PARAMS`' default) fabricates nothing.

    >>> unused_fabrication_settings({"dp_data": "noisy", "r_value": 3, "max_passes": 100})
    ['r_value']
    >>> unused_fabrication_settings({"dp_data": "fabricated", "r_value": 3})
    []
    """
    if values.get("dp_data", PARAMS["dp_data"].default) != "noisy":
        return []
    return [name for name in FABRICATION_PARAMS if name in values and values[name] != PARAMS[name].default]


def defaults(*names: str) -> dict[str, Any]:
    """The default value of each parameter of ``names``."""
    return {name: PARAMS[name].default for name in names}


#: ``r_value`` by ``r_source`` (docs/algorithm.md#stopping-rule).
R_VALUE_RULES: dict[str, RValueRule] = {
    "passes": RValueRule(_at_least(1), True, "the number of smoother passes"),
    "threshold": RValueRule(Range(Real, 0, None, closed="left"), False, "the public modelling error per row"),
    "private": RValueRule(None, False, "computes r itself from the private rows"),
}


class RuleError(InvalidParameterError):
    """A parameter breaks a cross-field rule; ``name``, ``value`` and ``reason`` say how."""

    def __init__(self, name: str, value: Any, reason: str, caller: str) -> None:
        self.name, self.value, self.reason = name, value, reason
        super().__init__(f"The {name!r} parameter of {caller} is invalid: {reason}. Got {value!r} instead.")


def parameter_constraints(*names: str) -> dict[str, list[Any]]:
    """The rules of ``names`` in the form of scikit-learn's ``_parameter_constraints``."""
    return {name: list(PARAMS[name].rule) for name in names}


def check_r_value(r_source: str, r_value: Any, caller: str) -> int | float | None:
    """``r_value`` as a valid ``r_source`` needs it (an int number of passes, a float threshold,
    or None), or raise :class:`RuleError`."""
    rule = R_VALUE_RULES[r_source]
    if r_value is None:
        valid = rule.values is None or rule.optional
    else:
        valid = rule.values is not None and rule.values.is_satisfied_by(r_value)
    if not valid:
        raise RuleError("r_value", r_value, rule.reason(r_source), caller)
    if r_value is None:
        return None
    return int(r_value) if rule.values.type is Integral else float(r_value)


def check_privacy_target(epsilon: Any, record_epsilon: Any, caller: str) -> None:
    """Exactly one of ``epsilon`` (per entry) and ``record_epsilon`` (per record) sets a DP fit's
    ε (neither: the non-private model), or raise :class:`RuleError`."""
    if epsilon is not None and record_epsilon is not None:
        raise RuleError("record_epsilon", record_epsilon,
                        f"set epsilon (per entry) or record_epsilon (per record), not both (epsilon = {epsilon!r})",
                        caller)


def check_estimator_params(estimator: Any) -> None:
    """Check the parameters of ``estimator`` against its ``_parameter_constraints`` (rules of
    this table, :func:`parameter_constraints`); scikit-learn's ``InvalidParameterError`` names
    the first one that breaks its rule and the estimator's class."""
    validate_parameter_constraints(estimator._parameter_constraints, estimator.get_params(deep=False),
                                   type(estimator).__name__)


def check_params(params: Mapping[str, Any], caller: str) -> None:
    """Check ``params`` (names of :data:`PARAMS`) against their rules, then ``r_value`` against
    ``r_source`` if both are given; raises scikit-learn's ``InvalidParameterError`` (a
    ``ValueError`` and a ``TypeError``) naming ``caller``."""
    validate_parameter_constraints(parameter_constraints(*params), dict(params), caller)
    if "r_source" in params and "r_value" in params:
        check_r_value(params["r_source"], params["r_value"], caller)
