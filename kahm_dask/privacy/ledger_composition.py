"""How the releases of one row compose: the one place the ledger turns a row's history into (ε, δ).

Basic composition (Dwork & Roth, Theorem 3.16): releases of (ε_k, δ_k) that each cover a row are
together (Σ ε_k, Σ δ_k)-DP for that row's entries. It is the loose, always-valid bound; a tighter
accountant replaces :func:`compose` without touching the ledger.

Examples
--------
>>> compose([{"epsilon": 2.0, "delta": 0.0}, {"epsilon": 1.0, "delta": 1e-6}])
(3.0, 1e-06)
>>> exceeds((3.0, 0.0), (3.0, 0.0)), exceeds((3.5, 0.0), (3.0, 0.0))
(False, True)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["compose", "exceeds"]

# relative slack of the budget comparison: sums of floats (2 + 1 + ... ) may exceed the budget by rounding
_EPS_SLACK, _DELTA_SLACK = 1e-12, 1e-15


def compose(releases: Iterable[Mapping[str, Any]]) -> tuple[float, float]:
    """(Σ ε, Σ δ) of the releases (mappings with ``epsilon`` and ``delta``) that cover one row."""
    releases = list(releases)
    return (math.fsum(float(r["epsilon"]) for r in releases), math.fsum(float(r["delta"]) for r in releases))


def exceeds(spent: tuple[float, float], budget: tuple[float, float] | None) -> bool:
    """Whether ``spent`` (ε, δ) is beyond ``budget`` (None: no limit), up to float rounding."""
    if budget is None:
        return False
    return spent[0] > budget[0] * (1 + _EPS_SLACK) or spent[1] > budget[1] + _DELTA_SLACK
