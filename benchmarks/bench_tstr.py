"""Train on synthetic, test on real (TSTR) beside train on real (TRTR): how useful the DP rows
of a release are to a model other than the DP classifier that made them.

For each data set, one DP fit per kind of DP rows (``KAHMClassifier(epsilon=..., bounds=...,
dp_data=...)``, its ledger in a temporary folder), then :func:`kahm_dask.report.metrics.efficacy`
on its ``dp_data_`` (the DP rows it trained on) and on the real training rows: a KAHM and a
logistic regression trained on each, tested on the test rows. Beside it, the DP classifier's own
accuracy and the fidelity scores of the quality report (marginal similarity, correlation
similarity, detection AUC), and the seconds :func:`~kahm_dask.report.write_quality_report`
took for the noisy rows. Data sets (ε per entry): digits (ε = 2, public bounds 0–16), breast
cancer (ε = 1, no public bounds: scaled by the training split's min and max, which warns),
mnist12k (12 000 stratified MNIST training rows, tanh features in public [0, tanh 1], its 10 000
test rows; ε = 1). One noise draw each: the noise comes from the operating system, so the
numbers move by about the spread bench_privacy measures over seeds.

    python -m benchmarks.bench_tstr [--datasets digits breast_cancer mnist12k] [--blas-threads 1]

Wall time on this 2-core machine under a load of about 15, one BLAS thread: 12.5 min, of which
the MNIST fabricated fit took 4.8 min and MNIST's models and report 4.9 min; digits and breast
cancer take half a minute (``--datasets digits breast_cancer``).

Writes ``benchmarks/results/tstr.md``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from benchmarks._harness import blas_threads, machine_facts, markdown_table, write_report
from benchmarks.bench_fabrication import load
from kahm_dask import KAHMClassifier
from kahm_dask.privacy.randomness import PrivacyLeakWarning
from kahm_dask.report import metrics, write_quality_report
from kahm_dask.report.pictures import image_shape_of

#: ε per entry of each data set (those of bench_fabrication).
EPSILON = {"digits": 2.0, "breast_cancer": 1.0, "mnist12k": 1.0}
DP_DATA = ("noisy", "fabricated")
REAL = "real rows (TRTR)"


def _stacked(dp_data: dict) -> tuple[np.ndarray, np.ndarray]:
    """A fitted DP estimator's ``dp_data_`` (label → rows) as (N, p) rows and (N,) labels."""
    X = np.vstack(list(dp_data.values()))
    y = np.concatenate([np.full(len(rows), label) for label, rows in dp_data.items()])
    return X, y


def run_dataset(name: str, ledgers: Path, out: Path) -> tuple[list[list], list[list]]:
    """(efficacy rows, fidelity rows) of one data set."""
    Xtr, ytr, Xte, yte, lo, hi = load(name)
    eps = EPSILON[name]
    train_sets, fidelity, fits = {}, [], {}
    for dp_data in DP_DATA:
        t0 = time.perf_counter()
        dp = KAHMClassifier(epsilon=eps, bounds=(lo, hi), dp_data=dp_data, random_state=0, ledger=ledgers)
        dp.fit(Xtr, ytr)
        fit_s = time.perf_counter() - t0
        dp_X, dp_y = _stacked(dp.dp_data_)
        train_sets[f"{dp_data} DP rows (TSTR)"] = (dp_X, dp_y)
        fits[dp_data] = (dp, fit_s, dp_X, dp_y)
        fidelity.append([name, eps, dp_data, len(dp_y), float(dp.score(Xte, yte)), fit_s,
                         float(metrics.marginal_similarity(Xtr, dp_X).mean()),
                         metrics.correlation_similarity(Xtr, dp_X), metrics.detection_auc(Xtr, dp_X)])
    train_sets[REAL] = (Xtr, ytr)
    t0 = time.perf_counter()
    table = metrics.efficacy(train_sets, Xte, yte)
    efficacy_s = time.perf_counter() - t0
    dp, _, dp_X, dp_y = fits["noisy"]
    t0 = time.perf_counter()
    write_quality_report(out / f"{name}.html", real_X=Xtr, real_y=ytr, dp_X=dp_X, dp_y=dp_y, test_X=Xte, test_y=yte,
                         statement=dp.privacy_statement_, bounds=(lo, hi), image_shape=image_shape_of(Xtr.shape[1]))
    report_s = time.perf_counter() - t0
    real = {r.model: r.accuracy for r in table if r.trained_on == REAL}
    rows = [[name, eps, r.model, r.trained_on, r.accuracy, r.accuracy - real[r.model], float(r.recall.min()),
             efficacy_s, report_s] for r in table]
    return rows, fidelity


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--datasets", nargs="*", default=list(EPSILON), choices=list(EPSILON))
    ap.add_argument("--blas-threads", type=int, default=1)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", category=PrivacyLeakWarning)  # breast cancer: min/max scaling
    t0 = time.perf_counter()
    efficacy_rows, fidelity_rows = [], []
    with blas_threads(args.blas_threads), tempfile.TemporaryDirectory() as tmp:
        facts = machine_facts(args.blas_threads)
        for name in args.datasets:
            rows, fidelity = run_dataset(name, Path(tmp) / "ledgers", Path(tmp))
            efficacy_rows += rows
            fidelity_rows += fidelity
            print(markdown_table(["data", "ε", "model", "trained on", "accuracy", "vs TRTR", "worst recall",
                                  "efficacy s", "report s"], rows), flush=True)
    facts["wall time"] = f"{time.perf_counter() - t0:.0f} s"
    write_report("tstr", "TSTR vs TRTR: models trained on a release's DP rows, tested on real rows", facts, [
        ("Efficacy: trained on DP rows (TSTR) or on the real rows (TRTR), tested on the test rows",
         "accuracy: share of test rows predicted right; vs TRTR: its difference to the same model trained on the "
         "real rows; worst recall: the lowest per-class recall; efficacy s: seconds to train and test every model "
         "of the data set; report s: seconds of write_quality_report for its noisy rows.\n\n"
         + markdown_table(["data", "ε", "model", "trained on", "accuracy", "vs TRTR", "worst recall", "efficacy s",
                           "report s"], efficacy_rows)),
        ("The DP rows: the DP classifier that made them and their fidelity",
         "DP classifier: test accuracy of the KAHMClassifier fitted with the DP rows (fit s: its fit); marginal "
         "and correlation similarity, detection AUC: the quality report's scores against the real training rows "
         "(1, 1 and 0.5 best).\n\n"
         + markdown_table(["data", "ε", "DP rows", "rows", "DP classifier", "fit s", "marginal similarity",
                           "correlation similarity", "detection AUC"], fidelity_rows)),
    ])


if __name__ == "__main__":
    main()
