"""Each stage of the Dask pipeline against its floor on this machine, in one sitting (MNIST, L = 1).

A stage's *floor* is the time its unavoidable work takes at rates measured in the same run, split
evenly over the W workers:

* **I/O**: bytes read and written, at the rates of one process reading and writing the training
  rows as a Zarr array with the stores' codec (zstd) and chunking (``zarr read`` / ``zarr write``);
* **compute**: the pipeline's own per-class k-means and per-cluster fit functions run one after the
  other in this process on rows already in memory (one BLAS thread), and for prediction the
  model's counted floating-point operations at this process's one-thread float64 GEMM rate.

The pipeline runs on ``connect`` (a LocalCluster of W single-threaded worker processes, as users
get it), with its stage times (``train_pipeline``'s summary) and the Dask task stream (tasks per
stage, counted by start time). With Bokeh installed (``pip install ".[bench]"``), Dask's
``performance_report`` of the fit and of the prediction is kept in ``benchmarks/results/reports/``.
``measured / floor`` says how far each stage is from the machine; what a stage adds to its floor
(scheduling, serialisation, copies through Zarr) is the gap.

    python -m benchmarks.bench_stages [--n-train 60000] [--workers 2] [--name stages]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

from benchmarks._harness import (
    CACHE,
    blas_threads,
    dask_report,
    layer_predict_flops,
    load_mnist,
    machine_facts,
    markdown_table,
    matmul_rates,
    tree_bytes,
    write_report,
)

STAGES = ("ingest", "copy rows by class", "k-means per class", "copy rows by cluster",
          "rows by class and k-means, in worker memory", "cluster tasks", "predict (exhaustive)")


def io_rates(X: np.ndarray, chunk_rows: int, where: Path) -> tuple[float, float]:
    """(read, write) MB/s of one process moving ``X`` through Zarr with the stores' codec and
    chunking, best of three."""
    from kahm_dask.pipeline.stores.dataset import write_dataset

    write, read = float("inf"), float("inf")
    for i in range(3):
        t0 = time.perf_counter()
        write_dataset(where / f"rate{i}.zarr", X, np.zeros(len(X), dtype=np.int64), chunk_rows=chunk_rows)
        write = min(write, time.perf_counter() - t0)
        t0 = time.perf_counter()
        zarr.open_array(str(where / f"rate{i}.zarr" / "X"), mode="r")[...]
        read = min(read, time.perf_counter() - t0)
    return X.nbytes / read / 1e6, X.nbytes / write / 1e6


def serial_compute(X: np.ndarray, y: np.ndarray, params, settings) -> dict:
    """The pipeline's own k-means and per-cluster fits, one after the other in this process (one
    BLAS thread) on rows already in memory: the compute floor of those stages times W. Each
    class's rows in their original order, partitioned by the pipeline's in-task k-means; each
    cluster's rows in their original order (the rows the pipeline's tasks get)."""
    from kahm_dask._random import child_seed_sequence
    from kahm_dask.classifier import PARTITION_STREAM
    from kahm_dask.partition import default_min_cluster_size, n_branches
    from kahm_dask.pipeline.training.partition import partition_in_task

    seeds = child_seed_sequence(np.random.SeedSequence(settings.seed), PARTITION_STREAM)  # the pipeline's
    mcs = settings.min_cluster_size or default_min_cluster_size(params.n_components)
    kmeans_s, fit_s, longest = 0.0, 0.0, 0.0
    with blas_threads(1):
        for code, c in enumerate(np.unique(y)):
            rows = np.asarray(X[y == c], dtype=np.float64)
            t0 = time.perf_counter()
            labels = partition_in_task(rows, n_branches(len(rows), settings.block_size, settings.s_rule), mcs,
                                       child_seed_sequence(seeds, code), settings.n_init, settings.kmeans_dims)
            kmeans_s += time.perf_counter() - t0
            for s in np.unique(labels):
                t0 = time.perf_counter()
                params.fit_cluster(rows[labels == s], rows[labels == s])
                took = time.perf_counter() - t0
                fit_s, longest = fit_s + took, max(longest, took)
    return {"serial_kmeans_s": kmeans_s, "serial_fit_s": fit_s, "longest_fit_s": longest}


def predict_flops(model_path: Path, m: int) -> float:
    """Counted floating-point operations of the exhaustive prediction of m rows: the sum of
    :func:`~benchmarks._harness.layer_predict_flops` over every stored cluster's layers."""
    from kahm_dask.pipeline.stores.model import load_cluster

    return sum(layer_predict_flops(layer, m) for path in sorted((model_path / "clusters").iterdir())
               for layer in load_cluster(path).layers_)


