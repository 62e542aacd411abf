"""The Dask estimator against the in-memory one, called exactly as a user calls them (MNIST).

Each code tree runs in its own subprocess (today's, and with ``--baseline-root`` the checkout
before this round, in the same sitting), which does what the user's script does::

    with Client(n_workers=2, threads_per_worker=1):                  # the user's own LocalCluster
        Xd = da.from_array(Xtr, chunks=(4096, -1)); Xq = da.from_array(Xte, chunks=(2048, -1))
        d = DaskKAHMClassifier(n_components=20, block_size=1000, random_state=0, store_dir=tmp).fit(Xd, ytr)
        d.predict(Xq).compute()
        m = KAHMClassifier(n_jobs=2, n_components=20, block_size=1000, random_state=0).fit(Xtr, ytr)
        m.predict(Xte)

in two ways a user runs it (``--modes``):

* ``script``: a script file with its imports at the top and the work under
  ``if __name__ == "__main__":`` (``benchmarks/_user_script.py``). Dask's worker processes start
  with multiprocessing's ``spawn``, which runs the top of the script again in each worker, so
  they import ``kahm_dask`` while ``Client(...)`` starts;
* ``function``: the imports inside the function that runs the snippet (as in a notebook, or a
  script that imports inside a function): the workers start without ``kahm_dask`` and load the
  task code in the first fit. The fit on fresh workers pays most here.

MNIST 60 000 training and 10 000 test rows, features tanh(pixel/255). Timed: the client's start,
and each call's wall time (the Dask fit includes everything it does on the new workers: loading
the task code if they have not, writing or holding the rows, the partition, the 60 cluster tasks;
the Dask prediction is the first after the fit). Then, not part of the snippet and reported apart,
the same fit and prediction again on the same client ("again": its workers have the code
loaded). ``--repeats`` runs of the whole snippet per tree and mode, alternating the trees; the
ratio of each run is Dask / in-memory of that same run. The client's BLAS is left as a user
leaves it (the in-memory estimator limits it to one thread per job itself; the workers' to one
per Dask thread); the load average before each run and the path of the ``kahm_dask`` the
workers imported are recorded.

    python -m benchmarks.bench_user_path [--baseline-root /path/to/old/checkout] [--repeats 2]
        [--modes script,function] [--report]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from benchmarks._harness import (
    ROOT,
    baseline_command,
    baseline_commit,
    dask_report,
    load_mnist,
    machine_facts,
    markdown_table,
    write_report,
)
from benchmarks._user_snippet import PARAMS, timed_snippet


def run_snippet(report: str | None = None) -> dict:
    """The user's script above, timed call by call in this process, its imports inside the
    function (:func:`~benchmarks._user_snippet.timed_snippet`); with ``report``, the Dask fit and
    prediction inside Dask's ``performance_report`` (``benchmarks/results/reports/<report>.html``)."""
    return timed_snippet(*load_mnist(), traced=(lambda: dask_report(report)) if report else nullcontext)


USER_SCRIPT = ROOT / "benchmarks" / "_user_script.py"


def _measure(tree: str, baseline_root: str | None, mode: str = "function", rows_path: str | None = None,
             report: str | None = None) -> dict:
    """One run of the snippet in a fresh subprocess on the tree at ``baseline_root`` (None:
    this one), as a function (``function``) or as the user's script file (``script``, which
    reads the rows from ``rows_path``)."""
    env = None
    if mode == "script":
        env = {**os.environ, "PYTHONPATH": str(ROOT if baseline_root is None else Path(baseline_root).resolve())}
        command = [sys.executable, str(USER_SCRIPT), str(rows_path)]
    else:
        flags = ["--one-run", *(["--report-name", report] if report else [])]
        command = ([sys.executable, "-m", "benchmarks.bench_user_path", *flags] if baseline_root is None
                   else baseline_command("bench_user_path", baseline_root, flags))
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT if baseline_root is None else "/",
                          env=env, check=True)
    return {"tree": tree, "mode": mode, **json.loads(done.stdout.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-root", help="checkout of the code before this round")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--name", default="user_path")
    parser.add_argument("--modes", default="script,function",
                        help="how the snippet runs: 'script' (a script file), 'function' (imports in a function)")
    parser.add_argument("--report", action="store_true",
                        help="one more run of today's code inside Dask's performance_report (not in the table)")
    parser.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--report-name", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_run:
        print(json.dumps(run_snippet(args.report_name)), flush=True)
        return
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"script", "function"}:
        parser.error(f"--modes takes 'script' and/or 'function', got {args.modes!r}")
    Xtr, ytr, Xte, yte = load_mnist()  # fetched once, before the clock
    facts = machine_facts(blas=1)
    facts["blas threads (fixed)"] = ("client: as the user leaves it (KAHMClassifier(n_jobs=2) limits BLAS to one "
                                     "thread per job); workers: one per Dask thread")
    facts["cluster"] = "Client(n_workers=2, threads_per_worker=1): the user's own LocalCluster"
    facts["data"] = "MNIST 60 000 train / 10 000 test, tanh(pixel/255), float64"
    facts["parameters"] = ", ".join(f"{k}={v}" for k, v in PARAMS.items())
    if args.baseline_root:
        facts["baseline"] = f"{baseline_commit(args.baseline_root)} at {args.baseline_root}"
    facts["modes"] = ", ".join(modes)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        rows_path = Path(tmp) / "mnist.npz"
        np.savez(rows_path, Xtr=Xtr, ytr=ytr, Xte=Xte, yte=yte)
        for repeat in range(args.repeats):
            for mode in modes:
                for tree, root in (("today", None), ("baseline", args.baseline_root)):
                    if tree == "baseline" and root is None:
                        continue
                    runs.append({"repeat": repeat, **_measure(tree, root, mode, rows_path)})
                    print(runs[-1], flush=True)
    sections = []
    if args.report:
        traced = _measure("today", None, report=args.name)  # function mode: the report needs this module
        sections.append(("Dask's performance report", f"One more run of today's code, its Dask fit and prediction "
                         f"inside `performance_report` (not in the table: the report's sampling costs time): fit "
                         f"{traced['dask_fit_s']:.2f} s, predict {traced['dask_predict_s']:.2f} s; "
                         f"[reports/{args.name}.html](reports/{args.name}.html)."))
    rows = [[r["tree"], r["mode"], r["repeat"], f"{r['load_before']:.2f}", f"{r['client_start_s']:.2f}",
             f"{r['dask_fit_s']:.2f}", f"{r['mem_fit_s']:.2f}",
             f"{r['dask_fit_s'] / r['mem_fit_s']:.2f}", f"{r['dask_predict_s']:.2f}", f"{r['mem_predict_s']:.2f}",
             f"{r['dask_predict_s'] / r['mem_predict_s']:.2f}", f"{r['agreement']:.4f}", f"{r['accuracy']:.4f}",
             f"{r['dask_fit_again_s'] / r['mem_fit_s']:.2f}", f"{r['dask_predict_again_s'] / r['mem_predict_s']:.2f}"]
            for r in runs]
    table = markdown_table(
        ["code", "mode", "run", "load before", "client start s", "Dask fit s", "in-memory fit s", "fit ratio",
         "Dask predict s", "in-memory predict s", "predict ratio", "agreement", "accuracy",
         "fit again ratio (not the snippet)", "predict again ratio (not the snippet)"], rows)
    write_report(args.name, "The Dask estimator on the user's path against the in-memory estimator (MNIST)", facts,
                 [("Results", table), *sections, ("Raw results", f"```\n{runs}\n```")])


if __name__ == "__main__":
    main()
