"""Fixtures shared by the pipeline tests."""

import pytest

from kahm_dask.datasets import load_bundled, split_and_scale


@pytest.fixture(scope="module")
def client():
    """A client on a threaded LocalCluster of 2 single-threaded workers (one per test module).

    ``distributed`` is imported here, not at collection: importing it configures logging and
    would disable the loggers that exist by then (tests read kahm-dask's log records).
    """
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        yield client


@pytest.fixture(scope="module")
def digits():
    """Bundled digits, split 70/30 and scaled by the public bounds [0, 16]."""
    return split_and_scale(*load_bundled("digits"), bounds=(0, 16))
