"""How fit and predict time grow with the number of training rows (10k, 60k, 600k synthetic),
with routing (``n_probe``) against the exhaustive prediction.

Synthetic Gaussian classes (``make_class_blobs``: C = 10, p = 50 by default, logistic-squashed),
n = 20, N_b = 1000, so the number of clusters grows like N/1000 and the fit should grow linearly
in N (one O(N_b³) fit per cluster and layer, plus k-means). The exhaustive prediction on a fixed
set of test rows grows linearly too (every query meets every cluster); with routing each query
meets ``n_probe`` clusters per class plus one (m × S) distance product to the centres, so its
cost should stay nearly flat (docs/algorithm.md#routing). Measured for the in-memory
:class:`KAHMClassifier` (``n_jobs=2``, one BLAS thread per thread) and for the Dask pipeline on
a LocalCluster of 2 single-threaded workers, both predictions on the same fitted model. Each
(size, engine) runs in its own subprocess (its own peak RSS).

    python -m benchmarks.perf_scaling [--sizes 10000 60000 600000] [--engines memory dask2] [--n-probe 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._harness import (
    PeakTreeRSS,
    blas_threads,
    kahm_predict_flops,
    machine_facts,
    markdown_table,
    matmul_rates,
    timed_cpu,
    write_report,
)
from kahm_dask.datasets import make_class_blobs

ENGINES = ("memory", "dask1", "dask2")


def _data(n: int, n_test: int, p: int):
    X, y = make_class_blobs(n + n_test, p, 10, random_state=12345)
    return X[:n], y[:n], X[n:], y[n:]


def run_memory(X, y, Xt, yt, args) -> dict:
    from kahm_dask import KAHMClassifier

    with blas_threads(1):
        model = KAHMClassifier(20, args.layers, 1000, random_state=0, n_jobs=2)
        fit_s, fit_cpu, clf = timed_cpu(lambda: model.fit(X, y))
        rate = matmul_rates()
        pred_s, pred_cpu, D = timed_cpu(lambda: clf.class_distances(Xt))
        clf.set_params(n_probe=args.n_probe)
        routed_s, _, R = timed_cpu(lambda: clf.class_distances(Xt))
    pred = clf.classes_[np.argmin(D, axis=1)]
    routed = clf.classes_[np.argmin(R, axis=1)]
    flops = kahm_predict_flops(clf, Xt.shape[0])
    return {
        "fit_s": fit_s, "fit_cpu_s": fit_cpu, "predict_s": pred_s, "predict_cpu_s": pred_cpu,
        "accuracy": float(np.mean(pred == yt)), "n_clusters": int(clf.n_branches_.sum()),
        "predict_routed_s": routed_s, "accuracy_routed": float(np.mean(routed == yt)),
        "routed_agreement": float(np.mean(routed == pred)),
        "predict_gflops_cpu": flops / pred_cpu / 1e9, "matmul_gflops_cpu": rate[1],
    }


def run_dask(X, y, Xt, yt, n_workers: int, args) -> dict:
    from kahm_dask.pipeline.cluster import connect
    from kahm_dask.pipeline.config import ClusterConfig
    from kahm_dask.pipeline.predict import PREDICTIONS, predict_to_store
    from kahm_dask.pipeline.stores.dataset import write_dataset
    from kahm_dask.pipeline.stores.manifest import read_manifest
    from kahm_dask.pipeline.training import TrainSettings, train_pipeline
    from kahm_dask.recipe import TrainParams

    with tempfile.TemporaryDirectory(prefix="kahm-scaling-") as tmp:
        tmp = Path(tmp)
        train = write_dataset(tmp / "train.zarr", X, y)
        test = write_dataset(tmp / "test.zarr", Xt, yt)
        settings = TrainSettings(TrainParams(20, args.layers), seed=0, block_size=1000)
        with connect(ClusterConfig(n_workers=n_workers, threads_per_worker=1, processes=True)) as client:
            client.wait_for_workers(n_workers)
            t0 = time.perf_counter()
            summary = train_pipeline(train, tmp / "model.zarr", tmp / "work", settings, client, progress=False)
            fit_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            group = predict_to_store(tmp / "model.zarr", test.X(), tmp / "pred.zarr", client)
            pred_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            routed_group = predict_to_store(tmp / "model.zarr", test.X(), tmp / "routed.zarr", client,
                                            n_probe=args.n_probe)
            routed_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            predict_to_store(tmp / "model.zarr", test.X(), tmp / "routed_again.zarr", client, n_probe=args.n_probe)
            routed_again_s = time.perf_counter() - t0
        pred = np.asarray(group.attrs["classes"])[group[PREDICTIONS][...]]
        routed = np.asarray(group.attrs["classes"])[routed_group[PREDICTIONS][...]]
        n_clusters = len(read_manifest(tmp / "model.zarr")["clusters"])
    return {"fit_s": fit_s, "predict_s": pred_s, "accuracy": float(np.mean(pred.astype(np.int64) == yt)),
            "n_clusters": n_clusters, "predict_routed_s": routed_s, "predict_routed_again_s": routed_again_s,
            "accuracy_routed": float(np.mean(routed.astype(np.int64) == yt)),
            "routed_agreement": float(np.mean(routed == pred)),
            "fit_stage_s": {**summary["stage_seconds"], "tasks": summary["train_seconds"]}}


def worker(engine: str, n: int, args) -> dict:
    X, y, Xt, yt = _data(n, args.n_test, args.p)
    with PeakTreeRSS() as rss:
        out = run_memory(X, y, Xt, yt, args) if engine == "memory" else run_dask(X, y, Xt, yt, int(engine[4:]), args)
    out.update(peak_rss_mib=rss.peak_mib, load_avg=os.getloadavg()[0])
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="*", default=[10_000, 60_000, 600_000])
    ap.add_argument("--engines", nargs="*", default=["memory", "dask2"], choices=ENGINES)
    ap.add_argument("--p", type=int, default=50)
    ap.add_argument("--n-test", type=int, default=2000)
    ap.add_argument("--layers", type=int, default=1, help="L of every deep KAHM")
    ap.add_argument("--n-probe", type=int, default=2, help="clusters per class a routed query meets")
    ap.add_argument("--name", default="perf_scaling", help="report name under benchmarks/results/")
    ap.add_argument("--note", nargs="*", help="extra paragraphs for the report's notes")
    ap.add_argument("--load", help="JSON of results already measured ({'engine/N': {...}}), not rerun")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        Path(args.out).write_text(json.dumps(worker(args.worker[0], int(args.worker[1]), args)))
        return

    with blas_threads(1):
        facts = machine_facts(1)
    rows = []
    results: dict[str, dict] = json.loads(Path(args.load).read_text()) if args.load else {}
    for engine in args.engines:
        for n in args.sizes:
            if f"{engine}/{n}" in results:
                continue
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
                out = f.name
            subprocess.run(
                [sys.executable, "-m", "benchmarks.perf_scaling", "--worker", engine, str(n), "--out", out,
                 "--p", str(args.p), "--n-test", str(args.n_test), "--layers", str(args.layers),
                 "--n-probe", str(args.n_probe)],
                check=True, cwd=Path(__file__).resolve().parent.parent,
            )
            r = results[f"{engine}/{n}"] = json.loads(Path(out).read_text())
            os.unlink(out)
            print(engine, n, r, flush=True)
    for engine in args.engines:
        base = None
        for n in args.sizes:
            r = results.get(f"{engine}/{n}")
            if r is None:  # not measured in this run
                continue
            base = base or r
            rows.append([
                engine if engine == "memory" else f"Dask, {engine[4:]} worker(s)", n, r["n_clusters"],
                f"{r['fit_s']:.1f}", f"{r['fit_s'] / base['fit_s']:.1f}", f"{r['fit_s'] / r['n_clusters']:.2f}",
                f"{r['fit_cpu_s']:.1f} ({r['fit_cpu_s'] / base['fit_cpu_s']:.1f})" if "fit_cpu_s" in r else "n/a",
                (f"{r['predict_cpu_s']:.2f} ({r['predict_cpu_s'] / base['predict_cpu_s']:.1f})"
                 if "predict_cpu_s" in r else "n/a"),
                f"{r['predict_s']:.2f}", f"{r['predict_s'] / base['predict_s']:.1f}",
                f"{r['predict_routed_s']:.2f}", f"{r['predict_routed_s'] / base['predict_routed_s']:.1f}",
                *((f"{r['predict_routed_again_s']:.2f}",
                   f"{r['predict_routed_again_s'] / base['predict_routed_again_s']:.1f}")
                  if "predict_routed_again_s" in r else ("n/a", "n/a")),
                f"{r['accuracy']:.4f}", f"{r['accuracy_routed']:.4f}", f"{r['routed_agreement']:.4f}",
                f"{r['peak_rss_mib']:.0f}",
                f"{r['predict_gflops_cpu'] / r['matmul_gflops_cpu']:.2f}" if "predict_gflops_cpu" in r else "n/a",
                f"{r['load_avg']:.1f}",
            ])
    table = markdown_table(
        ["engine", "N train", "clusters", "fit s", "fit / smallest", "fit s per cluster",
         "fit CPU s (/ smallest)", "predict CPU s (/ smallest)",
         f"exhaustive predict s ({args.n_test} rows)", "exhaustive / smallest",
         f"routed predict s (n_probe {args.n_probe})", "routed / smallest",
         "routed again s (Dask: same workers)", "routed again / smallest", "accuracy", "accuracy routed",
         "same prediction", "peak RSS MiB",
         "predict FLOP-rate fraction (CPU time)", "load avg"], rows)
    notes = (
        f"Synthetic: `make_class_blobs(N + {args.n_test}, p={args.p}, C=10)`, n = 20, L = {args.layers}, "
        "N_b = 1000 (clusters ≈ N/1000). In-memory: `n_jobs=2`, one BLAS thread per thread, k-means++ "
        "(one start) on at most 50 principal coordinates. Dask: LocalCluster with single-threaded worker "
        "processes, each class partitioned in one task by the same k-means. Both predictions of a row use "
        "the same fitted model: exhaustive (every cluster) and routed (each query meets the n_probe "
        "clusters of nearest centre per class); the Dask rows then predict routed once more on the same "
        "workers (their model caches filled by the two predictions before). Ratios are to the smallest N: "
        "linear growth means 6 and 60; a flat cost means 1."
    )
    for extra_note in args.note or []:
        notes += "\n\n" + extra_note
    path = write_report(args.name, "Scaling with N: fit and predict time, 10k / 60k / 600k rows", facts,
                        [("Results", table), ("Notes", notes),
                         ("Raw results (JSON)", "```json\n" + json.dumps(results, indent=1) + "\n```")])
    print(path.read_text())


if __name__ == "__main__":
    main()
