"""``kahm-dask release`` of rows larger than a worker's memory: the client never holds them.

A dataset store of ``--gib`` GiB (``synthetic_blobs``: 4096 float32 features in 2048-row chunks,
bounds [0, 1] recorded) is written, then released once at ε = 2 (noisy rows) by
:func:`~kahm_dask.pipeline.release.release_store` on a LocalCluster of 2 worker processes ×
``--memory-limit`` (default 512 MiB), as ``kahm-dask release`` does, in each ``--formats``.
Measured: wall time, the client's peak RSS (this process: scheduler and client, sampled during
the release), the peak RSS of the whole process tree (client and workers), and the bytes
written, and whether the workers that started the release are the ones that ended it (a worker
killed for memory and restarted would not be). The client would need at least the rows' bytes
to hold them once.

    python -m benchmarks.bench_release [--gib 1 [4 ...]] [--formats parquet zarr] [--memory-limit 512MiB]

Several ``--gib`` are measured one after the other in one sitting (each on a fresh cluster and
store), e.g. ``--gib 1 4`` for the smaller size as the baseline of the larger. Results go to
``results/release.md`` for 1 GiB alone and to ``results/release_<largest>gib.md`` otherwise, so
each size keeps its own table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks._harness import PeakTreeRSS, machine_facts, markdown_table, tree_bytes, write_report

N_FEATURES = 4096
CHUNK_ROWS = 2048


class PeakRSS(PeakTreeRSS):
    """Peak RSS (MiB) of this process alone, sampled like :class:`PeakTreeRSS`."""

    def _sample(self) -> float:
        import psutil

        return psutil.Process().memory_info().rss / 2**20


def measure(gib: float, formats: list[str], memory_limit: str, where: Path) -> list[dict]:
    from kahm_dask.pipeline.cluster import connect
    from kahm_dask.pipeline.config import ClusterConfig
    from kahm_dask.pipeline.estimator import DaskKAHMClassifier
    from kahm_dask.pipeline.release import release_store
    from kahm_dask.pipeline.stores.dataset import write_dataset
    from kahm_dask.pipeline.stores.synthetic import synthetic_blobs
    from kahm_dask.privacy.ledger import PrivacyLedger

    n_rows = int(gib * 2**30 / (N_FEATURES * 4)) // CHUNK_ROWS * CHUNK_ROWS
    X, y = synthetic_blobs(n_rows, N_FEATURES, 10, seed=0, dtype="float32", chunk_rows=CHUNK_ROWS)
    rows = []
    cfg = ClusterConfig(n_workers=2, threads_per_worker=1, memory_limit=memory_limit)
    with connect(cfg) as client:
        client.wait_for_workers(2)
        t0 = time.perf_counter()
        store = write_dataset(where / "data.zarr", X, y, chunk_rows=CHUNK_ROWS, dtype="float32",
                              feature_range=(0.0, 1.0))
        ingest_s = time.perf_counter() - t0
        for fmt in formats:
            settings = DaskKAHMClassifier(epsilon=2.0, ledger=PrivacyLedger()).train_settings()
            out = where / f"release.{fmt}"
            load = os.getloadavg()[0]
            workers = set(client.scheduler_info()["workers"])
            with PeakRSS(0.1) as client_rss, PeakTreeRSS(0.25) as tree_rss:
                t0 = time.perf_counter()
                summary = release_store(store, out, settings, fmt=fmt)
                seconds = time.perf_counter() - t0
            same_workers = set(client.scheduler_info()["workers"]) == workers
            written = tree_bytes(out) if out.is_dir() else out.stat().st_size
            rows.append(row := {"gib": gib, "format": fmt, "n_rows": summary["n_rows"], "rows_mib": X.nbytes / 2**20,
                         "seconds": seconds, "client_peak_mib": client_rss.peak_mib,
                         "tree_peak_mib": tree_rss.peak_mib, "written_mib": written / 2**20,
                         "ingest_s": ingest_s, "load_before": load, "load_after": os.getloadavg()[0],
                         "same_workers": same_workers})
            print(row, flush=True)
            if out.is_dir():
                shutil.rmtree(out)
            else:
                out.unlink()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, nargs="+", default=[1.0])
    parser.add_argument("--formats", nargs="+", default=["parquet", "zarr"], choices=["parquet", "csv", "zarr"])
    parser.add_argument("--memory-limit", default="512MiB")
    args = parser.parse_args()
    facts = machine_facts(1)  # the load average at the start
    rows = []
    for gib in args.gib:
        with tempfile.TemporaryDirectory(prefix="bench-release-") as tmp:
            rows += measure(gib, args.formats, args.memory_limit, Path(tmp))
    table = markdown_table(
        ["GiB", "format", "rows", "rows (MiB)", "ingest of the store (s)", "release (s)", "client peak RSS (MiB)",
         "client + workers peak RSS (MiB)", "written (MiB)", "no worker lost", "load before / after"],
        [[f"{r['gib']:g}", r["format"], r["n_rows"], f"{r['rows_mib']:.0f}", f"{r['ingest_s']:.1f}",
          f"{r['seconds']:.1f}", f"{r['client_peak_mib']:.0f}", f"{r['tree_peak_mib']:.0f}",
          f"{r['written_mib']:.0f}", "yes" if r["same_workers"] else "NO",
          f"{r['load_before']:.2f} / {r['load_after']:.2f}"] for r in rows],
    )
    facts |= {"workers": f"2 processes x 1 thread, memory limit {args.memory_limit} each",
              "rows": f"synthetic_blobs, {N_FEATURES} float32 features, {CHUNK_ROWS}-row chunks",
              "release": "epsilon = 2 per entry, noisy rows, public bounds [0, 1] recorded in the store"}
    largest = max(args.gib)
    name = "release" if args.gib == [1.0] else f"release_{largest:g}gib"
    path = write_report(name, "kahm-dask release: rows larger than a worker, never held by the client",
                        facts, [("Results", table), ("Raw results", "```\n" + repr(rows) + "\n```")])
    print(path.read_text())


if __name__ == "__main__":
    main()
