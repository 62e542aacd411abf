"""The ingest stage: ``write_dataset`` of rows larger than the workers' memory and of rows in the
client, for this tree's code and a baseline checkout (``--baseline-root``), in one sitting.

Two writes per code, each in its own process (``--repeat`` times, the codes alternating, best
time kept):

* *Dask rows*: the 4 GiB run's training rows (``synthetic_blobs``, ``--gib`` GiB of 4096 float32
  features in 2048-row chunks, generated lazily) written by ``write_dataset`` on a LocalCluster of
  2 worker processes × 1 GiB started by ``connect``, as ``kahm-dask run`` writes them;
* *client rows*: a (60 000, 784) float64 array in the client's memory (MNIST's shape), written by
  ``write_dataset`` in the client alone, as the estimator and ``bench_stages`` write it.

The floor of the Dask write is the generation of the rows alone on the same workers (measured in
the same process) plus their bytes at this machine's one-process Zarr write rate (zstd, measured
in the same run) split over the workers; of the client write, its bytes at that rate. Both codes
must store the same fingerprint of the same rows (checked).

    python -m benchmarks.bench_ingest [--gib 4] [--baseline-root /path/to/old/checkout] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._harness import ROOT, baseline_command, baseline_commit, machine_facts, markdown_table, write_report

N_FEATURES = 4096
CHUNK_ROWS = 2048
CLIENT_SHAPE = (60_000, 784)


def measure(gib: float, where: Path) -> dict:
    """One code's two ingests (this process's ``kahm_dask``): seconds and stored fingerprints."""
    from kahm_dask.pipeline.cluster import connect
    from kahm_dask.pipeline.config import ClusterConfig
    from kahm_dask.pipeline.stores.dataset import write_dataset
    from kahm_dask.pipeline.stores.synthetic import synthetic_blobs

    n_rows = int(gib * 2**30 / (N_FEATURES * 4)) // CHUNK_ROWS * CHUNK_ROWS
    X, y = synthetic_blobs(n_rows, N_FEATURES, 10, seed=0, dtype="float32", chunk_rows=CHUNK_ROWS)
    out: dict = {"n_rows": n_rows, "nbytes": int(X.nbytes), "load_before": os.getloadavg()[0]}
    cfg = ClusterConfig(n_workers=2, threads_per_worker=1, memory_limit="1GiB")
    with connect(cfg) as client:
        client.wait_for_workers(2)
        t0 = time.perf_counter()
        X[:, :1].compute()  # every block generated whole, one column kept: generation alone
        out["generate_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        store = write_dataset(where / "dask.zarr", X, y, chunk_rows=CHUNK_ROWS, dtype="float32")
        out["dask_s"] = time.perf_counter() - t0
        out["dask_fingerprint"] = store.attrs["fingerprint"]["order"]
        out["kahm_dask_from"] = sorted(set(client.run(eval, "__import__('kahm_dask').__file__").values()))
    rows = np.random.default_rng(1).random(CLIENT_SHAPE)
    labels = np.arange(CLIENT_SHAPE[0]) % 10
    t0 = time.perf_counter()
    store = write_dataset(where / "client.zarr", rows, labels)
    out["client_s"] = time.perf_counter() - t0
    out["client_nbytes"] = int(rows.nbytes)
    out["client_fingerprint"] = store.attrs["fingerprint"]["order"]
    out["load_after"] = os.getloadavg()[0]
    return out


def _command(code: str, args, out: str, where: str) -> list[str]:
    """The row's command line; the baseline imports ``kahm_dask`` from its checkout first (and only
    it, so that the worker processes, which inherit ``sys.path``, import it too)."""
    flags = ["--worker", "--gib", str(args.gib), "--out", out, "--where", where]
    if code == "new":
        return [sys.executable, "-m", "benchmarks.bench_ingest", *flags]
    return baseline_command("bench_ingest", args.baseline_root, flags)


def _zarr_write_rate(where: Path) -> float:
    from benchmarks.bench_copy import zarr_rates

    return zarr_rates(where, 8 * CHUNK_ROWS)[1]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--baseline-root", help="checkout of the code to compare with")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--name", default="ingest")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--where", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        Path(args.out).write_text(json.dumps(measure(args.gib, Path(args.where))))
        return

    facts = machine_facts(blas=1)
    codes = ["new"] + (["base"] if args.baseline_root else [])
    if args.baseline_root:
        facts["baseline code"] = baseline_commit(args.baseline_root)
    where = Path(tempfile.mkdtemp(prefix="kahm-bench-ingest-"))
    best: dict[str, dict] = {}
    try:
        write_mb = _zarr_write_rate(where)
        for _ in range(args.repeat):
            for code in codes:
                out = where / f"{code}.json"
                subprocess.run(_command(code, args, str(out), str(where)), check=True, cwd=ROOT)
                r = json.loads(out.read_text())
                for store in ("dask.zarr", "client.zarr"):
                    shutil.rmtree(where / store)
                print(f"{code}: {r}", flush=True)
                if code not in best:
                    best[code] = r
                else:
                    for key in ("generate_s", "dask_s", "client_s"):
                        best[code][key] = min(best[code][key], r[key])
    finally:
        shutil.rmtree(where, ignore_errors=True)
    if any(len({r[key] for r in best.values()}) > 1 for key in ("dask_fingerprint", "client_fingerprint")):
        raise AssertionError(f"the codes stored different fingerprints of the same rows: {best}")
    new = best["new"]
    dask_floor = new["generate_s"] + new["nbytes"] / (write_mb * 1e6) / 2
    client_floor = new["client_nbytes"] / (write_mb * 1e6)
    rows = []
    for code, r in best.items():
        rows.append([code, f"{r['generate_s']:.1f}", f"{r['dask_s']:.1f}", f"{r['dask_s'] / dask_floor:.2f}",
                     f"{r['dask_s'] / best[codes[-1]]['dask_s']:.2f}", f"{r['client_s']:.2f}",
                     f"{r['client_s'] / client_floor:.2f}", f"{r['client_s'] / best[codes[-1]]['client_s']:.2f}",
                     f"{r['load_before']:.1f} → {r['load_after']:.1f}"])
    facts.update({
        "dask rows": f"{new['n_rows']} × {N_FEATURES} float32 ({new['nbytes'] / 2**30:.2f} GiB), "
                     f"{CHUNK_ROWS}-row chunks, 2 workers × 1 GiB, 1 thread each",
        "client rows": f"{CLIENT_SHAPE[0]} × {CLIENT_SHAPE[1]} float64 ({new['client_nbytes'] / 2**20:.0f} MiB)",
        "zarr write rate (one process, zstd)": f"{write_mb:.0f} MB/s",
        "floors": f"dask rows {dask_floor:.1f} s (generation alone + write over 2 workers), "
                  f"client rows {client_floor:.2f} s",
        "repeats": f"{args.repeat} per code, alternating, best kept",
    })
    base = codes[-1]
    table = markdown_table(
        ["code", "generate alone s", "dask rows s", "× floor", f"× {base}", "client rows s", "× floor",
         f"× {base}", "load (1 min) before → after"], rows)
    path = write_report(args.name, "Ingest: write_dataset of Dask rows and of client rows", facts,
                        [("Times", table + "\n\nBoth codes stored the same fingerprints of the same rows."),
                         ("Raw results (JSON)", "```json\n" + json.dumps(best, indent=1) + "\n```")])
    print(path.read_text())


if __name__ == "__main__":
    main()
