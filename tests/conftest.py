"""Shared test configuration.

BLAS is limited to one thread for the whole session: the test matrices are small (N ≤ a few
thousand), and OpenBLAS with 2 threads stalls badly when the other core is busy (measured:
digits fit 0.5 s with 1 thread vs 20 s with 2 threads under load).

Privacy ledgers: every DP fit records its release in its data set's ledger, by default under
the user's home directory. The tests never touch it: the session's ledger directory is a
temporary one (set when this file is imported, before any test or doctest runs, and inherited
by the processes the tests start), and each test gets a fresh one of its own.
"""

import os
import tempfile

import pytest
from threadpoolctl import threadpool_limits

from kahm_dask.privacy.ledger import LEDGER_DIR_ENV

os.environ[LEDGER_DIR_ENV] = tempfile.mkdtemp(prefix="kahm-dask-test-ledgers-")


@pytest.fixture(autouse=True, scope="session")
def _single_blas_thread():
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(autouse=True)
def ledger_dir(tmp_path_factory, monkeypatch):
    """A ledger directory of this test's own (``$KAHM_DASK_LEDGER_DIR``)."""
    path = tmp_path_factory.mktemp("ledgers")
    monkeypatch.setenv(LEDGER_DIR_ENV, str(path))
    return path
