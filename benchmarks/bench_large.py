"""Larger-than-memory run: the pipeline on data bigger than the total worker memory.

Runs ``pipelines/large_synthetic.yaml`` (or ``--pipeline``) on a LocalCluster of 2 workers
capped at 1 GiB each, and records the data size, every stage's time, the peak resident memory
of each worker process and whether any worker was lost (killed by the nanny for exceeding its
memory limit, or crashed), the size of the model store on disk and, with Bokeh installed, Dask's
``performance_report`` of the run (``benchmarks/results/reports/<name>.html``). Writes
``benchmarks/results/large.md``, or ``large_dp.md`` for a DP run (``--epsilon``: secure discrete
Laplace noise on the whole 4 GiB matrix; the models are fitted on the noisy rows, the library's
default, or with ``--dp-data fabricated`` on rows fabricated with ``r_value`` = 4 smoother passes).

    python -m benchmarks.bench_large [--pipeline pipelines/large_synthetic.yaml] [--n-samples N]
                                     [--test-rows R] [--epsilon 2 [--dp-data noisy|fabricated]]
                                     [--non-private] [--workers W] [--n-probe K] [--name NAME]

``--test-rows`` keeps the test set at R rows whatever ``--n-samples`` (``data.test_size`` =
R / N); ``--non-private`` overrides a pipeline file's ``privacy.epsilon`` with none.
``pipelines/large_classes.yaml`` (classes along 16 directions, learnable from DP rows) is run at
several sizes by ``benchmarks/bench_large_accuracy.py``.

Weak scaling (the same rows per worker on 1 and 2 workers, ``large_weak_1.md`` and
``large_weak_2.md``): ``--workers 1 --n-samples 66048 --name large_weak_1``, then
``--workers 2 --n-samples 132096 --name large_weak_2``.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import numpy as np
from distributed.diagnostics import MemorySampler
from distributed.diagnostics.plugin import SchedulerPlugin

from benchmarks._harness import dask_report, machine_facts, markdown_table, tree_bytes, write_report
from kahm_dask.params import PARAMS
from kahm_dask.pipeline.cluster import connect
from kahm_dask.pipeline.config import load_config
from kahm_dask.pipeline.runs.central import run_pipeline
from kahm_dask.pipeline.runs.layout import run_paths


class WorkerLosses(SchedulerPlugin):
    """Counts workers removed from the scheduler during the run (killed or crashed)."""

    name = "kahm-worker-losses"

    def __init__(self) -> None:
        self.removed: list[str] = []
        self.closing = False

    def remove_worker(self, scheduler, worker, **kwargs) -> None:
        if not self.closing:
            self.removed.append(worker)


DP_NOTES = (
    "This run measures memory and time at scale, not utility: the generated classes differ by a few "
    "thousandths per feature (in [0, 1]) while the noise of ε = 2 per entry has a standard deviation of "
    "about 0.7 per entry, so the DP rows carry almost no class signal (accuracy near the "
    "1/10 of chance; the attack AUC near 0.5 says no membership signal either). A rerun into the "
    "same output reuses the stored noisy rows (the release is drawn once per data set), so its "
    "ingest and noise stages take well under a second."
)

DIRECTIONS_NOTES = (
    "The classes differ along {k} directions (data.synthetic.generator: directions, amplitude {a:g}; "
    "signal model in kahm_dask/pipeline/stores/synthetic.py::synthetic_directions). The DP noise of "
    "ε = {eps:g} per entry on [0, 1] has a standard deviation of about {sd:.2f} per entry, far above "
    "any class difference per entry, but it is independent across rows, so a class model fitted "
    "on many noisy rows recovers the class signal (see benchmarks/results/large_accuracy_vs_n.md)."
)


FABRICATION_PASSES = 4  # r_value of a fabricated run: a cost knob like n_layers


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv=None) -> dict:
    """Run once and write the report; return the measurements (bench_large_accuracy tabulates them)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pipeline", type=Path, default=Path("pipelines/large_synthetic.yaml"))
    ap.add_argument("--n-samples", type=int, help="override data.synthetic.n_samples")
    ap.add_argument("--output", type=Path, help="override the run directory")
    ap.add_argument("--epsilon", type=float, help="a DP run at this ε (privacy.epsilon)")
    ap.add_argument("--dp-data", choices=PARAMS["dp_data"].choices, default=PARAMS["dp_data"].default,
                    help="the DP rows the models are fitted on (with --epsilon)")
    ap.add_argument("--workers", type=int, help="override cluster.n_workers (each keeps its memory limit)")
    ap.add_argument("--n-probe", type=int,
                    help="route predictions and the membership distances to this many clusters per class "
                         "(model.n_probe; default: every cluster, eq. 64)")
    ap.add_argument("--test-rows", type=int, help="test rows (data.test_size = R / n_samples)")
    ap.add_argument("--non-private", action="store_true", help="override privacy.epsilon with none")
    ap.add_argument("--name", help="report name under benchmarks/results/ (default: large, or large_dp)")
    args = ap.parse_args(argv)

    cfg = load_config(args.pipeline)
    overrides = {}
    if args.n_samples:
        overrides["data.synthetic.n_samples"] = args.n_samples
    if args.output:
        overrides["output"] = str(args.output)
    if args.workers:
        overrides["cluster.n_workers"] = args.workers
    if args.epsilon and args.non_private:
        ap.error("--epsilon and --non-private exclude each other")
    if args.non_private:
        overrides["privacy.epsilon"] = None
    if args.epsilon:
        overrides["privacy.epsilon"] = args.epsilon
        overrides["privacy.dp_data"] = args.dp_data
        if args.dp_data == "fabricated":
            overrides["privacy.r_value"] = FABRICATION_PASSES
    if args.n_probe:
        overrides["model.n_probe"] = args.n_probe
    if overrides:
        cfg = cfg.with_overrides(**overrides)
    if args.test_rows:
        n_all = cfg.data.synthetic.n_samples
        if not 0 < args.test_rows < n_all:
            ap.error(f"--test-rows must be in (0, {n_all})")
        cfg = cfg.with_overrides(**{"data.test_size": args.test_rows / n_all})
    dp = cfg.privacy.epsilon is not None
    name = args.name or ("large_dp" if dp else "large")
    syn = cfg.data.synthetic
    if dp and syn.generator == "directions":
        notes = DIRECTIONS_NOTES.format(k=syn.n_directions, a=syn.amplitude, eps=cfg.privacy.epsilon,
                                        sd=np.sqrt(2.0) / cfg.privacy.epsilon)
    else:
        notes = DP_NOTES if dp else None
    data_gib = syn.n_samples * syn.n_features * (4 if syn.dtype == "float32" else 8) / 2**30
    facts = machine_facts(1)
    t0 = time.perf_counter()
    with connect(cfg.cluster) as client:
        losses = WorkerLosses()
        client.register_plugin(losses)
        info = client.scheduler_info()["workers"]
        limit_gib = sum(w["memory_limit"] for w in info.values()) / 2**30
        sampler = MemorySampler()
        with sampler.sample("cluster", interval=1.0), dask_report(name) as report:
            metrics = run_pipeline(cfg, client, progress=False)
        peaks = client.run(_peak_rss_mib)
        removed = client.run_on_scheduler(
            lambda dask_scheduler: list(dask_scheduler.plugins["kahm-worker-losses"].removed)
        )
        series = sampler.to_pandas()
    total_s = time.perf_counter() - t0
    store_gib = tree_bytes(run_paths(cfg.output, dp).model) / 2**30
    rows = [
        ["training data", f"{syn.n_samples - metrics['n_test']} × {syn.n_features} {syn.dtype}"],
        ["data size (all rows)", f"{data_gib:.2f} GiB"],
        ["total worker memory limit", f"{limit_gib:.2f} GiB ({len(info)} workers)"],
        ["workers lost during the run", len(removed)],
        ["peak RSS per worker (MiB)", ", ".join(f"{v:.0f}" for v in peaks.values())],
        ["peak cluster memory, sampled (MiB)", f"{series['cluster'].max() / 2**20:.0f}"],
        ["clusters trained", metrics["n_clusters"]],
        ["model store on disk", f"{store_gib:.2f} GiB ({store_gib / data_gib:.2f}× the data)"],
        ["ingest (generate + write) s", metrics["ingest_seconds"]],
        ["train s (all stages)", metrics["fit_seconds"]],
        *[[f"… {stage} s", seconds] for stage, seconds in metrics["fit_stage_seconds"].items()],
        ["prediction routing", f"n_probe = {cfg.model.n_probe}" if cfg.model.n_probe else "every cluster"],
        ["predict s", metrics["predict_seconds"]],
        ["evaluate s (accuracy; membership distances of the training subset)", metrics["evaluate_seconds"]],
        ["total s (with cluster start)", round(total_s, 1)],
        ["test accuracy", round(metrics["accuracy"], 4)],
        ["attack AUC", round(metrics.get("attack_auc", float("nan")), 4)],
        ["Dask performance report", "not written (Bokeh is not installed)" if report is None
         else f"[{report.name}](reports/{report.name})"],
    ]
    if dp:
        rows.insert(0, ["privacy", f"ε = {cfg.privacy.epsilon:g} per entry, {cfg.privacy.dp_data} rows"])
    path = write_report(
        name,
        "Larger-than-memory pipeline run" + (" with DP" if dp else ""),
        facts,
        [("Result", markdown_table(["quantity", "value"], rows))] + ([("Notes", notes)] if notes else []),
    )
    print(path.read_text())
    return {
        "name": name, "epsilon": cfg.privacy.epsilon, "n_train": syn.n_samples - metrics["n_test"],
        "n_test": metrics["n_test"], "n_features": syn.n_features, "data_gib": data_gib,
        "workers_lost": len(removed), "peak_rss_mib": [round(v) for v in peaks.values()],
        "ingest_s": metrics["ingest_seconds"], "fit_s": metrics["fit_seconds"],
        "fit_stage_s": dict(metrics["fit_stage_seconds"]), "predict_s": metrics["predict_seconds"],
        "evaluate_s": metrics["evaluate_seconds"], "total_s": round(total_s, 1),
        "accuracy": metrics["accuracy"], "attack_auc": metrics.get("attack_auc", float("nan")),
        "load_at_start": facts["load average at start"], "date": facts["date"],
    }


if __name__ == "__main__":
    main()
