"""A cost model of the larger-than-memory pipeline, checked against its runs, and what it predicts
for 100 GiB on 32 workers.

Each stage's wall time is modelled as ``a_stage · f_stage(N, W)`` for N training rows of p
features in C classes on W workers, with clusters of about N_b rows (K ≈ N / N_b clusters,
S ≈ N / (C · N_b) per class) and m test rows:

=====================  ==============================  =============================================
stage                  f(N, W)                         why
=====================  ==============================  =============================================
ingest                 N · p / W                       every entry generated and written once
copy rows by class     N · p / W                       every entry read and written once
k-means per class      N · p / W  +  G                 the randomized SVD's passes over each class
                                                       (the first term, fitted); G is the in-task
                                                       k-means on the (N / C, k) coordinates:
                                                       ⌈C / W⌉ classes per worker, each
                                                       2 · n_it · (N / C) · S · k flops at the
                                                       one-core GEMM rate (counted, not fitted)
copy rows by cluster   N · p / W                       every entry read and written once
cluster tasks          K · N_b² · (N_b + p) / W        one KAHM fit per cluster (Gram matrix,
                       (∝ N / W)                       its eigendecomposition, β)
predict                m · K · N_b · p / W  (∝ m N)    every test row against every cluster's rows
=====================  ==============================  =============================================

The k-means's GEMM term is counted, not fitted: each class's k-means runs in one task on its
k = ``kmeans_dims`` = 50 principal coordinates (docs/design.md, "A large class is clustered in its
principal coordinates"), n_it = 50 Lloyd iterations assumed (scikit-learn stops at its tolerance,
usually sooner), at the float64 GEMM rate of one core that ``bench_stages`` measured
(``stages.md``). It grows as N², but with k = 50 instead of p = 4096: at the runs' sizes (S ≤ 26
centres per class) it is a fraction of a second, at 100 GiB (S ≈ 655) tens of seconds.

The constants ``a`` are fitted on one run (``--calibrate``, default ``large_weak_1``: 1 worker)
and the model predicts the others from their N and W alone. The runs are those of
``benchmarks/bench_large.py`` (its results files are parsed: the Zarr route, data larger than the
workers' memory). The 100 GiB row applies the same constants, so it assumes what the runs
cannot show: storage whose bandwidth grows with the workers, and a scheduler and network that
keep up (docs/performance.md#past-one-machine-weak-scaling-and-a-cost-model discusses both).

    python -m benchmarks.cost_model [--calibrate large_weak_1] [--runs large_weak_2 large]
"""

from __future__ import annotations

import argparse
import re

from benchmarks._harness import RESULTS, markdown_table, quantity_table, write_report

STAGES = {  # results-file row → (stage name, exponent of N in f, depends on m)
    "ingest (generate + write) s": ("ingest", 1, False),
    "… class_grouping s": ("copy rows by class", 1, False),
    "… partition s": ("k-means per class", 1, False),
    "… grouping s": ("copy rows by cluster", 1, False),
    "… tasks s": ("cluster tasks", 1, False),
    "predict s": ("predict", 1, True),
}

#: The module's table, for the report.
FORMULAS = [
    ("ingest", "N · p / W", "every entry generated and written once"),
    ("copy rows by class", "N · p / W", "every entry read and written once"),
    ("k-means per class", "N · p / W + G", "the randomized SVD's passes over each class (fitted); G: the k-means "
                                           "of each class in one task on its (N / C, k) coordinates, ⌈C / W⌉ "
                                           "classes per worker of 2 · n_it · (N / C) · S · k flops, S ∝ N / (C · N_b), "
                                           "at the one-core GEMM rate (counted)"),
    ("copy rows by cluster", "N · p / W", "every entry read and written once"),
    ("cluster tasks", "K · N_b² · (N_b + p) / W (∝ N / W)", "one KAHM fit per cluster of about N_b rows"),
    ("predict", "m · K · N_b · p / W (∝ m · N / W)", "every test row against every cluster's rows"),
]

