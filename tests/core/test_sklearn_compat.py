"""scikit-learn estimator checks for the public estimators.

Every estimator must pass every check. A check that fails because of a library problem goes
into ``BUGS`` as a strict xfail with a "BUG:" reason (reported, not skipped); a failure inherent
to the method goes into ``INHERENT`` (``expected_failed_checks``) with its reason. Both are
empty today.
"""

from __future__ import annotations

import functools

import pytest
from sklearn.utils.estimator_checks import check_param_validation, parametrize_with_checks

from kahm_dask import KAHM, DeepKAHM, KAHMClassifier, WideKAHM

#: Inherent to the method (passed to parametrize_with_checks as expected failures).
INHERENT: dict[str, dict[str, str]] = {}

#: Library problems (strict xfail, reported).
BUGS: dict[str, dict[str, str]] = {}


def _expected_failed(estimator):
    return INHERENT.get(type(estimator).__name__, {})


def _check_name(check) -> str:
    while isinstance(check, functools.partial):
        check = check.func
    return check.__name__


@parametrize_with_checks(
    [
        KAHMClassifier(n_components=3, n_layers=2, random_state=0),
        KAHM(n_components=2),
        DeepKAHM(2, 2),
        WideKAHM(2, 2, random_state=0),
    ],
    expected_failed_checks=_expected_failed,
    xfail_strict=True,
)
def test_sklearn_compatible(estimator, check, request):
    """scikit-learn's estimator checks (see the module docstring for the xfail policy)."""
    reason = BUGS.get(type(estimator).__name__, {}).get(_check_name(check))
    if reason is not None:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
    check(estimator)


def test_parameter_constraints():
    """scikit-learn's own check of ``_parameter_constraints`` (kept out of
    ``parametrize_with_checks``): they name exactly the estimator's parameters, and ``fit``
    rejects a value of a wrong type, and one out of range, of each with scikit-learn's message."""
    check_param_validation("KAHMClassifier", KAHMClassifier(n_components=3, n_layers=1, random_state=0))
