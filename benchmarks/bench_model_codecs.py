"""The model store's codec: writing and reading one cluster model under each candidate codec.

Every training task writes one cluster model (:func:`~kahm_dask.pipeline.stores.model.save_cluster`)
and every first prediction on a worker reads it back, so the codec's cost is paid once per
cluster on the fit's critical path. Two real models, fitted in this process with the default
recipe (n = 20, one layer):

* *MNIST*: 1000 MNIST training rows (784 features, tanh(pixel/255)), float64, whose β has the
  zero columns of the pixels that are zero in every row of the cluster;
* *4096 features*: 1000 rows of the 4 GiB run's generator (float32, features in (0, 1)), whose
  β has none.

Each codec writes the model ``--repeat`` times into a fresh local directory (the median save
time is kept), reads it back once (the load time) and counts the bytes on disk. Writes
``benchmarks/results/model_codecs.md``; the rule it backs is ``kahm_dask/storage/codecs.py``'s.

    python -m benchmarks.bench_model_codecs [--repeat 9]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from zarr.codecs import BloscCodec, ZstdCodec

from benchmarks._harness import blas_threads, load_mnist, machine_facts, markdown_table, tree_bytes, write_report
from kahm_dask.pipeline.stores import model as store
from kahm_dask.pipeline.stores.synthetic import synthetic_blobs
from kahm_dask.recipe import TrainParams

CODECS = {
    "zstd level 1": ZstdCodec(level=1),
    "blosc lz4 level 1, no shuffle": BloscCodec(cname="lz4", clevel=1, shuffle="noshuffle"),
    "blosc lz4 level 1, byte shuffle": BloscCodec(cname="lz4", clevel=1, shuffle="shuffle"),
    "none": None,
}


def models() -> dict[str, object]:
    """The two fitted cluster models (see the module docstring)."""
    mnist = load_mnist()[0][:1000]
    X, _ = synthetic_blobs(1000, 4096, 10, seed=0, dtype="float32", chunk_rows=1000)
    wide = np.asarray(X.compute())
    with blas_threads(1):
        return {name: TrainParams(20, 1).fit_cluster(rows, None).model
                for name, rows in (("MNIST, 1000 × 784 float64", mnist), ("4096 features, 1000 × 4096 float32", wide))}


def measure(model, codec, repeat: int) -> dict:
    """Median save time (ms), load time (ms) and bytes on disk of ``model`` under ``codec`` (set
    for this call in place of the store's :data:`~kahm_dask.storage.codecs.ARRAY_CODECS`)."""
    saved = dict(store.ARRAY_CODECS)
    store.ARRAY_CODECS.clear()
    store.ARRAY_CODECS.update({"compressors": codec})
    try:
        with tempfile.TemporaryDirectory() as tmp:
            times = []
            for k in range(repeat):
                t0 = time.perf_counter()
                store.save_cluster(tmp, 0, k, model, {"n_rows": 1000})
                times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            store.load_cluster(store.cluster_location(tmp, 0, 0))
            load = time.perf_counter() - t0
            size = tree_bytes(Path(tmp) / "clusters") / repeat
    finally:
        store.ARRAY_CODECS.clear()
        store.ARRAY_CODECS.update(saved)
    return {"save_ms": 1000 * statistics.median(times), "load_ms": 1000 * load, "mib": size / 2**20}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args(argv)
    facts = machine_facts(blas=1)
    facts["repeats"] = f"{args.repeat} writes per codec (median kept), one read"
    rows, raw = [], []
    for name, model in models().items():
        plain = None
        for codec_name, codec in reversed(CODECS.items()):  # "none" first: the ratio's reference
            r = measure(model, codec, args.repeat)
            plain = plain or r["mib"]
            raw.append({"model": name, "codec": codec_name, **r})
            rows.append([name, codec_name, f"{r['save_ms']:.1f}", f"{r['load_ms']:.1f}", f"{r['mib']:.2f}",
                         f"{plain / r['mib']:.2f}"])
            print(rows[-1], flush=True)
    table = markdown_table(["cluster model", "codec", "save ms (median)", "load ms", "MiB on disk", "ratio"], rows)
    write_report("model_codecs", "The model store's codec: one cluster model written and read", facts,
                 [("Results", table), ("Raw results", f"```\n{raw}\n```")])


if __name__ == "__main__":
    main()