#: The 100 GiB run the model is asked about: float32 rows of 4096 features, 32 workers, 2048 test rows.
TARGET = {"name": "100 GiB, 32 workers (predicted)", "N": 100 * 2**30 // (4096 * 4), "W": 32, "m": 2048}

#: ``pipelines/large_synthetic.yaml``, which every run uses: features, classes, N_b; the k-means's
#: coordinates (``kmeans_dims``) and its assumed Lloyd iterations.
P, C, N_B = 4096, 10, 1000
K_DIMS, N_IT = 50, 50


def gemm_rate() -> float:
    """The one-core float64 GEMM rate (flop/s) of ``stages.md``."""
    return float(re.search(r"float64 GEMM, one core \| ([\d.]+) GFLOP/s", (RESULTS / "stages.md").read_text())
                 .group(1)) * 1e9


def kmeans_gemm_seconds(run: dict) -> float:
    """The k-means stage's counted GEMM time on W workers: ⌈C / W⌉ classes per worker, each
    2 · n_it · (N / C) · S · k flops at the one-core rate, S = N / (C · N_b)."""
    S = max(1.0, run["N"] / (C * N_B))
    return -(-C // run["W"]) * 2 * N_IT * (run["N"] / C) * S * K_DIMS / gemm_rate()


def read_run(name: str) -> dict:
    """N, W, m and the stage seconds of a ``bench_large`` results file."""
    path = RESULTS / f"{name}.md"
    text, rows = path.read_text(), quantity_table(path)
    n_train = int(rows["training data"].split(" × ")[0])
    workers = int(re.search(r"\((\d+) workers?\)", rows["total worker memory limit"]).group(1))
    n_total = int(re.search(r"--n-samples (\d+)", text).group(1)) if "--n-samples" in text else 264192
    return {"name": name, "N": n_train, "W": workers, "m": n_total - n_train,
            "seconds": {stage: float(rows[key]) for key, (stage, _, _) in STAGES.items() if key in rows},
            "total": float(rows["total s (with cluster start)"])}


def scale(run: dict, exponent: int, with_m: bool) -> float:
    """f(N, W) of the module's table, up to the constant: N^exponent (· m) / W."""
    return run["N"] ** exponent * (run["m"] if with_m else 1) / run["W"]


def predict(base: dict, target: dict) -> dict[str, float]:
    """Each stage's seconds for ``target`` from the constants fitted on ``base`` (the k-means's
    counted GEMM time apart)."""
    out = {}
    for stage, e, m in STAGES.values():
        if stage in base["seconds"]:
            gemm = (lambda run: kmeans_gemm_seconds(run)) if stage == "k-means per class" else (lambda run: 0.0)
            fitted = max(base["seconds"][stage] - gemm(base), 0.0)
            out[stage] = fitted * scale(target, e, m) / scale(base, e, m) + gemm(target)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibrate", default="large_weak_1")
    ap.add_argument("--runs", nargs="*", default=["large_weak_2", "large"])
    args = ap.parse_args(argv)
    base = read_run(args.calibrate)
    runs = [read_run(name) for name in args.runs]
    headers = ["stage", f"{base['name']} (N = {base['N']}, W = {base['W']}) s"]
    for run in runs:
        headers += [f"{run['name']} (N = {run['N']}, W = {run['W']}): predicted s", "measured s",
                    "measured / predicted"]
    headers += [f"{TARGET['name']}: N = {TARGET['N']}, W = {TARGET['W']}, m = {TARGET['m']}, s"]
    rows = []
    for stage, _, _ in STAGES.values():
        if stage not in base["seconds"]:
            continue
        row = [stage, f"{base['seconds'][stage]:.1f}"]
        for run in runs:
            guess, got = predict(base, run)[stage], run["seconds"].get(stage)
            row += [f"{guess:.1f}", "—" if got is None else f"{got:.1f}", "—" if got is None else f"{got / guess:.2f}"]
        row.append(f"{predict(base, TARGET)[stage]:.0f}")
        rows.append(row)
    totals = ["sum of the stages", f"{sum(base['seconds'].values()):.1f}"]
    for run in runs:
        guess, got = sum(predict(base, run).values()), sum(run["seconds"].values())
        totals += [f"{guess:.1f}", f"{got:.1f}", f"{got / guess:.2f}"]
    totals.append(f"{sum(predict(base, TARGET).values()):.0f}")
    rows.append(totals)
    facts = {"calibrated on": f"`{args.calibrate}.md`", "checked against": ", ".join(f"`{r}.md`" for r in args.runs),
             "one-core float64 GEMM rate (`stages.md`)": f"{gemm_rate() / 1e9:.1f} GFLOP/s",
             "k-means GEMM at 100 GiB, 32 workers (counted)": f"{kmeans_gemm_seconds(TARGET):.0f} s"}
    path = write_report("cost_model", "A cost model of the larger-than-memory pipeline", facts,
                        [("Stages", markdown_table(headers, rows)),
                         ("Model", markdown_table(["stage", "f(N, W)", "why"], FORMULAS))])
    print(path.read_text())


if __name__ == "__main__":
    main()
