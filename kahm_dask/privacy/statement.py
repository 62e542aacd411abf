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

import warnings
from dataclasses import asdict, dataclass, field

from kahm_dask.privacy.bounds import BOUNDS_PRIVATE
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import PrivacyLeakWarning

__all__ = ["PrivacyStatement", "weakenings", "warn_weakenings", "plan_release"]

SEEDED_NOISE = "the noise was drawn from a fixed seed (insecure_noise_seed): NOT differentially private"
PRIVATE_BOUNDS = "the bounds (and d) were taken from the private data: each feature's min and max is released"

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
    if d_below_width:
        out.append("d is smaller than the bound width: changes of an entry by more than d are not covered")
    if delta > 0:
        out.append(f"delta = {delta:g}: each entry is released without noise with probability delta")
    return out


def warn_weakenings(items: list[str], *, stacklevel: int = 2) -> None:
    """One :class:`PrivacyLeakWarning` per weakening (bounds are warned where they are taken)."""
    for text in items:
        if text not in (SEEDED_NOISE, PRIVATE_BOUNDS):  # warned where they happen
            warnings.warn(text, PrivacyLeakWarning, stacklevel=stacklevel + 1)


@dataclass(frozen=True)
class PrivacyStatement:
    """What a DP release guarantees, from the mechanism and the settings that made it."""

    mechanism: dict
    bounds_source: str
    dp_data: str
    weakenings: list[str] = field(default_factory=list)
    not_covered: list[str] = field(default_factory=lambda: list(NOT_COVERED))

    @classmethod
    def from_settings(
        cls,
        mechanism: GridLaplace,
        bounds_source: str,
        *,
        dp_data: str,
        r_source: str | None = None,
        cluster_on: str | None = None,
        insecure_noise: bool = False,
    ) -> PrivacyStatement:
        items = weakenings(
            bounds_source=bounds_source,
            r_source=r_source if dp_data == "fabricated" else None,
            cluster_on=cluster_on,  # the partition reads the rows whatever dp_data
            insecure_noise=insecure_noise,
            delta=mechanism.delta,
            d_below_width=bool((mechanism.d < mechanism.upper - mechanism.lower).any()),
        )
        return cls(mechanism.describe(), bounds_source, dp_data, items)

    @property
    def holds(self) -> bool:
        """False when the noise was seeded: then there is no guarantee at all."""
        return SEEDED_NOISE not in self.weakenings

    def to_dict(self) -> dict:
        return {**asdict(self), "holds": self.holds}

    def to_markdown(self) -> str:
        m = self.mechanism
        eps, delta = m["epsilon"], m["delta"]
        kind = "ε-DP" if delta == 0 else "(ε, δ)-DP"
        lines = ["## Privacy statement", ""]
        if not self.holds:
            lines += ["**No guarantee: the noise was drawn from a fixed seed (tests only).**", ""]
        lines += [
            f"- **Guarantee**: {kind} with ε = {eps:g}" + (f", δ = {delta:g}" if delta else "")
            + " per entry of the data matrix (element level): the release is nearly as likely "
            "whatever the value of any one entry, within d of its true value.",
            f"- **Mechanism**: {m['mechanism']}; grid step d/{m['resolution']}, sensitivity "
            f"{m['sensitivity_steps']} steps, ε used {m['epsilon_used']:.6g} (≤ ε); noise from "
            + ("the operating system's secure random generator." if self.holds
               else "a fixed seed (reproducible by anyone who knows it)."),
            f"- **d** (largest change of one entry that is covered): {_fmt(m['d'])}.",
            f"- **Bounds**: [{_fmt(m['lower'])}, {_fmt(m['upper'])}], from {self.bounds_source}; "
            "entries are clipped to them before noise.",
            "- **A whole record** of p features is covered at (p·ε, p·δ) by composition.",
            f"- **Released**: the {self.dp_data} DP rows and models fitted on them only "
            "(post-processing costs no privacy).",
            "- **Not covered**: " + "; ".join(self.not_covered) + ".",
        ]
        lines.append(
            "- **Settings that weaken it**: " + ("; ".join(self.weakenings) + "." if self.weakenings else "none.")
        )
        return "\n".join(lines) + "\n"


def _fmt(v) -> str:
    if isinstance(v, list):
        return f"per feature, {min(v):g} to {max(v):g}"
    return f"{v:g}"


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
    stacklevel: int = 2,
) -> tuple[GridLaplace, PrivacyStatement]:
    """The mechanism of a release and its statement, with one warning per weakening setting.

    The one place where the estimator and the pipeline turn their settings into a release.
    """
    mechanism = GridLaplace(epsilon, lower, upper, delta=delta, d=d)
    statement = PrivacyStatement.from_settings(
        mechanism,
        bounds_source,
        dp_data=dp_data,
        r_source=r_source,
        cluster_on=cluster_on,
        insecure_noise=insecure_noise,
    )
    warn_weakenings(statement.weakenings, stacklevel=stacklevel + 1)
    return mechanism, statement
