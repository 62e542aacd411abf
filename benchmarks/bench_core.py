"""Core benchmark: KAHMClassifier fit/predict time and accuracy vs scikit-learn baselines.

Writes ``benchmarks/results/core.md``. Baselines (LogisticRegression, KNeighborsClassifier)
are measured in the same run, on the same split, with the same fixed BLAS thread count.

    python -m benchmarks.bench_core [--blas-threads 1] [--sizes 1000 10000 100000]
"""

from __future__ import annotations

import argparse
from functools import partial

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier

from benchmarks._harness import blas_threads, machine_facts, markdown_table, timed, write_report
from kahm_dask import KAHMClassifier
from kahm_dask.datasets import load_bundled, make_class_blobs, split_and_scale


def models():
    return {
        "KAHMClassifier(n=20, L=5, N_b=1000)": lambda: KAHMClassifier(20, 5, 1000, random_state=0),
        "LogisticRegression": lambda: LogisticRegression(max_iter=2000),
        "KNeighborsClassifier(k=5)": lambda: KNeighborsClassifier(5),
    }


def run_dataset(name: str, split, repeat: int) -> list[list[object]]:
    rows, base = [], None
    for label, make in models().items():
        fit_s, model = timed(lambda make=make: make().fit(split.X_train, split.y_train), repeat)
        pred_s, pred = timed(partial(model.predict, split.X_test), repeat)
        acc = float(np.mean(pred == split.y_test))
        if base is None:
            base = (fit_s, pred_s)
        rows.append([name, len(split.y_train), len(split.y_test), label, fit_s, pred_s, acc])
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--blas-threads", type=int, default=1)
    ap.add_argument("--sizes", type=int, nargs="*", default=[1000, 10_000, 100_000])
    ap.add_argument("--n-test", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3, help="best-of repeats for small sets")
    args = ap.parse_args(argv)
    # Time real evaluations: repeated predict() calls on the same rows would otherwise hit the
    # classifier's distance cache after the first repeat.

    with blas_threads(args.blas_threads):
        facts = machine_facts(args.blas_threads)
        rows = run_dataset("digits", split_and_scale(*load_bundled("digits"), split_seed=0), args.repeat)
        for n in args.sizes:
            X, y = make_class_blobs(n + args.n_test, 20, 10, random_state=n)
            split = split_and_scale(X, y, test_size=args.n_test, split_seed=0, scale=False)
            rows += run_dataset("blobs p=20 C=10", split, args.repeat if n <= 10_000 else 1)
    table = markdown_table(
        ["data", "n_train", "n_test", "model", "fit s", "predict s", "accuracy"], rows
    )
    growth = [
        [r[1], r[4], r[5]] for r in rows if r[0].startswith("blobs") and r[3].startswith("KAHM")
    ]
    if growth:
        f0, p0 = growth[0][1], growth[0][2]
        growth_table = markdown_table(
            ["n_train", "KAHM fit s", "fit / smallest", "KAHM predict s", "predict / smallest"],
            [[g[0], g[1], g[1] / f0, g[2], g[2] / p0] for g in growth],
        )
    else:
        growth_table = "(no synthetic sizes run)"
    path = write_report(
        "core",
        "Core benchmark: KAHMClassifier vs scikit-learn baselines",
        facts,
        [
            ("Results (time = best of repeats)", table),
            ("How KAHM cost grows with N (fixed n_test; N_b = 1000 so branches ∝ N)", growth_table),
        ],
    )
    print(path.read_text())


if __name__ == "__main__":
    main()
