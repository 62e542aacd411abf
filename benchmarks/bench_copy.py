"""The work-store copy of rows larger than the workers' memory: the permuted copy through storage
(``kahm_dask.pipeline.training.permute``, what the pipeline runs) against ``dask.array.shuffle``
(the copy it replaced), in one sitting, on the same rows and workers.

The rows are uniform random float32 values (``--gib`` GiB of 4096 features, the 4 GiB run's shape and
chunking: 2048-row chunks, zstd as the data store writes them) with 10 random classes; the copy
is the class-grouped one (rows sorted by class, original order within a class), the first copy a
larger-than-memory training run writes. Both run on a LocalCluster of ``--workers`` worker
processes of ``--memory-limit`` each (the 4 GiB run's 2 × 1 GiB by default), each method
``--repeat`` times (once by default: a 4 GiB sitting takes about 3 minutes), alternating, best
time kept. Both outputs are checked equal, row for row.
The floor is reading the rows once and writing them once at this process's Zarr rates measured
in the same run, split over the workers.

    python -m benchmarks.bench_copy [--gib 4] [--workers 2] [--memory-limit 1GiB] [--repeat 1]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import dask.array as da
import numpy as np
import zarr

from benchmarks._harness import machine_facts, markdown_table, write_report

N_FEATURES = 4096
CHUNK_ROWS = 2048
N_CLASSES = 10


def _noise_block(block_id=None) -> np.ndarray:
    rng = np.random.default_rng(block_id[0])
    return rng.random((CHUNK_ROWS, N_FEATURES), dtype=np.float32)


def shuffle_copy(source: da.Array, groups: list[np.ndarray], path: Path, chunk_rows: int) -> da.Array:
    """The copy the pipeline ran before: ``dask.array.shuffle`` of the groups (cut to chunk
    length) and a rechunk to ``chunk_rows`` rows, written with ``to_zarr``."""
    pieces = [g[i:i + chunk_rows].tolist() for g in groups for i in range(0, len(g), chunk_rows)]
    da.shuffle(source, pieces, axis=0).rechunk((chunk_rows, source.shape[1])).to_zarr(
        str(path), overwrite=True, zarr_format=3)
    return da.from_zarr(str(path))


def zarr_rates(where: Path, n_rows: int) -> tuple[float, float]:
    """(read, write) MB/s of this process moving ``n_rows`` rows of the benchmark's chunks
    through Zarr with zstd, best of three."""
    X = np.random.default_rng(0).random((n_rows, N_FEATURES), dtype=np.float32)
    read = write = float("inf")
    for i in range(3):
        path = where / f"rate{i}.zarr"
        t0 = time.perf_counter()
        arr = zarr.create_array(str(path), shape=X.shape, dtype=X.dtype, chunks=(CHUNK_ROWS, N_FEATURES),
                                compressors=zarr.codecs.ZstdCodec(), overwrite=True)
        arr[...] = X
        write = min(write, time.perf_counter() - t0)
        t0 = time.perf_counter()
        zarr.open_array(str(path), mode="r")[...]
        read = min(read, time.perf_counter() - t0)
        shutil.rmtree(path)
    return X.nbytes / read / 1e6, X.nbytes / write / 1e6


def main(argv: list[str] | None = None) -> None:
    from kahm_dask.pipeline.cluster import connect
    from kahm_dask.pipeline.config import ClusterConfig
    from kahm_dask.pipeline.training.layout import class_layout, write_grouped

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-limit", default="1GiB")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--where", type=Path, default=None, help="folder for the stores (default: a temporary one)")
    ap.add_argument("--name", default="copy")
    args = ap.parse_args(argv)

    n_rows = int(args.gib * 2**30 / (N_FEATURES * 4)) // CHUNK_ROWS * CHUNK_ROWS
    where = Path(tempfile.mkdtemp(prefix="kahm-bench-copy-", dir=args.where))
    facts = machine_facts(blas=1)
    try:
        read_mb, write_mb = zarr_rates(where, 8 * CHUNK_ROWS)
        labels = np.random.default_rng(1).integers(0, N_CLASSES, n_rows)
        layout = class_layout(labels)
        times: dict[str, float] = {"dask.array.shuffle": float("inf"), "permuted copy": float("inf")}
        cfg = ClusterConfig(n_workers=args.workers, threads_per_worker=1, memory_limit=args.memory_limit)
        with connect(cfg) as client:
            client.wait_for_workers(args.workers)
            source_path = where / "rows.zarr"
            da.map_blocks(_noise_block, dtype=np.float32, chunks=((CHUNK_ROWS,) * (n_rows // CHUNK_ROWS),
                                                                 (N_FEATURES,))).to_zarr(str(source_path))
            source = da.from_zarr(str(source_path))
            nbytes = source.nbytes
            for _ in range(args.repeat):
                for method in times:
                    client.run(_release_memory)
                    out = where / method.replace(" ", "_")
                    t0 = time.perf_counter()
                    if method == "dask.array.shuffle":
                        shuffle_copy(source, layout.groups, out, CHUNK_ROWS)
                    else:
                        write_grouped(source, layout.groups, out, CHUNK_ROWS)
                    times[method] = min(times[method], time.perf_counter() - t0)
            a = zarr.open_array(str(where / "dask.array.shuffle"), mode="r")
            b = zarr.open_array(str(where / "permuted_copy"), mode="r")
            for start in range(0, n_rows, 16 * CHUNK_ROWS):
                rows = slice(start, start + 16 * CHUNK_ROWS)
                if not np.array_equal(a[rows], b[rows]):
                    raise AssertionError(f"the two copies differ in rows {rows}")
        floor = (nbytes / (read_mb * 1e6) + nbytes / (write_mb * 1e6)) / args.workers
        base = times["dask.array.shuffle"]
        rows = [[m, f"{t:.1f}", f"{t / floor:.1f}", f"{t / base:.2f}"] for m, t in times.items()]
        facts.update({
            "rows": f"{n_rows} × {N_FEATURES} float32 ({nbytes / 2**30:.2f} GiB), chunks of {CHUNK_ROWS} rows, zstd",
            "workers": f"{args.workers} × {args.memory_limit}, 1 thread each",
            "zarr rates (one process)": f"read {read_mb:.0f} MB/s, write {write_mb:.0f} MB/s",
            "floor (read + write once, over the workers)": f"{floor:.1f} s",
            "repeats": f"{args.repeat} each, alternating, best kept",
        })
        table = markdown_table(["copy", "seconds", "× floor", "× dask.array.shuffle"], rows)
        path = write_report(args.name, "Class-grouped copy of rows larger than the workers' memory", facts,
                            [("Times", table + "\n\nBoth copies are equal, row for row.")])
        print(path.read_text())
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _release_memory() -> None:
    import gc

    from kahm_dask.pipeline.cluster.plugins import release_free_memory

    gc.collect()
    release_free_memory()


if __name__ == "__main__":
    main()
