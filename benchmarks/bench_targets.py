"""The pipeline's speed targets in one sitting: the baseline code and today's, row by row.

Runs every measurement behind the targets table of docs/performance.md#targets-of-the-pipelines-speed
for a baseline checkout (``--baseline-root``, the code before the work on the targets) and for this
tree, one after the other in one sitting, each as a subprocess run in its checkout (so that it and
its Dask workers import that checkout's code) with its own privacy ledger directory:

* ``mnist``    — :mod:`benchmarks.perf_mnist`, rows ``base_jobs2``, ``base_dask2``, ``new``,
  ``new_dask2`` and ``naive``: the Dask pipeline against the in-memory estimator (``n_jobs=2``)
  of the same code, and the in-memory prediction against a plain one-thread NumPy
  implementation and against its GEMM floor;
* ``scaling``  — each checkout's own :mod:`benchmarks.perf_scaling` (Dask, 60 000 and 600 000
  synthetic rows): how the routed prediction grows from 60 to 600 clusters;
* ``large``, ``large_dp`` — each checkout's own :mod:`benchmarks.bench_large` on the 4 GiB data
  (2 workers × 1 GiB), non-private and with ε = 2 per entry, the baseline first; the model
  store's size is measured here from the run folder;
* ``stages``   — :mod:`benchmarks.bench_stages`, this tree only (the floors are today's stages').

Each part's own results file is kept as ``benchmarks/results/<name>_<part>[_base].md``; the summary,
``<name>.md``, gives each target, the baseline's and today's value, their ratio, and whether today's
value meets the target or misses it by how much.

    python -m benchmarks.bench_targets --baseline-root /path/to/old/checkout [--parts mnist scaling large
                                       large_dp stages] [--where /scratch] [--name targets]

About 56 minutes on the 2-core machine of docs/performance.md (the four 4 GiB runs about 45).
``--n-train`` / ``--n-samples`` / ``--sizes`` shrink the data for a smoke run; ``--report-only``
rebuilds the summary's table from the raw results it holds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._harness import (
    CACHE,
    RESULTS,
    ROOT,
    baseline_commit,
    machine_facts,
    markdown_table,
    quantity_table,
    raw_results,
    tree_bytes,
    write_report,
)

PARTS = ("mnist", "scaling", "large", "large_dp", "stages")
#: ε per entry of the DP 4 GiB runs
DP_EPSILON = 2.0


def _run(code_root: Path, module: str, flags: list[str], ledgers: Path) -> None:
    """Run ``python -m benchmarks.<module> flags`` in ``code_root``, so that its ``kahm_dask`` and its
    ``benchmarks`` come first on the path (Dask's worker processes inherit the path), with its own
    privacy ledger directory (``XDG_DATA_HOME``); print when it starts and how long it took."""
    env = dict(os.environ, XDG_DATA_HOME=str(ledgers))
    t0 = time.perf_counter()
    print(f"[{time.strftime('%H:%M:%S')}] {code_root.name}: {module} {' '.join(flags)}", flush=True)
    subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *flags], cwd=code_root, env=env, check=True)
    print(f"[{time.strftime('%H:%M:%S')}] done in {time.perf_counter() - t0:.0f} s", flush=True)


def _keep(code_root: Path, written: str, kept: str) -> Path:
    """Copy a results file a checkout's benchmark wrote (``written``) to this tree's results as
    ``kept``; return the copy's path."""
    source, target = code_root / "benchmarks" / "results" / f"{written}.md", RESULTS / f"{kept}.md"
    if source.resolve() != target.resolve():
        shutil.copyfile(source, target)
    return target


def _model_bytes(output: Path) -> int:
    """Bytes on disk of the model store(s) a pipeline run wrote under ``output``."""
    return sum(tree_bytes(p) for p in output.rglob("model.zarr") if p.is_dir())


def measure(args, base: Path) -> dict:
    """Run the parts, baseline before today's code in each; return what the summary needs."""
    new, where, name = ROOT, args.where, args.name
    ledgers = {"base": where / "ledgers-base", "new": where / "ledgers-new"}
    out: dict = {}
    if "mnist" in args.parts:
        _run(new, "perf_mnist", ["--layers", "1", "--rows", "base_jobs2", "base_dask2", "new", "new_dask2",
                                 "naive", "--baseline-root", str(base), "--n-train", str(args.n_train),
                                 "--name", f"{name}_mnist"], ledgers["new"])
        out["mnist"] = raw_results(RESULTS / f"{name}_mnist.md")
    if "scaling" in args.parts:
        out["scaling"] = {}
        for code, root in (("base", base), ("new", new)):
            written = f"{name}_scaling" + ("_base" if code == "base" else "")
            _run(root, "perf_scaling", ["--engines", "dask2", "--sizes", *map(str, args.sizes), "--name", written],
                 ledgers[code])
            out["scaling"][code] = raw_results(_keep(root, written, written))
    for part in ("large", "large_dp"):
        if part not in args.parts:
            continue
        out[part] = {}
        for code, root in (("base", base), ("new", new)):
            output = where / f"{part}-{code}"
            shutil.rmtree(output, ignore_errors=True)
            kept = f"{name}_{part}" + ("_base" if code == "base" else "")
            flags = ["--output", str(output)]
            if args.n_samples:
                flags += ["--n-samples", str(args.n_samples)]
            if part == "large_dp":
                flags += ["--epsilon", str(DP_EPSILON)]
            if code == "new":  # the baseline's bench_large has no --name: it writes large(_dp).md
                flags += ["--name", kept]
            _run(root, "bench_large", flags, ledgers[code])
            result = quantity_table(_keep(root, kept if code == "new" else part, kept))
            result["model store bytes"] = _model_bytes(output)
            out[part][code] = result
            shutil.rmtree(output, ignore_errors=True)  # 4-10 GiB a run
    if "stages" in args.parts:
        _run(new, "bench_stages", ["--n-train", str(args.n_train or 60000), "--name", f"{name}_stages",
                                   "--tmp", str(where)], ledgers["new"])
        out["stages"] = json.loads((CACHE / f"{name}_stages.json").read_text())
    return out


def _verdict(value: float, target: float, unit: str = "×") -> str:
    """'met' or 'missed by …' for a value that must not exceed ``target`` (the excess to two
    significant digits, so that a near miss does not read 'missed by 0.00')."""
    if value <= target:
        return "met"
    return f"missed by {value - target:.2g}{unit}" if unit == "×" else f"missed by {value - target:.2g} {unit}"


def _ratio_row(work: str, target: float, base: float, new: float, how: str) -> list:
    return [work, f"≤ {target:g}×", f"{base:.2f}×", f"{new:.2f}×", f"{new / base:.2f}", _verdict(new, target), how]


def mnist_rows(r: dict) -> list[list]:
    """The MNIST targets: Dask over in-memory (fit, predict, routed), and the in-memory
    prediction against the naive implementation and against its GEMM floor."""
    b, bd, n, nd, naive = r["base_jobs2"], r["base_dask2"], r["new"], r["new_dask2"], r["naive"]
    rows = [
        _ratio_row(f"MNIST {n['n_train']} rows, L = 1: Dask pipeline fit (2 workers × 1 thread) / "
                   "`KAHMClassifier(n_jobs=2)` fit",
                   1.3, bd["fit_s"] / b["fit_s"], nd["fit_s"] / n["fit_s"],
                   f"baseline {bd['fit_s']:.1f} / {b['fit_s']:.1f} s; today {nd['fit_s']:.1f} / {n['fit_s']:.1f} s"),
        _ratio_row("same, exhaustive predict of 10 000 rows", 1.3, bd["predict_s"] / b["predict_s"],
                   nd["predict_s"] / n["predict_s"],
                   f"baseline {bd['predict_s']:.1f} / {b['predict_s']:.1f} s; "
                   f"today {nd['predict_s']:.1f} / {n['predict_s']:.1f} s"),
    ]
    if "predict_routed_s" in b:
        rows.append(_ratio_row(
            "same, routed predict (n_probe = 2)", 1.3, bd["predict_routed_s"] / b["predict_routed_s"],
            nd["predict_routed_s"] / n["predict_routed_s"],
            f"baseline {bd['predict_routed_s']:.1f} / {b['predict_routed_s']:.1f} s; "
            f"today {nd['predict_routed_s']:.1f} / {n['predict_routed_s']:.1f} s"))
    per_naive = naive["predict_s"] * n["n_test"] / naive["n_test"]  # the naive row predicts fewer rows
    floor = n["predict_gflop"] / (2 * n["gemm_gflops_one_core"])
    rows += [
        ["MNIST in-memory exhaustive predict / one-thread NumPy implementation (explicit inverse), per row",
         "≤ 0.35", f"{b['predict_s'] / per_naive:.2f}", f"{n['predict_s'] / per_naive:.2f}",
         f"{n['predict_s'] / b['predict_s']:.2f}", _verdict(n["predict_s"] / per_naive, 0.35, "(ratio)"),
         f"naive {naive['predict_s']:.1f} s for {naive['n_test']} rows ({per_naive:.1f} s per 10 000)"],
        ["MNIST in-memory exhaustive predict / its GEMM floor on 2 cores", "≤ 1.3×", "—",
         f"{n['predict_s'] / floor:.2f}×", "—", _verdict(n["predict_s"] / floor, 1.3),
         f"{n['predict_gflop']:.0f} GFLOP at 2 × {n['gemm_gflops_one_core']:.1f} GFLOP/s: {floor:.1f} s"],
    ]
    return rows


def _size(key: str) -> int:
    """The training rows of a perf_scaling result key ('engine/N')."""
    return int(key.split("/")[1])


def scaling_rows(r: dict) -> list[list]:
    """Routed pipeline prediction from the smallest to the largest size (clusters ≈ N/1000)."""
    def growth(res: dict, key: str) -> float | None:
        sizes = sorted(res, key=_size)
        small, large = res[sizes[0]], res[sizes[-1]]
        return large[key] / small[key] if key in small and key in large else None

    rows = []
    for key, what in (("predict_routed_s", "first routed call"), ("predict_routed_again_s", "routed again")):
        b, n = growth(r["base"], key), growth(r["new"], key)
        if n is None:
            continue
        clusters = " → ".join(str(r["new"][k]["n_clusters"]) for k in sorted(r["new"], key=_size))
        rows.append([f"routed pipeline predict, {clusters} clusters, growth ({what})", "≤ 2×",
                     "—" if b is None else f"{b:.1f}×", f"{n:.1f}×", "—" if b is None else f"{n / b:.2f}",
                     _verdict(n, 2.0), "each size's routed time over the smallest's"])
    return rows


def _worker_limit_mib(q: dict) -> float:
    """Each worker's memory limit, MiB, from bench_large's 'total worker memory limit' (e.g.
    '2.00 GiB (2 workers)')."""
    total, workers = q["total worker memory limit"].split(" GiB (")
    return float(total) * 1024 / int(workers.split()[0])


def large_rows(part: str, r: dict, target_min: float) -> list[list]:
    """A larger-than-memory run's targets: the whole run's minutes, no worker lost, peak RSS
    under the workers' limit, and (non-private) the model store's size against the data's."""
    b, n = r["base"], r["new"]
    limit = _worker_limit_mib(n)
    what = (f"{n['data size (all rows)']} " + ("non-private" if part == "large" else
                                              f"DP, ε = {DP_EPSILON:g} per entry, noisy rows")
            + f", {n['total worker memory limit'].split('(')[1].rstrip(')')} × {limit:.0f} MiB")
    tb, tn = (float(q["total s (with cluster start)"]) / 60 for q in (b, n))
    evaluate = "evaluate s (accuracy; membership distances of the training subset)"
    stages = ", ".join(f"{k.removeprefix('… ').removesuffix(' s')} {float(v):.0f}" for k, v in n.items()
                       if k.startswith("… "))
    measured = (f"today's stages, s: ingest {float(n['ingest (generate + write) s']):.0f}, {stages}; "
                f"predict {float(n['predict s']):.0f}")
    if evaluate in n:
        measured += f", evaluate {float(n[evaluate]):.0f}"

    def memory(q: dict) -> str:
        return f"{q['workers lost during the run']}; {q['peak RSS per worker (MiB)']}"

    held = (int(n["workers lost during the run"]) == 0
            and max(float(v) for v in n["peak RSS per worker (MiB)"].split(",")) < limit)
    rows = [[f"{what} (whole run, minutes)", f"≤ {target_min:g} min", f"{tb:.1f} min", f"{tn:.1f} min",
             f"{tn / tb:.2f}", _verdict(tn, target_min, "min"), measured],
            [f"{what}: workers lost; peak RSS per worker (MiB)", f"0; < {limit:.0f}", memory(b), memory(n), "—",
             "met" if held else "missed", ""]]
    if part == "large":
        data = float(n["data size (all rows)"].split()[0]) * 2**30
        sb, sn = b["model store bytes"] / data, n["model store bytes"] / data
        rows.append([f"model store of the {n['data size (all rows)']} data / the data", "≤ 1.1×", f"{sb:.2f}×",
                     f"{sn:.2f}×", f"{sn / sb:.2f}", _verdict(sn, 1.1),
                     f"{n['model store bytes'] / 2**30:.2f} GiB today"])
    return rows


def stage_rows(r: dict) -> list[list]:
    """Each MNIST pipeline stage against its floor (bench_stages)."""
    from benchmarks.bench_stages import floors

    worst = max(floors(r), key=lambda row: float(row[7].rstrip("×")))
    listing = "; ".join(f"{row[0]} {row[7]}" for row in floors(r))
    ratio = float(worst[7].rstrip("×"))
    return [["every stage of the MNIST pipeline within 2× its floor", "≤ 2×", "—", f"{ratio:.1f}× (worst)", "—",
             _verdict(ratio, 2.0), listing]]


def summary_rows(r: dict) -> list[list]:
    """The summary table's rows from the parts' results ``r`` (those that ran)."""
    rows = []
    if "mnist" in r:
        rows += mnist_rows(r["mnist"])
    if "scaling" in r:
        rows += scaling_rows(r["scaling"])
    if "large" in r:
        rows += large_rows("large", r["large"], 6.0)
    if "large_dp" in r:
        rows += large_rows("large_dp", r["large_dp"], 12.0)
    if "stages" in r:
        rows += stage_rows(r["stages"])
    return rows


TABLE_HEADERS = ["work", "target", "baseline", "today", "today / baseline", "verdict", "measured"]


def rebuild(path: Path) -> Path:
    """Rewrite the Targets table of an existing summary from its raw results (its facts, notes and
    measurements stay as they are): ``--report-only``."""
    text = path.read_text()
    start = text.index("## Targets\n\n") + len("## Targets\n\n")
    end = text.index("\n\n## Notes", start)
    path.write_text(text[:start] + markdown_table(TABLE_HEADERS, summary_rows(raw_results(path))) + text[end:])
    return path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-root", type=Path, help="checkout of the code to compare with (required to measure)")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--where", type=Path, default=Path("/tmp/kahm-targets"), help="folder for the runs' stores")
    ap.add_argument("--name", default="targets")
    ap.add_argument("--n-train", type=int, default=0, help="MNIST training rows (0: all; for smoke runs)")
    ap.add_argument("--sizes", type=int, nargs=2, default=[60_000, 600_000], help="perf_scaling's two sizes")
    ap.add_argument("--n-samples", type=int, default=0, help="rows of the large runs (0: the pipeline file's)")
    ap.add_argument("--report-only", action="store_true",
                    help="rebuild the Targets table of benchmarks/results/<name>.md from its raw results")
    args = ap.parse_args(argv)
    if args.report_only:
        print(rebuild(RESULTS / f"{args.name}.md").read_text())
        return
    if args.baseline_root is None:
        ap.error("--baseline-root is required to measure (only --report-only goes without it)")
    base = args.baseline_root.resolve()
    args.where.mkdir(parents=True, exist_ok=True)
    facts = machine_facts(1)
    facts["baseline code"] = baseline_commit(base)
    facts["today's code"] = baseline_commit(ROOT)
    t0 = time.perf_counter()
    r = measure(args, base)
    facts["sitting"] = f"{(time.perf_counter() - t0) / 60:.0f} min, parts in this order: {', '.join(args.parts)}"
    kept = sorted(p.name for p in RESULTS.glob(f"{args.name}_*.md"))
    notes = ("* One sitting: every part ran the baseline first, then today's code, one subprocess each; each "
             "part's own results file (machine facts, load, threads, memory limits) is kept beside this one: "
             + ", ".join(f"[`{k}`]({k})" for k in kept) + ".\n"
             "* 'today / baseline' is the ratio of today's value to the baseline's in this sitting.\n"
             "* A target met here is met in this sitting; docs/performance.md says which margins are within the "
             "machine's sitting-to-sitting spread.\n")
    path = write_report(args.name, "The pipeline's speed targets: the baseline code and today's, one sitting", facts,
                        [("Targets", markdown_table(TABLE_HEADERS, summary_rows(r))),
                         ("Notes", notes), ("Raw results (JSON)", "```json\n" + json.dumps(r, indent=1) + "\n```")])
    print(path.read_text())


if __name__ == "__main__":
    main()
