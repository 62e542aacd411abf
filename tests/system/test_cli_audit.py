"""``kahm-dask audit``: the bound, the AUC and TPR printed, a violation flagged (exit status 3),
bad input refused in one line, the default run under a minute.

As in tests/privacy/test_audit.py, the audits run at confidence 1 − 1e-6: a false "violation"
or a bound above the claim happens with probability below 1e-6 per run.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

import kahm_dask.privacy.audit as audit_mod
from kahm_dask.cli import main
from kahm_dask.cli.audit import VIOLATION_EXIT
from kahm_dask.privacy.noise import GridLaplace

CONFIDENCE = 1 - 1e-6
CANARIES = 200_000


def _bound(output: str) -> float:
    return float(re.search(r"empirical ε ≥ ([0-9.]+)", output).group(1))


def test_cli_prints_the_bound_auc_and_tpr():
    out = CliRunner().invoke(main, ["audit", "--epsilon", "1", "--canaries", str(CANARIES),
                                    "--confidence", str(CONFIDENCE)])
    assert out.exit_code == 0, out.output
    assert 0.8 <= _bound(out.output) <= 1.0
    assert "against the claimed 1" in out.output and "AUC" in out.output and "TPR at 1 % FPR" in out.output


def test_cli_flags_a_violation(monkeypatch):
    """The real command on a mechanism whose noise is halved (a test double of GridLaplace)."""
    monkeypatch.setattr(audit_mod, "GridLaplace", lambda eps, *a, **kw: GridLaplace(2 * eps, *a, **kw))
    out = CliRunner().invoke(main, ["audit", "--epsilon", "1", "--canaries", str(CANARIES),
                                    "--confidence", str(CONFIDENCE)])
    assert out.exit_code == VIOLATION_EXIT and out.output.startswith("VIOLATION")


def test_cli_refuses_bad_bounds_in_one_line():
    out = CliRunner().invoke(main, ["audit", "--epsilon", "1", "--bounds", "1", "0"])
    assert out.exit_code == 1 and "upper must exceed lower" in out.output and "Traceback" not in out.output


@pytest.mark.slow
def test_the_default_audit_is_tight_and_under_a_minute():
    """``kahm-dask audit --epsilon 1`` with its default canaries, at confidence 1 − 1e-6."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "kahm_dask.cli", "audit", "--epsilon", "1", "--confidence",
                          str(CONFIDENCE)], capture_output=True, text=True, timeout=120, check=True)
    assert time.perf_counter() - start < 60
    assert 0.8 <= _bound(out.stdout) <= 1.0


def test_cli_audits_a_dp_fit_on_a_store_and_spends_once(tmp_path):
    """--store: the entry-level line, then the fit's, below it; ε spent once on the store's ledger."""
    from kahm_dask.pipeline.stores.dataset import open_dataset
    from kahm_dask.privacy.ledger import PrivacyLedger

    store = tmp_path / "iris.zarr"
    assert CliRunner().invoke(main, ["ingest", "sklearn:iris", str(store), "--bounds", "0", "8"]).exit_code == 0
    out = CliRunner().invoke(main, ["audit", "--store", str(store), "--epsilon", "2", "--canaries", "100",
                                    "--confidence", str(CONFIDENCE)])
    assert out.exit_code == 0, out.output
    entry, fit = out.output.splitlines()
    assert "LLR score" in entry and "model distance score" in fit and "(100 canaries" in fit
    assert _bound(fit) <= _bound(entry) <= 2.0
    assert PrivacyLedger.for_data(open_dataset(store)).spent() == (2.0, 0.0)


def test_cli_store_without_public_bounds_is_refused_before_any_spending(tmp_path):
    from kahm_dask.pipeline.stores.dataset import open_dataset
    from kahm_dask.privacy.ledger import PrivacyLedger

    store = tmp_path / "iris.zarr"
    assert CliRunner().invoke(main, ["ingest", "sklearn:iris", str(store)]).exit_code == 0
    out = CliRunner().invoke(main, ["audit", "--store", str(store), "--epsilon", "2"])
    assert out.exit_code == 2 and "records no public feature range" in out.output
    assert PrivacyLedger.for_data(open_dataset(store)).spent() == (0.0, 0.0)
