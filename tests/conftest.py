"""Shared test configuration.

BLAS is limited to one thread for the whole session: the test matrices are small (N ≤ a few
thousand), and OpenBLAS with 2 threads stalls badly when the other core is busy (measured:
digits fit 0.5 s with 1 thread vs 20 s with 2 threads under load).
"""

import pytest
from threadpoolctl import threadpool_limits


@pytest.fixture(autouse=True, scope="session")
def _single_blas_thread():
    with threadpool_limits(limits=1, user_api="blas"):
        yield
