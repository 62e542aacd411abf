"""The privacy ledger a test's DP releases went to: the data set's ledger in the test's own
ledger directory (``$KAHM_DASK_LEDGER_DIR``, set per test by tests/conftest.py)."""

from __future__ import annotations

import numpy as np

from kahm_dask.privacy.fingerprint import fingerprint
from kahm_dask.privacy.ledger import PrivacyLedger


def ledger_of(rows) -> PrivacyLedger:
    """The ledger of a dataset store (anything with ``fingerprint()``) or of a matrix's rows."""
    fp = rows.fingerprint() if hasattr(rows, "fingerprint") else fingerprint(np.asarray(rows))
    return PrivacyLedger.for_data(fp)
