"""The privacy statement of a release, generated from the settings actually used.

One place decides which settings weaken the guarantee (:func:`weakenings`); the estimator and
the pipeline warn with :class:`~kahm_dask.privacy.randomness.PrivacyLeakWarning` for each of
them at fit time, and the statement names each of them. See docs/privacy.md for the threat model.

Examples
--------
>>> import numpy as np
>>> from kahm_dask.privacy.noise import GridLaplace
>>> from kahm_dask.privacy.bounds import BOUNDS_PUBLIC
>>> mech = GridLaplace(epsilon=2.0, lower=np.zeros(64), upper=np.ones(64))
>>> s = PrivacyStatement.from_settings(mech, BOUNDS_PUBLIC, dp_data="fabricated")
>>> s.weakenings
[]
>>> print(s.to_markdown().splitlines()[0])
## Privacy statement
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from kahm_dask.privacy.accounting import RECORD_DELTA, RecordEpsilon, at_unit, record_epsilon, unit_factor
from kahm_dask.privacy.bounds import BOUNDS_PRIVATE, BOUNDS_PRIVATE_SCALING, Scaling
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import PrivacyLeakWarning

__all__ = ["PrivacyStatement", "weakenings", "warn_weakenings", "plan_release"]

SEEDED_NOISE = "the noise was drawn from a fixed seed (insecure_noise_seed): NOT differentially private"
PRIVATE_BOUNDS = "the bounds (and d) were taken from the private data: each feature's min and max is released"
PRIVATE_SCALING = ("the features were scaled by the private rows' min and max of each feature: one entry can move "
                   "a whole column, which the guarantee does not cover")

CALLER_PARTITION = (
    "fit(partition=...): the branches were given by the caller and are treated as computed from the private "
    "rows (pass partition_public=True only for a partition known without looking at them)"
)

NOT_COVERED = [
    "the labels (class of each row), and hence the exact number of rows of each class",
    "the presence or absence of a record (the guarantee is for the value of one entry, not for "
    "adding or removing a row)",
    "the number of rows and features of the data set",
]


def weakenings(
    *,
    bounds_source: str,
    r_source: str | None = None,
    cluster_on: str | None = None,
    caller_partition: bool = False,
    insecure_noise: bool = False,
    delta: float = 0.0,
    d_below_width: bool = False,
) -> list[str]:
    """Every setting in use that weakens the guarantee, in words (empty: none)."""
    out = []
    if insecure_noise:
        out.append(SEEDED_NOISE)
    if bounds_source == BOUNDS_PRIVATE:
        out.append(PRIVATE_BOUNDS)
    if bounds_source == BOUNDS_PRIVATE_SCALING:
        out.append(PRIVATE_SCALING)
    if r_source == "private":
        out.append(
            "r_source='private': the smoother stops at the private rows' modelling error, so the number "
            "of passes (and the fabricated rows) depend on private data beyond the noisy rows"
        )
    if cluster_on == "original":
        out.append(
            "cluster_on='original': the k-means partition of the class models (and of the fabrication) is "
            "computed on the private rows"
        )
    if caller_partition:
        out.append(CALLER_PARTITION)
    if d_below_width:
        out.append("d is smaller than the bound width: ε per entry covers changes of at most d; a change "
                   "anywhere in the bounds is covered (and charged) only at the larger ε of group privacy")
    if delta > 0:
        out.append(f"delta = {delta:g}: each entry is released without noise with probability delta")
    return out


def warn_weakenings(items: list[str], *, stacklevel: int = 2) -> None:
    """One :class:`PrivacyLeakWarning` per weakening (bounds are warned where they are taken)."""
    for text in items:
        if text not in (SEEDED_NOISE, PRIVATE_BOUNDS, PRIVATE_SCALING):  # warned where they happen
            warnings.warn(text, PrivacyLeakWarning, stacklevel=stacklevel + 1)


@dataclass(frozen=True)
class PrivacyStatement:
    """What a DP release guarantees, from the mechanism and the settings that made it.

    ``mechanism``: :meth:`GridLaplace.describe() <kahm_dask.privacy.noise.GridLaplace.describe>`
    (bounds and d in feature units); ``n_features``: p, for the per-record ε, stated at
    ``record_delta``; ``unit_factor``: k = ⌈bound width / d⌉, the changes of d that make one entry's
    change anywhere in its bounds (:func:`~kahm_dask.privacy.accounting.unit_factor`); ``raw``: the bounds
    and d in the owner's raw units and the scaling between them (:class:`~kahm_dask.privacy.bounds.Scaling`),
    when known. ``trained_on``: set on the statement of a model fitted on a published DP release
    (:meth:`post_processing`): that release's id.
    """

    mechanism: dict
    bounds_source: str
    dp_data: str
    weakenings: list[str] = field(default_factory=list)
    not_covered: list[str] = field(default_factory=lambda: list(NOT_COVERED))
    n_features: int | None = None
    raw: dict | None = None
    record_delta: float = RECORD_DELTA
    unit_factor: int = 1
    trained_on: str | None = None

    @classmethod
    def from_settings(
        cls,
        mechanism: GridLaplace,
        bounds_source: str,
        *,
        dp_data: str,
        r_source: str | None = None,
        cluster_on: str | None = None,
        caller_partition: bool = False,
        insecure_noise: bool = False,
        scaling: Scaling | None = None,
        record_delta: float = RECORD_DELTA,
    ) -> PrivacyStatement:
        items = weakenings(
            bounds_source=bounds_source,
            r_source=r_source if dp_data == "fabricated" else None,
            cluster_on=cluster_on,  # the partition reads the rows whatever dp_data
            caller_partition=caller_partition,
            insecure_noise=insecure_noise,
            delta=mechanism.delta,
            d_below_width=bool((mechanism.d < mechanism.upper - mechanism.lower).any()),
        )
        raw = None
        if scaling is not None and scaling.kind != "none":
            raw = {**scaling.describe(), "d": _compact(scaling.raw_d(mechanism.d))}
        return cls(mechanism.describe(), bounds_source, dp_data, items, n_features=mechanism.n_features, raw=raw,
                   record_delta=record_delta, unit_factor=unit_factor(mechanism.lower, mechanism.upper, mechanism.d))

    def post_processing(self, release_id: str) -> PrivacyStatement:
        """This statement, for a model trained on the DP release ``release_id``: post-processing,
        which spends nothing more and is covered by the release's guarantee."""
        return replace(self, trained_on=release_id)

    @property
    def holds(self) -> bool:
        """False when the noise was seeded: then there is no guarantee at all."""
        return SEEDED_NOISE not in self.weakenings

    @property
    def epsilon_per_unit(self) -> tuple[float, float]:
        """(ε, δ) of one entry changing anywhere in its bounds: the ledger's charge
        (:func:`~kahm_dask.privacy.accounting.at_unit`; the mechanism's (ε, δ) when d is the width)."""
        return at_unit(self.mechanism["epsilon"], self.mechanism["delta"], self.unit_factor)

    @property
    def epsilon_per_record(self) -> RecordEpsilon | None:
        """The ε of a whole record (p entries, each anywhere in its bounds): PLD at
        ``record_delta`` (plus the entries' δ, p·δ, when δ > 0) beside the basic p·ε; None if p
        is unknown (:func:`~kahm_dask.privacy.accounting.record_epsilon`)."""
        if self.n_features is None:
            return None
        eps, delta = self.epsilon_per_unit
        return record_epsilon(eps, self.n_features, self.record_delta + self.n_features * delta, delta)

    def to_dict(self) -> dict:
        return {**asdict(self), "holds": self.holds}

    def to_markdown(self) -> str:
        """The statement for a reader who is not a DP specialist: what is protected, each number
        with its meaning in one line, what is released and what is not covered."""
        m = self.mechanism
        eps, delta = m["epsilon"], m["delta"]
        kind = "ε-DP" if delta == 0 else "(ε, δ)-DP"
        p = self.n_features
        lines = ["## Privacy statement", ""]
        if self.trained_on is not None:
            lines += [f"**Trained on a DP release: post-processing.** This model was fitted on the published "
                      f"rows of release {self.trained_on}; it spent nothing more, and the release's guarantee "
                      "below covers it.", ""]
        if not self.holds:
            lines += ["**No guarantee: the noise was drawn from a fixed seed (tests only).**", ""]
        lines += [
            f"**What is protected: each entry of the training data** (one value of one feature of one row). "
            f"The release is {kind} with ε = {eps:g} per entry: changing any one entry by at most d changes "
            f"the probability of every published output by a factor of at most e^{eps:g} ≈ {math.exp(eps):.3g}"
            + (f", except with probability δ = {delta:g}." if delta else "."),
            "",
            "| | value | what it means |",
            "|---|---|---|",
            f"| ε per entry | {eps:g} | the privacy loss for a change of one entry by at most d |",
        ]
        k = self.unit_factor
        if k > 1:
            lines.append(f"| ε per entry at the data set's unit | {self.epsilon_per_unit[0]:.4g} | d is below the "
                         f"bound width: a change of one entry anywhere in its bounds is {k} changes of d, covered at "
                         f"{k} × ε (group privacy); the ledger is charged this |")
        record = self.epsilon_per_record
        if record is not None:
            lines += [
                f"| ε per record ({p} features, δ = {record.delta:.3g}) | {record.pld:.3g} | a whole row differs in "
                f"up to {p} entries: the exact composition of their losses (privacy loss distribution), an upper "
                "bound |",
                f"| ε per record, basic bound | {record.basic:.4g} | {p} × ε{'' if k == 1 else f' × {k}'}: the plain "
                "sum of the losses, a looser bound |",
            ]
        lines += [
            f"| δ | {delta:g} | the probability that an entry is released without noise"
            + (" (0: pure ε-DP) |" if delta == 0 else " |"),
            f"| d | {self._in_units('d')} | the largest change of one entry that the guarantee covers "
            "(default: the width of the bounds, so any change is covered) |",
            f"| bounds | {self._bounds_text()} | every entry is clipped to them before the noise; "
            f"source: {self.bounds_source} |",
            f"| mechanism | {m['mechanism']} | noise from "
            + ("the operating system's secure random generator, never from a seed |" if self.holds
               else "a fixed seed: anyone who knows it removes the noise |"),
            f"| grid | step d/{m['resolution']}, sensitivity {m['sensitivity_steps']} steps | entries are "
            f"rounded to a public grid before the noise, so a change of d moves an entry by at most "
            f"{m['sensitivity_steps']} grid steps ({m['resolution']} plus one for the rounding) |",
            f"| ε actually used | {m['epsilon_used']:.6g} | the noise drawn is a little wider than ε requires "
            "(its ratio is rounded up), never narrower |",
            "",
            *([] if record is None else [
                f"**What ε per record means:** single values are protected at ε = {eps:g}; a whole record is "
                f"protected at ε = {record.pld:.3g}, and above ε ≈ 10 a record is not meaningfully protected "
                "(an observer's odds on anything about the row may grow by e^ε).", ""]),
            f"**Released (may be published):** the {self.dp_data} DP rows and the models fitted on them, "
            "nothing else computed from the private rows. Anything computed from the release is covered "
            "too (post-processing).",
            "",
            "**Labels:** each row's class is used as it is, without noise; the number of rows of each class "
            "is published exactly.",
            "",
            "**Not covered:** " + "; ".join(self.not_covered) + ".",
            "",
            "**Settings that weaken it:** " + ("; ".join(self.weakenings) + "." if self.weakenings else "none."),
        ]
        return "\n".join(lines) + "\n"

    def _in_units(self, key: str) -> str:
        """``key`` of the mechanism in feature units, with the raw units beside when known."""
        text = _fmt(self.mechanism[key])
        if self.raw is None:
            return text
        return f"{_fmt(self.raw[key])} in raw units ({text} after {self.raw['kind']} scaling)"

    def _bounds_text(self) -> str:
        m = self.mechanism
        scaled = f"[{_fmt(m['lower'])}, {_fmt(m['upper'])}]"
        if self.raw is None:
            return scaled
        return (f"[{_fmt(self.raw['raw_lower'])}, {_fmt(self.raw['raw_upper'])}] in raw units "
                f"({scaled} after {self.raw['kind']} scaling)")


