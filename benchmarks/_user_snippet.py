"""The snippet ``bench_user_path`` times, in one function that both of its ways of running use: as
the user's script file (``benchmarks/_user_script.py``, which imports ``kahm_dask`` at its top) and
inside a function (``bench_user_path --one-run``). It imports nothing from this tree, so that it
times whichever ``kahm_dask`` comes first on the path."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import numpy as np

PARAMS = {"n_components": 20, "block_size": 1000, "random_state": 0}


def timed_snippet(Xtr: np.ndarray, ytr: np.ndarray, Xte: np.ndarray, yte: np.ndarray,
                  traced: Callable[[], AbstractContextManager] = nullcontext) -> dict:
    """The snippet on MNIST rows, timed call by call (the client's start too); ``traced`` wraps
    the Dask fit and prediction (e.g. in Dask's ``performance_report``). Then, not the snippet,
    the same fit and prediction again on the same client ("again")."""
    import dask.array as da
    from distributed import Client

    from kahm_dask import DaskKAHMClassifier, KAHMClassifier

    out: dict = {"load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        with Client(n_workers=2, threads_per_worker=1, dashboard_address=None) as client:
            out["client_start_s"] = time.perf_counter() - t0
            Xd = da.from_array(Xtr, chunks=(4096, -1))
            Xq = da.from_array(Xte, chunks=(2048, -1))
            with traced():
                t0 = time.perf_counter()
                d = DaskKAHMClassifier(**PARAMS, store_dir=tmp).fit(Xd, ytr)
                out["dask_fit_s"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                pred_d = d.predict(Xq).compute()
                out["dask_predict_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            again = DaskKAHMClassifier(**PARAMS, store_dir=f"{tmp}/again").fit(Xd, ytr)
            out["dask_fit_again_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            again.predict(Xq).compute()
            out["dask_predict_again_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            m = KAHMClassifier(n_jobs=2, **PARAMS).fit(Xtr, ytr)
            out["mem_fit_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            pred_m = m.predict(Xte)
            out["mem_predict_s"] = time.perf_counter() - t0
            # after the fits, which loaded it (asking before would load it early); sent by value
            out["workers_code"] = sorted(set(client.run(lambda: sys.modules["kahm_dask"].__file__).values()))
    out["agreement"] = float(np.mean(pred_d == pred_m))
    out["accuracy"] = float(np.mean(pred_d == yte))
    out["load_after"] = os.getloadavg()[0]
    return out