def _stage_windows(stage_seconds: dict, fit_start: float) -> list[tuple[str, float, float]]:
    names = {"class_grouping": STAGES[1], "partition": STAGES[2], "grouping": STAGES[3],
             "partition_in_memory": STAGES[4]}
    windows, t = [], fit_start
    for key, seconds in stage_seconds.items():
        if key in names:
            windows.append((names[key], t, t + seconds))
        t += seconds
    return windows


def run(args) -> dict:
    from distributed import get_task_stream

    from kahm_dask.pipeline.cluster import connect
    from kahm_dask.pipeline.config import ClusterConfig
    from kahm_dask.pipeline.predict import predict_to_store
    from kahm_dask.pipeline.stores.dataset import write_dataset
    from kahm_dask.pipeline.training import TrainSettings, train_pipeline
    from kahm_dask.recipe import TrainParams

    X, y, Xt, yt = load_mnist()
    X, y = X[: args.n_train], y[: args.n_train]
    W = args.workers
    out: dict = {"n_train": len(X), "n_test": len(Xt), "p": X.shape[1], "workers": W}
    with tempfile.TemporaryDirectory(prefix="kahm-stages-", dir=args.tmp) as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        train = write_dataset(tmp / "train.zarr", X, y)
        out["ingest_s"] = time.perf_counter() - t0
        test = write_dataset(tmp / "test.zarr", Xt, yt)
        chunk_rows = train.X().chunks[0][0]
        out["chunk_rows"] = chunk_rows
        out["read_MBps"], out["write_MBps"] = io_rates(X, chunk_rows, tmp)
        with blas_threads(1):
            _, out["gemm_gflops"] = matmul_rates(1000)
        params = TrainParams(20, 1)
        settings = TrainSettings(params, seed=0, block_size=1000)
        with connect(ClusterConfig(n_workers=W, threads_per_worker=1, processes=True)) as client:
            with get_task_stream(client) as fit_stream, dask_report(f"{args.name}-fit") as fit_report:
                start = time.time()
                t0 = time.perf_counter()
                summary = train_pipeline(train, tmp / "model.zarr", tmp / "work", settings, client)
                out["fit_s"] = time.perf_counter() - t0
            with get_task_stream(client) as predict_stream, dask_report(f"{args.name}-predict") as predict_report:
                t0 = time.perf_counter()
                predict_to_store(tmp / "model.zarr", test.X(), tmp / "pred.zarr", client)
                out["predict_s"] = time.perf_counter() - t0
            out["reports"] = [r.name for r in (fit_report, predict_report) if r is not None]
        out["stage_seconds"] = summary["stage_seconds"]
        out["train_seconds"] = summary["train_seconds"]
        out["n_clusters"] = summary["n_clusters"]
        out["task_seconds"] = sorted(i["seconds"] for i in summary["clusters"])
        tasks = {name: 0 for name in STAGES}
        for name, a, b in _stage_windows(summary["stage_seconds"], start):
            tasks[name] = sum(1 for t in fit_stream.data for s in t["startstops"]
                              if s["action"] == "compute" and a <= s["start"] < b)
        tasks["cluster tasks"] = sum(1 for t in fit_stream.data if "train_cluster" in str(t["key"]))
        tasks["predict (exhaustive)"] = len(predict_stream.data)
        out["tasks"] = tasks
        out["data_bytes"] = X.nbytes  # float64, as written
        out["data_stored_bytes"] = tree_bytes(tmp / "train.zarr")
        out["model_bytes"] = tree_bytes(tmp / "model.zarr")
        out["test_bytes"] = Xt.nbytes
        out["predict_gflop"] = predict_flops(tmp / "model.zarr", len(Xt)) / 1e9
        out["rows_held"] = summary["rows_held"]
        out.update(serial_compute(X, y, params, settings))
    out["load_avg_end"] = os.getloadavg()[0]
    return out


