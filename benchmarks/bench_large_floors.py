"""The floors of the 4 GiB run's stages on this machine, against the stages' measured times.

A stage's *floor* is the work it cannot avoid, at rates measured here in one process (one BLAS
thread) on rows of the run's shape (``pipelines/large_classes.yaml``: 262,144 × 4096 float32,
2048-row chunks, 2 workers), split evenly over the 2 workers:

* **ingest**: generate the rows (``synthetic_directions``) and write them once through Zarr with
  the stores' codec and chunks;
* **noise** (DP): read the rows, draw the discrete Laplace noise of ε = 2 per entry from OS
  entropy (``GridLaplace.release``), write the noisy rows;
* **class grouping**, **grouping** (the two reordered copies of the training rows, noisy under
  DP): read and write every row once each;
* **cluster tasks**: fit every cluster (a sample of clusters of the run's mean size, fitted one
  after the other by the pipeline's own ``TrainParams.fit_cluster``) and write its model
  (``save_cluster``; under DP with the cluster's noisy rows, as the DP store keeps them);
* **predict**, **evaluate** (the membership distances of 2048 training rows): the exhaustive
  evaluation's counted floating-point operations (2048 rows against every cluster's model,
  ``layer_predict_flops``) at this process's one-thread float64 GEMM rate.

The k-means gets no floor: its work depends on the iterations each class takes. The measured
times are the full-size runs of ``large_accuracy_vs_n.json`` (``bench_large_accuracy``), whose
date and load are named; the floors are measured now. ``measured / floor`` is how far each stage
is from this machine, and the sum of the floors against the targets says what the targets leave
for the rest.

    python -m benchmarks.bench_large_floors [--sample-rows 16384] [--sample-clusters 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

from benchmarks._harness import (
    RESULTS,
    blas_threads,
    layer_predict_flops,
    machine_facts,
    markdown_table,
    matmul_rates,
    write_report,
)
from benchmarks.bench_large_accuracy import FULL_TRAIN_ROWS, RAW, TARGETS_S, TEST_ROWS

N_FEATURES = 4096
CHUNK_ROWS = 2048
N_CLUSTERS = 260  # the full-size runs' clusters (large.md, large_dp.md)
WORKERS = 2
EPSILON = 2.0


def zarr_rates(X: np.ndarray, where: Path) -> tuple[float, float]:
    """(read, write) seconds per byte of ``X`` through a Zarr array with the stores' codec and
    ``CHUNK_ROWS``-row chunks, best of three."""
    from kahm_dask.storage.codecs import ARRAY_CODECS

    read, write = float("inf"), float("inf")
    for i in range(3):
        path = str(where / f"rows{i}.zarr")
        t0 = time.perf_counter()
        arr = zarr.create_array(path, shape=X.shape, dtype=X.dtype, chunks=(CHUNK_ROWS, X.shape[1]), **ARRAY_CODECS)
        arr[...] = X
        write = min(write, time.perf_counter() - t0)
        t0 = time.perf_counter()
        zarr.open_array(path, mode="r")[...]
        read = min(read, time.perf_counter() - t0)
    return read / X.nbytes, write / X.nbytes


def measure(sample_rows: int, sample_clusters: int) -> dict:
    """The per-unit costs of the stages' work on ``sample_rows`` generated rows."""
    from kahm_dask.pipeline.stores.model import save_cluster
    from kahm_dask.pipeline.stores.synthetic import synthetic_directions
    from kahm_dask.privacy.noise import GridLaplace
    from kahm_dask.privacy.randomness import SecureRandom
    from kahm_dask.recipe import TrainParams

    out: dict = {"sample_rows": sample_rows, "sample_clusters": sample_clusters}
    with blas_threads(1), tempfile.TemporaryDirectory(prefix="kahm-floors-") as tmp:
        tmp = Path(tmp)
        Xd, y = synthetic_directions(FULL_TRAIN_ROWS + TEST_ROWS, N_FEATURES, 10, seed=0, chunk_rows=CHUNK_ROWS,
                                     dtype="float32", amplitude=0.2)
        t0 = time.perf_counter()
        X = Xd[:sample_rows].compute(scheduler="sync")
        out["generate_s_per_row"] = (time.perf_counter() - t0) / sample_rows
        out["read_s_per_byte"], out["write_s_per_byte"] = zarr_rates(X, tmp)
        mechanism = GridLaplace(EPSILON, np.zeros(N_FEATURES), np.ones(N_FEATURES))
        t0 = time.perf_counter()
        noisy = mechanism.release(X, SecureRandom(), dtype=np.float32)
        out["noise_s_per_entry"] = (time.perf_counter() - t0) / X.size
        out["noisy_read_s_per_byte"], out["noisy_write_s_per_byte"] = zarr_rates(noisy, tmp / "noisy")
        size = round(FULL_TRAIN_ROWS / N_CLUSTERS)  # the run's mean cluster
        recipes = {"": TrainParams(20, 1), "_dp": TrainParams(20, 1, epsilon=EPSILON, dp_data="noisy")}
        labels = y[:sample_rows]
        costs: dict[str, list[float]] = {"fit_s": [], "save_s": [], "fit_dp_s": [], "save_dp_s": []}
        flops = []
        for k in range(sample_clusters):
            which = np.flatnonzero(labels == k % 10)[:size]
            if len(which) < size:
                raise ValueError(f"{sample_rows} sample rows hold {len(which)} rows of class {k % 10}, fewer than a "
                                 f"cluster's {size}: take more --sample-rows.")
            info = {"class": k, "cluster": 0, "n_rows": len(which)}
            for kind, rows in (("", X[which]), ("_dp", noisy[which])):  # DP: fitted on, and storing, noisy rows
                t0 = time.perf_counter()
                fit = recipes[kind].fit_cluster(rows)
                costs[f"fit{kind}_s"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                save_cluster(tmp / f"model{kind}.zarr", k, 0, fit.model, info, fit.dp_rows)
                costs[f"save{kind}_s"].append(time.perf_counter() - t0)
            flops.append(sum(layer_predict_flops(layer, TEST_ROWS) for layer in fit.model.layers_))
        out["cluster_size"] = size
        out.update({name: statistics.median(values) for name, values in costs.items()})
        out["eval_flops_per_cluster"] = statistics.median(flops)
        _, out["gemm_gflops"] = matmul_rates(1000)
    return out


def floors(r: dict) -> dict[str, dict[str, float]]:
    """Floor seconds per stage, non-private and DP, split over ``WORKERS``."""
    n, p = FULL_TRAIN_ROWS, N_FEATURES
    nbytes = n * p * 4
    copy = nbytes * (r["read_s_per_byte"] + r["write_s_per_byte"])
    copy_dp = nbytes * (r["noisy_read_s_per_byte"] + r["noisy_write_s_per_byte"])
    ingest = (FULL_TRAIN_ROWS + TEST_ROWS) * (r["generate_s_per_row"] + p * 4 * r["write_s_per_byte"])
    noise = nbytes * (r["read_s_per_byte"] + r["noisy_write_s_per_byte"]) + n * p * r["noise_s_per_entry"]
    evaluate = N_CLUSTERS * r["eval_flops_per_cluster"] / (r["gemm_gflops"] * 1e9)
    both = {"ingest": ingest, "predict": evaluate, "evaluate": evaluate}
    out = {
        "non-private": {**both, "class_grouping": copy, "grouping": copy,
                        "tasks": N_CLUSTERS * (r["fit_s"] + r["save_s"])},
        "DP": {**both, "noise": noise, "class_grouping": copy_dp, "grouping": copy_dp,
               "tasks": N_CLUSTERS * (r["fit_dp_s"] + r["save_dp_s"])},
    }
    return {kind: {stage: s / WORKERS for stage, s in stages.items()} for kind, stages in out.items()}


STAGES = ("ingest", "noise", "class_grouping", "partition", "grouping", "tasks", "predict", "evaluate")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample-rows", type=int, default=16384)
    parser.add_argument("--sample-clusters", type=int, default=4)
    args = parser.parse_args(argv)
    facts = machine_facts(blas=1)
    r = measure(args.sample_rows, args.sample_clusters)
    floor = floors(r)
    runs = {("DP" if rec["epsilon"] else "non-private"): rec for rec in json.loads(RAW.read_text())
            if rec["n_train"] == FULL_TRAIN_ROWS}
    rows, totals = [], {}
    for stage in STAGES:
        row = [stage]
        for kind in ("non-private", "DP"):
            rec = runs.get(kind)
            measured = None if rec is None else {**rec["fit_stage_s"], "ingest": rec["ingest_s"],
                                                 "predict": rec["predict_s"], "evaluate": rec["evaluate_s"]}.get(stage)
            f = floor[kind].get(stage)
            totals.setdefault(kind, 0.0)
            totals[kind] += f or 0.0
            row += [f"{f:.1f}" if f is not None else "—", f"{measured:.1f}" if measured is not None else "—",
                    f"{measured / f:.2f}" if f and measured else "—"]
        rows.append(row)
    table = markdown_table(["stage", "non-private floor s", "measured s", "measured / floor",
                            "DP floor s", "measured s", "measured / floor"], rows)
    summary = [[kind, f"{totals[kind]:.0f}", f"{runs[kind]['total_s']:.0f}" if kind in runs else "—",
                f"{TARGETS_S[kind]:.0f}", runs[kind]["date"] if kind in runs else "—",
                runs[kind]["load_at_start"] if kind in runs else "—"] for kind in ("non-private", "DP")]
    summary_table = markdown_table(["run", "sum of the floors s (no k-means, no cluster start)", "measured total s",
                                    "target s", "measured on", "load then"], summary)
    rates = [["generate", f"{r['generate_s_per_row'] * 1e6:.1f} µs per row"],
             ["Zarr read / write, rows",
              f"{1e-6 / r['read_s_per_byte']:.0f} / {1e-6 / r['write_s_per_byte']:.0f} MB/s"],
             ["Zarr read / write, noisy rows",
              f"{1e-6 / r['noisy_read_s_per_byte']:.0f} / {1e-6 / r['noisy_write_s_per_byte']:.0f} MB/s"],
             ["discrete Laplace noise (OS entropy)", f"{r['noise_s_per_entry'] * 1e9:.1f} ns per entry"],
             [f"fit of one cluster ({r['cluster_size']} × {N_FEATURES}), clean / noisy rows",
              f"{r['fit_s']:.3f} / {r['fit_dp_s']:.3f} s (median)"],
             ["its model write, without / with its noisy rows", f"{r['save_s']:.3f} / {r['save_dp_s']:.3f} s"],
             ["float64 GEMM, one thread", f"{r['gemm_gflops']:.1f} GFLOP/s"],
             ["exhaustive evaluation of 2048 rows, one cluster", f"{r['eval_flops_per_cluster'] / 1e9:.1f} GFLOP"]]
    write_report("large_floors", "The 4 GiB run's stages against their floors", facts,
                 [("Stages", table), ("Totals", summary_table),
                  ("Rates measured now", markdown_table(["work", "rate"], rates)),
                  ("Raw results", f"```\n{json.dumps(r, indent=1)}\n```")])
    print((RESULTS / "large_floors.md").read_text())


if __name__ == "__main__":
    main()
