"""The float64 prediction against its GEMM floor, and where one block's time goes (MNIST).

``KAHMClassifier(n_components=20, block_size=1000, random_state=0)`` fitted on MNIST (60 models,
one layer each). One thread (BLAS too), ``--rows`` test rows, the median of ``--repeats``:

* ``class_distances`` under ``eval_dtype="float64"``, the whole float64 evaluation;
* its *GEMM floor*: the products ``E·β`` of every model, (512 × N)·(N × (p + 1)) per block of 512
  rows, run alone on buffers of the same shapes: the one GEMM that is 97 % of the counted flops;
  and the same floor with the two small products (the query codes and the kernel exponents) added
  at the big product's rate;
* one block of 512 rows against one model, pass by pass (each pass timed alone on the buffers the
  evaluation uses, in its order): what the evaluation adds to the GEMM.

    python -m benchmarks.bench_gemm_floor [--rows 2048] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from benchmarks._harness import blas_threads, load_mnist, machine_facts, markdown_table, write_report

BLOCK = 512


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def block_passes(layer, x: np.ndarray, repeats: int) -> list[tuple[str, float]]:
    """Seconds of each pass of one block's float64 evaluation (``KAHM._images_into`` and the
    distance), alone, on buffers of the evaluation's shapes."""
    m, p = x.shape
    qm, qo, ca, beta = layer._query_map, layer._query_offset, layer._codes_aug, layer.beta_
    zq, E = np.empty((m, qm.shape[1])), np.empty((m, ca.shape[1]))
    weighted, images, diff = np.empty((m, p + 1)), np.empty((m, p)), np.empty((m, p))
    np.matmul(np.matmul(x, qm) + qo, ca, out=E)
    shifted = E - E.max(axis=1, keepdims=True)
    rowmax = E.max(axis=1, keepdims=True)
    den = np.ones((m, 1))

    def exp_pass() -> None:
        np.copyto(E, shifted)  # exp in place needs the exponents back each time; the copy is timed apart
        np.exp(E, out=E)

    copy = median_seconds(lambda: np.copyto(E, shifted), repeats)
    passes = [
        ("query codes, GEMM (m × p)·(p × (n + 1)) and offset", lambda: np.add(np.matmul(x, qm, out=zq), qo, out=zq)),
        ("kernel exponents, GEMM (m × (n + 1))·((n + 1) × N)", lambda: np.matmul(zq, ca, out=E)),
        ("row maximum", lambda: E.max(axis=1, keepdims=True)),
        ("row shift", lambda: np.subtract(E, rowmax, out=E)),
        ("exponential", exp_pass),
        ("weighted sum, GEMM (m × N)·(N × (p + 1))", lambda: np.matmul(E, beta, out=weighted)),
        ("quotient", lambda: np.divide(weighted[:, :p], den, out=images)),
        ("difference", lambda: np.subtract(x, images, out=diff)),
        ("row norms", lambda: np.sqrt(np.einsum("ij,ij->i", diff, diff))),
    ]
    out = [(name, median_seconds(fn, repeats)) for name, fn in passes]
    return [(name, s - copy) if name == "exponential" else (name, s) for name, s in out]


def main(argv: list[str] | None = None) -> None:
    from kahm_dask import KAHMClassifier
    from kahm_dask.kahm import _buffer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    facts = machine_facts(blas=1)
    Xtr, ytr, Xte, _ = load_mnist()
    clf = KAHMClassifier(n_components=20, block_size=1000, random_state=0, n_jobs=2).fit(Xtr, ytr)
    clf.set_params(eval_dtype="float64", n_jobs=1)
    x = np.ascontiguousarray(Xte[:args.rows])
    layers = [layer for model in clf.models_ for branch in model.branches_ for layer in branch.layers_]
    blocks = -(-args.rows // BLOCK)
    with blas_threads(1):
        whole = median_seconds(lambda: clf.class_distances(x), args.repeats)
        kernels = {layer.beta_.shape[0]: np.ones((BLOCK, layer.beta_.shape[0])) for layer in layers}

        def big_gemms() -> None:
            for _ in range(blocks):
                for layer in layers:
                    out = _buffer("floor", (BLOCK, layer.beta_.shape[1]))
                    np.matmul(kernels[layer.beta_.shape[0]], layer.beta_, out=out)

        floor = median_seconds(big_gemms, args.repeats)
        big = sum(2.0 * BLOCK * blocks * layer.beta_.size for layer in layers)
        small = sum(2.0 * BLOCK * blocks * (layer._query_map.size + layer._codes_aug.size) for layer in layers)
        passes = block_passes(layers[0], x[:BLOCK], max(args.repeats, 20))
    rate = big / floor / 1e9
    floor_all = floor * (big + small) / big
    rows = [["`class_distances`, float64", f"{whole:.3f}", "1.00", ""],
            ["the products E·β alone (the GEMM floor)", f"{floor:.3f}", f"{whole / floor:.2f}",
             f"{rate:.1f} GFLOP/s"],
            ["all three products at E·β's rate", f"{floor_all:.3f}", f"{whole / floor_all:.2f}",
             f"{(big + small) / 1e9:.0f} GFLOP"]]
    table = markdown_table(["work", "seconds (median)", "class_distances / this", "note"], rows)
    total = sum(s for _, s in passes)
    pass_rows = [[name, f"{1e3 * s:.2f}", f"{100 * s / total:.1f} %"] for name, s in passes]
    pass_rows.append(["sum of the passes", f"{1e3 * total:.2f}", "100 %"])
    pass_table = markdown_table(["pass", "ms", "share"], pass_rows)
    facts["data"] = f"MNIST, {args.rows} test rows, {len(layers)} models (one layer each), N = " \
                    f"{min(k for k in kernels)}–{max(k for k in kernels)}, p = {x.shape[1]}"
    write_report("gemm_floor", "The float64 prediction against its GEMM floor (MNIST, one thread)", facts,
                 [("Whole evaluation", table),
                  (f"One block of {BLOCK} rows against the first model (N = {layers[0].beta_.shape[0]})", pass_table)])


if __name__ == "__main__":
    main()
