"""The proven float32 error bound against the error float32 really makes, and the argmins it certifies.

For each data set, ``KAHMClassifier(random_state=0)`` (MNIST: ``n_components=20, block_size=1000,
n_jobs=2``) is fitted; every class model evaluates the query rows in float32 with the proven bound
(``WideKAHM._distances_with_bound``, docs/algorithm.md#float32-error-bound) and the classifier gives
the float64 class distances. Reported: the bound and the observed error relative to Γ, whether
the bound held on every class distance, and the share of rows whose float32 argmin the bound
certifies (the float64 interval of the float32-nearest class lies below every other class's), with
the share of rows whose float32 argmin equals the float64 one. Data: digits (the 70/30 split of ``split_and_scale``,
scaled by the public bounds, the test rows), breast cancer (all rows, trained on all), MNIST (the
first ``--mnist-rows`` test rows). The bound's extra product is timed apart from the float32
distances (its cost per block is one (m × N)·(N × 2) product).

Then the speed on the user's path: the MNIST classifier's ``predict`` of all 10 000 test rows under
``eval_dtype`` "auto" (the default: the certified prediction), "float64" and "float32", in turns,
``--repeats`` times each (the median kept), with the share of predictions equal to float64's;
every branch evaluated (the default) and routed (``n_probe=2``: each class's two branches of
nearest centre).

    python -m benchmarks.bench_float32_bound [--mnist-rows 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from sklearn.datasets import load_breast_cancer

from benchmarks._harness import blas_threads, load_mnist, machine_facts, markdown_table, write_report
from kahm_dask import KAHMClassifier
from kahm_dask.datasets import PUBLIC_BOUNDS, load_bundled, split_and_scale


def measure(name: str, clf: KAHMClassifier, Q: np.ndarray) -> dict:
    """Bound, observed error and certified share of ``clf``'s class distances of the rows ``Q``."""
    Q = np.ascontiguousarray(Q, dtype=np.float64)
    D64 = clf.class_distances(Q)
    G, B = np.empty_like(D64), np.empty_like(D64)
    t0 = time.perf_counter()
    with blas_threads(1):
        for c, wide in enumerate(clf.models_):
            G[:, c], B[:, c] = wide._distances_with_bound(Q, "float32")
    seconds = time.perf_counter() - t0
    n = len(Q)
    best = G.argmin(axis=1)
    upper = (G + B)[np.arange(n), best]
    lower = G - B
    lower[np.arange(n), best] = np.inf
    return {
        "data": name, "rows": n, "held": bool(np.all(np.abs(G - D64) <= B)),
        "bound_median": float(np.median(B / D64)), "bound_max": float(np.max(B / D64)),
        "error_max": float(np.max(np.abs(G - D64) / D64)),
        "certified": float(np.mean(upper < lower.min(axis=1))),
        "argmin_equal": float(np.mean(best == D64.argmin(axis=1))), "seconds_one_thread": seconds,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist-rows", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    facts = machine_facts(blas=1)
    facts["blas threads (fixed)"] = "fits: KAHMClassifier's own (MNIST n_jobs=2); bounds: 1"
    runs = []
    split = split_and_scale(*load_bundled("digits"), bounds=PUBLIC_BOUNDS["digits"])
    runs.append(measure("digits, test split", KAHMClassifier(random_state=0).fit(split.X_train, split.y_train),
                        split.X_test))
    X, y = load_breast_cancer(return_X_y=True)
    runs.append(measure("breast cancer, all rows", KAHMClassifier(random_state=0).fit(X, y), X))
    Xtr, ytr, Xte, _ = load_mnist()
    mnist = KAHMClassifier(n_components=20, block_size=1000, random_state=0, n_jobs=2).fit(Xtr, ytr)
    runs.append(measure(f"MNIST, first {args.mnist_rows} test rows", mnist, Xte[:args.mnist_rows]))
    speed = {routing: predict_times(mnist.set_params(n_probe=n_probe), Xte, args.repeats)
             for routing, n_probe in (("every branch", None), ("routed, n_probe = 2", 2))}
    mnist.set_params(n_probe=None)
    rows = [[r["data"], r["rows"], "yes" if r["held"] else "NO", f"{r['bound_median']:.1e}", f"{r['bound_max']:.2g}",
             f"{r['error_max']:.1e}", f"{100 * r['certified']:.1f} %", f"{100 * r['argmin_equal']:.1f} %"]
            for r in runs]
    table = markdown_table(["data", "rows", "bound held on every class distance", "bound / Γ, median",
                            "bound / Γ, max", "observed error / Γ, max", "float32 argmin certified",
                            "float32 argmin = float64"], rows)
    speed_rows = [[routing, dtype, f"{r['seconds']:.2f}", f"{r['seconds'] / times['float64']['seconds']:.2f}",
                   f"{100 * r['equal']:.2f} %"]
                  for routing, times in speed.items() for dtype, r in times.items()]
    speed_table = markdown_table(["branches evaluated", "eval_dtype", "predict s (median)", "/ float64 (same routing)",
                                  "predictions = float64's"], speed_rows)
    facts["load average at end"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
    write_report("float32_bound", "The proven float32 error bound, the observed error and the certified argmins",
                 facts, [("Results", table),
                         ("MNIST predict, 10 000 test rows, KAHMClassifier(n_jobs=2)", speed_table),
                         ("Raw results", f"```\n{runs}\n{speed}\n```")])


def predict_times(clf: KAHMClassifier, X: np.ndarray, repeats: int) -> dict:
    """Median ``predict`` seconds of ``clf`` on X under each ``eval_dtype`` (taken in turns) and
    the share of its predictions equal to float64's (``clf``'s routing throughout)."""
    seconds: dict[str, list[float]] = {"auto": [], "float64": [], "float32": []}
    found = {}
    for _ in range(repeats):
        for dtype in seconds:
            clf.set_params(eval_dtype=dtype)
            t0 = time.perf_counter()
            found[dtype] = clf.predict(X)
            seconds[dtype].append(time.perf_counter() - t0)
    clf.set_params(eval_dtype="auto")
    return {dtype: {"seconds": statistics.median(s), "equal": float(np.mean(found[dtype] == found["float64"]))}
            for dtype, s in seconds.items()}


if __name__ == "__main__":
    main()
