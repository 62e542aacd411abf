"""Larger-than-memory fit through :class:`~kahm_dask.DaskKAHMClassifier`, at several chunk sizes.

For each chunk size: a LocalCluster of 2 workers capped at 1 GiB each; 262,144 × 4096 float32
training rows (4 GiB, ``synthetic_blobs``) written to a Zarr dataset store by
``write_dataset`` at that chunk size (the ingest, on the workers); then
``DaskKAHMClassifier(...).fit(<store URL>)`` (the estimator, not the CLI) and a lazy ``predict``
of 2,048 generated test rows. Records each stage's time, the peak resident memory of each worker
process and the workers lost (killed by their nanny, or crashed). Writes
``benchmarks/results/large_estimator.md``.

    python -m benchmarks.bench_large_estimator [--chunk-rows 512 1024 2048 4096]
        [--n-samples 264192] [--epsilon 2] [--work DIR] [--path]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from distributed.diagnostics import MemorySampler

from benchmarks._harness import machine_facts, markdown_table, write_report
from benchmarks.bench_large import WorkerLosses, _peak_rss_mib
from kahm_dask import DaskKAHMClassifier
from kahm_dask.pipeline.cluster import compute, connect
from kahm_dask.pipeline.config import ClusterConfig
from kahm_dask.pipeline.stores.dataset import write_dataset
from kahm_dask.pipeline.stores.synthetic import synthetic_blobs

N_FEATURES, N_CLASSES, N_TEST = 4096, 10, 2048
#: The settings of pipelines/large_synthetic.yaml, as estimator parameters.
MODEL = dict(n_components=20, n_layers=1, block_size=1000, random_state=0, init_max_iter=3, kmeans_max_iter=20,
             max_cluster_rows=2000)
CLUSTER = ClusterConfig(n_workers=2, threads_per_worker=1, memory_limit="1GiB")


def one_run(chunk_rows: int, n_samples: int, epsilon: float | None, work: Path, as_url: bool) -> list:
    """One chunk size: ingest, fit, predict on a fresh capped cluster → a result row."""
    root = work / f"chunk{chunk_rows}"
    shutil.rmtree(root, ignore_errors=True)
    X, y = synthetic_blobs(n_samples + N_TEST, N_FEATURES, N_CLASSES, seed=0, chunk_rows=chunk_rows, dtype="float32")
    privacy = {} if epsilon is None else dict(epsilon=epsilon, bounds=(0.0, 1.0), dp_data="fabricated", r_value=4)
    with connect(CLUSTER) as client:
        losses = WorkerLosses()
        client.register_plugin(losses)
        sampler = MemorySampler()
        with sampler.sample("cluster", interval=1.0):
            t0 = time.perf_counter()
            store = write_dataset(root / "train.zarr", X[:n_samples], y[:n_samples], chunk_rows=chunk_rows,
                                  dtype="float32", feature_range=(0.0, 1.0))
            t1 = time.perf_counter()
            clf = DaskKAHMClassifier(**MODEL, **privacy, store_dir=root / "estimator", chunk_rows=chunk_rows)
            clf.fit(store.path.as_uri() if as_url else store.path)
            t2 = time.perf_counter()
            predictions = compute(clf.predict(X[n_samples:]), client)  # lazy predict, computed here
            t3 = time.perf_counter()
        peaks = client.run(_peak_rss_mib)
        removed = client.run_on_scheduler(
            lambda dask_scheduler: list(dask_scheduler.plugins["kahm-worker-losses"].removed)
        )
        peak_cluster = sampler.to_pandas()["cluster"].max() / 2**20
    accuracy = float(np.mean(predictions == y[n_samples:]))
    shutil.rmtree(root, ignore_errors=True)
    return [chunk_rows, f"{t1 - t0:.1f}", f"{t2 - t1:.1f}", f"{t3 - t2:.1f}", clf.n_clusters_, f"{accuracy:.4f}",
            ", ".join(f"{v:.0f}" for v in peaks.values()), f"{peak_cluster:.0f}", len(removed)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--chunk-rows", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--n-samples", type=int, default=262_144, help="training rows")
    ap.add_argument("--epsilon", type=float, help="a DP fit at this ε (bounds [0, 1], 4 smoother passes)")
    ap.add_argument("--work", type=Path, help="directory of the stores (default: a temporary directory)")
    ap.add_argument("--path", action="store_true", help="fit from the store's path instead of its file:// URL")
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="kahm-large-"))
    facts = machine_facts(1)
    rows = []
    for chunk_rows in args.chunk_rows:
        rows.append(one_run(chunk_rows, args.n_samples, args.epsilon, work, not args.path))
        print(rows[-1], flush=True)
    gib = args.n_samples * N_FEATURES * 4 / 2**30
    what = "non-private" if args.epsilon is None else f"DP, ε = {args.epsilon:g} per entry, fabricated rows"
    summary = (
        f"Training data {args.n_samples} × {N_FEATURES} float32 ({gib:.2f} GiB), {what}; 2 workers × 1 GiB "
        f"(2 GiB in all); the fit reads the store by its {'path' if args.path else 'file:// URL'}. "
        "Ingest = generating the rows on the workers and writing them to Zarr. Estimator settings: "
        + ", ".join(f"{k}={v}" for k, v in MODEL.items()) + "."
    )
    headers = ["chunk rows", "ingest s", "fit s", "predict s", "clusters", "accuracy", "peak RSS per worker MiB",
               "peak cluster MiB (sampled)", "workers lost"]
    name = "large_estimator" if args.epsilon is None else "large_estimator_dp"
    path = write_report(name, "Larger-than-memory fit through DaskKAHMClassifier", facts,
                        [("Result", summary + "\n\n" + markdown_table(headers, rows))])
    print(path.read_text())


if __name__ == "__main__":
    main()
