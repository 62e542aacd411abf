"""The shared fixtures of every test folder (the helpers are in tests/_kit.py).

BLAS is limited to one thread for the whole session: the test matrices are small (N ≤ a few
thousand), and OpenBLAS with 2 threads stalls badly when the other core is busy (measured:
digits fit 0.5 s with 1 thread vs 20 s with 2 threads under load).

Privacy ledgers: every DP fit records its release in its data set's ledger, by default under
the user's home directory. The tests never touch it: the session's ledger directory is a
temporary one (set when this file is imported, before any test or doctest runs, and inherited
by the processes the tests start; removed when the session ends), and each test gets a fresh one
of its own.

Fixtures: ``ledger_dir`` (each test's own, autouse), ``digits`` (the bundled digits split 70/30
and scaled by their public bounds 0–16), ``digits_private_scaling`` (the same split scaled by the
training rows' own min and max, for the tests of that leak), ``client`` (a threaded LocalCluster
of 2 workers), ``disk_full`` (every file written by kahm_dask.storage.atomic fails half-way), and,
for the slow tests, ``baseline_run`` and ``baseline_fingerprint`` (the synthetic DP run of
:data:`tests._kit.SYNTHETIC_RUN`, uninterrupted).
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import shutil
import tempfile
import time
import warnings

import pytest
from threadpoolctl import threadpool_limits

from kahm_dask.datasets import load_bundled, split_and_scale
from kahm_dask.privacy.ledger import LEDGER_DIR_ENV
from kahm_dask.privacy.randomness import PrivacyLeakWarning

from ._kit import SYNTHETIC_RUN, digits_split, pipeline_file, run_fingerprint, run_pipeline_file, run_stores

os.environ[LEDGER_DIR_ENV] = tempfile.mkdtemp(prefix="kahm-dask-test-ledgers-")
atexit.register(shutil.rmtree, os.environ[LEDGER_DIR_ENV], ignore_errors=True)


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


# --------------------------------------------------------------------------- data


@pytest.fixture(scope="module")
def digits():
    """Bundled digits, split 70/30 (stratified, seed 0) and scaled by the public bounds [0, 16]."""
    return digits_split()


@pytest.fixture(scope="module")
def digits_private_scaling():
    """The same split as ``digits``, scaled by the training rows' own min and max: a private
    statistic (split_and_scale warns, checked here). Only for the tests of that leak."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PrivacyLeakWarning)
        split = split_and_scale(*load_bundled("digits"))
    assert any(issubclass(w.category, PrivacyLeakWarning) for w in caught)
    assert not split.bounds.public
    return split


# --------------------------------------------------------------------------- Dask


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


# --------------------------------------------------------------------------- storage


class _HalfWriter:
    """A text file whose ``write`` stores half the text, then fails as on a full disk."""

    def __init__(self, fh) -> None:
        self._fh = fh

    def __enter__(self) -> _HalfWriter:
        return self

    def __exit__(self, *exc) -> None:
        self._fh.close()

    def write(self, text: str) -> int:
        self._fh.write(text[: len(text) // 2])
        self._fh.flush()
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def disk_full(monkeypatch):
    """A function that, once called, makes every file written by :mod:`kahm_dask.storage.atomic`
    fail half-way, as on a full disk (call it after writing what must exist before)."""
    from kahm_dask.storage import atomic

    def fill() -> None:
        def half_open(path, mode="r", **kwargs):
            fh = open(path, mode, **kwargs)
            return _HalfWriter(fh) if "w" in mode else fh

        monkeypatch.setattr(atomic, "open", half_open, raising=False)

    return fill


# --------------------------------------------------------------------------- the slow tests' run


@pytest.fixture(scope="session")
def baseline_run(tmp_path_factory):
    """The synthetic pipeline (:data:`tests._kit.SYNTHETIC_RUN`) run uninterrupted on a 2-worker
    LocalCluster (slow tests only): its run folder."""
    tmp = tmp_path_factory.mktemp("baseline")
    cfg = pipeline_file(tmp / "p.yaml", **SYNTHETIC_RUN, output=tmp / "run")
    t0 = time.perf_counter()
    metrics = run_pipeline_file(cfg)
    metrics["wall_seconds"] = time.perf_counter() - t0
    (tmp / "metrics.json").write_text(json.dumps(metrics, default=str))
    return tmp / "run"


@pytest.fixture(scope="session")
def baseline_fingerprint(baseline_run) -> dict:
    return run_fingerprint(*run_stores(baseline_run))