def floors(r: dict) -> list[list[object]]:
    """The table's rows: stage, bytes read/written, GFLOP, tasks, floor, measured, ratio."""
    W, rd, wr = r["workers"], r["read_MBps"] * 1e6, r["write_MBps"] * 1e6
    data, model, test = r["data_bytes"], r["model_bytes"], r["test_bytes"]
    st = r["stage_seconds"]
    gemm = r["gemm_gflops"]
    rows = [
        ("ingest", 0, data, None, r["ingest_s"], data / wr / W,
         "one writer in the client (`write_dataset`); the floor splits it over W"),
        *([("rows by class and k-means, in worker memory", data, 0, None, st["partition_in_memory"],
            data / rd / W + r["serial_kmeans_s"] / W,
            "floor: one read of the rows, and this process's k-means of every class, one after the other, / W")]
          if "partition_in_memory" in st else [
            ("copy rows by class", data, data, None, st["class_grouping"], (data / rd + data / wr) / W, ""),
            ("k-means per class", data, 0, None, st["partition"], data / rd / W + r["serial_kmeans_s"] / W,
             "floor: this process's k-means of every class, one after the other, / W"),
            ("copy rows by cluster", data, data, None, st["grouping"], (data / rd + data / wr) / W, "")]),
        ("cluster tasks", data, model, None, r["train_seconds"],
         max((data / rd + model / wr + r["serial_fit_s"]) / W, r["longest_fit_s"]),
         "floor: this process's fits of every cluster, one after the other, / W, plus the model store's writes"),
        ("predict (exhaustive)", model * W + test, 0, r["predict_gflop"], r["predict_s"],
         (model * W + test) / rd / W + r["predict_gflop"] / gemm / W,
         "every worker reads every model once; GEMM at the one-core rate"),
    ]
    out = []
    for name, b_in, b_out, gflop, measured, floor, note in rows:
        out.append([name, f"{b_in / 2**20:.0f}", f"{b_out / 2**20:.0f}", "—" if gflop is None else f"{gflop:.0f}",
                    r["tasks"].get(name, 0) or "—", f"{floor:.2f}", f"{measured:.2f}", f"{measured / floor:.1f}×",
                    note])
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-train", type=int, default=60000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--name", default="stages")
    parser.add_argument("--tmp", default=None, help="folder for the temporary stores (default: the system's)")
    args = parser.parse_args(argv)
    facts = machine_facts(1)
    r = run(args)
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / f"{args.name}.json").write_text(json.dumps(r, indent=1))
    facts.update({
        "workers": f"{r['workers']} processes × 1 thread (connect: one BLAS thread, ReusedHeap)",
        "data": f"MNIST {r['n_train']} × {r['p']} float64 ({r['data_bytes'] / 2**20:.0f} MiB; "
                f"{r['data_stored_bytes'] / 2**20:.0f} MiB in Zarr), {r['n_test']} test rows, "
                f"chunks of {r['chunk_rows']} rows",
        "model": f"n = 20, L = 1, N_b = 1000: {r['n_clusters']} clusters, "
                 f"model store {r['model_bytes'] / 2**20:.0f} MiB",
        "zarr read / write, one process": f"{r['read_MBps']:.0f} / {r['write_MBps']:.0f} MB/s (uncompressed bytes)",
        "float64 GEMM, one core": f"{r['gemm_gflops']:.1f} GFLOP/s",
        "serial compute, this process": f"k-means {r['serial_kmeans_s']:.1f} s, "
                                        f"cluster fits {r['serial_fit_s']:.1f} s (longest {r['longest_fit_s']:.2f} s)",
        "pipeline": f"fit {r['fit_s']:.1f} s, predict {r['predict_s']:.1f} s; rows held in {r['rows_held']}",
        "Dask performance reports": ", ".join(f"[{n}](reports/{n})" for n in r["reports"])
                                    or "not written (Bokeh is not installed)",
    })
    table = markdown_table(["stage", "MiB read", "MiB written", "GFLOP", "tasks", "floor s", "measured s",
                            "measured / floor", "how the floor is counted"], floors(r))
    notes = ("* Floor = bytes at the one-process Zarr rates plus compute at the one-process rates, all divided "
             "by W workers; 'tasks' counts the Dask tasks that started in the stage.\n"
             "* The rows' MiB are their uncompressed float64 bytes (the stores are zstd-compressed); the "
             "model store's are its bytes on disk.\n"
             f"* Cluster task times (seconds, from the pipeline's summary): median "
             f"{np.median(r['task_seconds']):.2f}, largest {max(r['task_seconds']):.2f}.\n")
    path = write_report(args.name, "The Dask pipeline's stages against their floors (MNIST, L = 1)", facts,
                        [("Stages", table), ("Notes", notes)])
    print(path.read_text())


if __name__ == "__main__":
    main()