def _fmt(v) -> str:
    if isinstance(v, list):
        return f"per feature, {min(v):g} to {max(v):g}"
    return f"{v:g}"


def _compact(a) -> float | list[float]:
    a = np.atleast_1d(np.asarray(a, dtype=np.float64))
    return float(a[0]) if np.all(a == a[0]) else [float(v) for v in a]


def plan_release(
    epsilon: float,
    lower,
    upper,
    bounds_source: str,
    *,
    delta: float,
    d,
    dp_data: str,
    r_source: str,
    cluster_on: str,
    insecure_noise: bool,
    caller_partition: bool = False,
    scaling: Scaling | None = None,
    record_delta: float = RECORD_DELTA,
    stacklevel: int = 2,
) -> tuple[GridLaplace, PrivacyStatement]:
    """The mechanism of a release and its statement, with one warning per weakening setting
    (the first step of :func:`kahm_dask.privacy.release.begin_release`)."""
    mechanism = GridLaplace(epsilon, lower, upper, delta=delta, d=d)
    statement = PrivacyStatement.from_settings(
        mechanism,
        bounds_source,
        dp_data=dp_data,
        r_source=r_source,
        cluster_on=cluster_on,
        caller_partition=caller_partition,
        insecure_noise=insecure_noise,
        scaling=scaling,
        record_delta=record_delta,
    )
    warn_weakenings(statement.weakenings, stacklevel=stacklevel + 1)
    return mechanism, statement
