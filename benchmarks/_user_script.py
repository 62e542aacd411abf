"""The user's script of ``bench_user_path``, run as a file: ``python benchmarks/_user_script.py ROWS.npz``.

It is the snippet of that benchmark as a user writes it in a script, imports at the top and the
work under ``if __name__ == "__main__":``. Dask starts its worker processes with
multiprocessing's ``spawn``, which runs the top of the main script again in every worker, so
these workers import ``kahm_dask`` (and scikit-learn, SciPy, Zarr) while ``Client(...)`` starts,
not in the first fit; the start of the client is timed too. It imports nothing from this tree:
whichever ``kahm_dask`` is first on ``PYTHONPATH`` is the code measured, in the client and in the
workers. ``ROWS.npz`` holds ``Xtr, ytr, Xte, yte``. Prints one line of JSON.
"""

import json
import os
import sys
import tempfile
import time

import dask.array as da
import numpy as np
from distributed import Client

from kahm_dask import DaskKAHMClassifier, KAHMClassifier

PARAMS = {"n_components": 20, "block_size": 1000, "random_state": 0}


def main(rows_path: str) -> dict:
    """The snippet, timed call by call, with the client's start; the same fit and prediction
    again on the same client ("again", not the snippet)."""
    rows = np.load(rows_path)
    Xtr, ytr, Xte, yte = rows["Xtr"], rows["ytr"], rows["Xte"], rows["yte"]
    out: dict = {"load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        with Client(n_workers=2, threads_per_worker=1, dashboard_address=None) as client:
            out["client_start_s"] = time.perf_counter() - t0
            out["workers_code"] = sorted(set(client.run(lambda: sys.modules["kahm_dask"].__file__).values()))
            Xd = da.from_array(Xtr, chunks=(4096, -1))
            Xq = da.from_array(Xte, chunks=(2048, -1))
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
    out["agreement"] = float(np.mean(pred_d == pred_m))
    out["accuracy"] = float(np.mean(pred_d == yte))
    out["load_after"] = os.getloadavg()[0]
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
