"""Free tuning: ``n_components`` chosen by cross-validation on a DP release, against the default.

For each data set and each of ``--draws`` noise draws: one release of the training rows
(``release_dataset``: noisy rows, and with ``--dp-data fabricated`` the rows fabricated from
them, at the data set's ε and with the features and bounds of
``bench_fabrication``, whose breast cancer and wine are scaled by the training split's min and
max, as there; one in-memory ledger per draw), then

* *default*: ``KAHMClassifier(random_state=draw)`` (``n_components`` = 20) fitted on the release
  (on noisy rows, the DP classifier's default model: same rows, same partition);
* *tuned*: ``GridSearchCV`` over ``n_components`` in :data:`GRID` (capped at p), 3-fold, on the
  release alone, refitted on all of it (``released_from=ds``: post-processing).

Both are scored on the private test split (a report, not a choice: nothing is chosen on it).
The ledger must hold exactly the one release per draw after the tuning (checked), so the
difference is what tuning on the release buys at no privacy cost.

    python -m benchmarks.bench_tuning [--datasets digits breast_cancer wine] [--draws 5]

``mnist12k`` (12 000 MNIST training rows) needs the MNIST cache of ``benchmarks/_harness.py``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from sklearn.model_selection import GridSearchCV
from threadpoolctl import threadpool_limits

from benchmarks._harness import machine_facts, markdown_table, write_report
from benchmarks.bench_fabrication import SETTINGS, load
from kahm_dask import KAHMClassifier, PrivacyLedger, release_dataset

GRID = (5, 10, 20, 40)


def measure(name: str, dp_data: str, draws: int) -> dict:
    Xtr, ytr, Xte, yte, lo, hi = load(name)
    eps = SETTINGS[name][0]
    grid = sorted({min(n, Xtr.shape[1]) for n in GRID})
    out = {"name": name, "dp_data": dp_data, "epsilon": eps, "n_train": len(ytr), "p": Xtr.shape[1], "grid": grid,
           "default": [], "tuned": [], "chosen": [], "spent": [], "seconds": []}
    for draw in range(draws):
        t0 = time.perf_counter()
        ledger = PrivacyLedger()
        ds = release_dataset(Xtr, ytr, epsilon=eps, bounds=(lo, hi), dp_data=dp_data, random_state=draw,
                             ledger=ledger)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # n_components above p (wine): capped, as reported
            default = KAHMClassifier(random_state=draw).fit(ds.X, ds.y, released_from=ds)
            search = GridSearchCV(KAHMClassifier(random_state=draw), {"n_components": grid}, cv=3)
            search.fit(ds.X, ds.y, released_from=ds)
        out["default"].append(default.score(Xte, yte))
        out["tuned"].append(search.score(Xte, yte))
        out["chosen"].append(search.best_params_["n_components"])
        out["spent"].append(ledger.spent()[0])
        out["seconds"].append(time.perf_counter() - t0)
        assert ledger.spent() == (eps, 0.0), ledger.spent()  # the release only: tuning spent nothing
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["digits", "breast_cancer", "wine"],
                        choices=["digits", "breast_cancer", "wine", "mnist12k"])
    parser.add_argument("--dp-data", nargs="+", default=["noisy", "fabricated"], choices=["noisy", "fabricated"])
    parser.add_argument("--draws", type=int, default=5)
    args = parser.parse_args()
    with threadpool_limits(1, user_api="blas"):
        results = [measure(name, dp_data, args.draws) for name in args.datasets for dp_data in args.dp_data]
    rows = []
    for r in results:
        d, t = np.array(r["default"]), np.array(r["tuned"])
        diff = t - d
        chosen = ", ".join(f"{n}×{r['chosen'].count(n)}" for n in sorted(set(r["chosen"])))
        rows.append([r["name"], r["dp_data"], f"{r['n_train']} × {r['p']}", f"{r['epsilon']:g}",
                     f"{d.mean():.4f} ± {d.std(ddof=1):.4f}", f"{t.mean():.4f} ± {t.std(ddof=1):.4f}",
                     f"{diff.mean():+.4f} (min {diff.min():+.4f}, max {diff.max():+.4f})", chosen,
                     f"{max(r['spent']):g}", f"{np.mean(r['seconds']):.1f}"])
    table = markdown_table(
        ["data set", "release", "train rows × p", "ε per entry", "default n=20 (mean ± sd)", "tuned (mean ± sd)",
         "tuned − default, paired", "n_components chosen", "ε spent per draw", "s per draw"], rows)
    facts = {**machine_facts(1), "draws": str(args.draws), "grid": ", ".join(map(str, GRID)) + " (capped at p)",
             "cross-validation": "3-fold GridSearchCV on the release, refit on all of it",
             "test accuracy": "on the private test split (30 %, stratified, split seed 0): reported, never chosen on"}
    path = write_report("tuning", "Tuning n_components on a DP release (nothing spent) against the default",
                        facts, [("Results", table), ("Raw results", "```\n" + repr(results) + "\n```")])
    print(path.read_text())


if __name__ == "__main__":
    main()
