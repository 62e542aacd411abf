"""Noise at small ε: the release time of the old exact path against the new one, same run.

``GridLaplace(ε, zeros(64), ones(64)).release(X)`` on digits-sized data (1257 × 64 entries)
and on 1 000 000 entries (15 625 × 64), for ε in {1, 0.1, 0.01, 1e-3, 1e-4, 1e-5, 1e-7, 1e-9}
(kahm_dask/privacy/noise.py, "Small ε"). Both codes share the fast path; they differ in the
exact path that decides the draws the fast path leaves open:

* **old**: ``U ≤ r^g`` as the rationals ``R**g / D**g`` in full (53·g bits, g ≈ Δ/ε;
  ``benchmarks/_noise_reference.py``). Each old release runs in a child process killed after
  ``--cap`` seconds (address space capped at ``--old-memory-gib``, since ``R**g`` at ε = 1e-9
  would need terabytes): the table then says "> cap s" (or MemoryError). With
  ``--skip-after-cap``, once the old code exceeds the cap at some ε, the smaller ε of the same
  size are not run (their exact draws are more numerous and larger).
* **new**: enclosures of ``r^g`` by interval arithmetic on integers of about 200 bits.

Per cell: wall and CPU time (one BLAS thread; the noise uses none), the share of draws sent to
the exact path (counted in the new run) and, for the new code, the time spent in that path,
including the digit tables it builds (a few ms; cleared before every new run).
The X values (uniform grey levels in [0, 1]) do not affect the cost. Old and new draw the same
64-bit words (a seeded generator fed through the secure source's code path: this benchmark
releases nothing), so they noise the same draws exactly and return the same noise.

    python -m benchmarks.bench_noise_small_eps [--cap 60] [--eps 1 0.1 ...] [--skip-after-cap]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import multiprocessing as mp
import resource
import time

import numpy as np

import kahm_dask.privacy.noise as noise_mod
from benchmarks._harness import blas_threads_loaded, machine_facts, markdown_table, write_report
from benchmarks._noise_reference import old_exact_path
from kahm_dask.privacy.noise import GridLaplace, laplace_ratio

EPSILONS = (1.0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-7, 1e-9)
SHAPES = ((1257, 64), (15_625, 64))
SEED = 2026


class SeededWords:
    """Words of a seeded PCG64, marked not reproducible so that ``release`` draws them as it
    draws secure words (in steps, not per global row block): the same words in both runs."""

    reproducible = False

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def words(self, n: int) -> np.ndarray:
        return self.rng.integers(0, 2**64, size=int(n), dtype=np.uint64, endpoint=False)

    def for_block(self, block: int) -> SeededWords:
        return self


def data(shape: tuple[int, int]) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 17, shape) / 16.0


def mechanism(eps: float) -> GridLaplace:
    return GridLaplace(eps, np.zeros(64), np.ones(64))


def run_new(eps: float, shape: tuple[int, int]) -> dict:
    """Time the release with the new exact path; count and time the exact draws."""
    mech, X = mechanism(eps), data(shape)
    noise_mod._digit_table.cache_clear()  # every run builds its own tables
    exact = {"draws": 0, "seconds": 0.0}
    real = noise_mod._geometric_exact

    def counted(word, ratio, source):
        t0 = time.perf_counter()
        try:
            return real(word, ratio, source)
        finally:
            exact["draws"] += 1
            exact["seconds"] += time.perf_counter() - t0

    noise_mod._geometric_exact = counted
    try:
        c0, w0 = time.process_time(), time.perf_counter()
        out = mech.release(X, SeededWords(SEED))
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    finally:
        noise_mod._geometric_exact = real
    assert np.isfinite(out).all()
    return {"wall": wall, "cpu": cpu, "digest": hashlib.sha256(out.tobytes()).hexdigest(), **exact}


def _address_space_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


def _old_child(eps: float, shape: tuple[int, int], memory_bytes: int, queue) -> None:
    limit = _address_space_bytes() + memory_bytes  # beyond what the forked child already maps
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    mech, X = mechanism(eps), data(shape)
    try:
        with old_exact_path():
            c0, w0 = time.process_time(), time.perf_counter()
            out = mech.release(X, SeededWords(SEED))
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            queue.put({"wall": wall, "cpu": cpu, "digest": hashlib.sha256(out.tobytes()).hexdigest()})
    except MemoryError:
        queue.put({"memory_error": True})


def run_old(eps: float, shape: tuple[int, int], cap: float, memory_gib: float) -> dict:
    """Time the release with the old exact path in a child process, killed after ``cap`` s."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_old_child, args=(eps, shape, int(memory_gib * 2**30), queue))
    w0 = time.perf_counter()
    child.start()
    child.join(cap)
    if child.is_alive():
        child.terminate()
        child.join()
        return {"capped": True, "after": time.perf_counter() - w0}
    result = queue.get() if not queue.empty() else {"memory_error": True}
    if result.get("memory_error"):
        return {"capped": True, "after": time.perf_counter() - w0, "memory_error": True}
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eps", type=float, nargs="+", default=list(EPSILONS))
    ap.add_argument("--cap", type=float, default=60.0, help="seconds before an old release is stopped")
    ap.add_argument("--old-memory-gib", type=float, default=4.0, help="address-space cap of an old release")
    ap.add_argument("--skip-after-cap", action="store_true",
                    help="do not run the old code at the smaller ε of a size once it exceeded the cap")
    ap.add_argument("--blas-threads", type=int, default=1)
    args = ap.parse_args(argv)

    with blas_threads_loaded(args.blas_threads):
        facts = machine_facts(args.blas_threads)
        facts["old-path cap"] = f"{args.cap:g} s wall, {args.old_memory_gib:g} GiB address space"
        rows = []
        for shape in SHAPES:
            old_capped_at = None
            for eps in args.eps:
                ratio = laplace_ratio(eps, 1025)
                new = run_new(eps, shape)
                if old_capped_at is not None and args.skip_after_cap:
                    old, old_cell = None, f"not run (> {args.cap:g} s at ε = {old_capped_at:g})"
                else:
                    old = run_old(eps, shape, args.cap, args.old_memory_gib)
                    if old.get("memory_error"):
                        old_capped_at = eps
                        old_cell = f"MemoryError after {old['after']:.3g} s (> {args.old_memory_gib:g} GiB)"
                    elif old.get("capped"):
                        old_capped_at = eps
                        old_cell = f"> {args.cap:g} s"
                    else:
                        old_cell = f"{old['wall']:.3g} s (CPU {old['cpu']:.3g} s)"
                n = shape[0] * shape[1]
                speedup = "" if old is None or old.get("capped") else f"{old['wall'] / new['wall']:.3g}"
                same = "–" if old is None or old.get("capped") else ("yes" if old["digest"] == new["digest"] else "NO")
                if old is not None and old.get("capped"):
                    speedup = f"> {old['after'] / new['wall']:.3g}"
                rows.append([
                    f"{shape[0]} × {shape[1]}", f"{n:,}", f"{eps:g}", f"{-1 / math.log(ratio):.3g}",
                    f"{new['draws']:,} ({new['draws'] / n:.2g})", old_cell,
                    f"{new['wall']:.3g} s (CPU {new['cpu']:.3g} s)", f"{new['seconds']:.3g} s",
                    f"{1e6 * new['seconds'] / max(new['draws'], 1):.3g}" if new["draws"] else "–", speedup, same,
                ])
                print(" | ".join(rows[-1]), flush=True)
    headers = ["X", "entries", "ε", "scale s", "exact draws (share)", "old release", "new release",
               "new: in exact path", "new: µs per exact draw", "old / new", "same release"]
    notes = (
        "The fast path is the same in both codes; the share of draws it leaves to the exact path "
        "is about 2^-36·s (s = −1/ln r ≈ 1025/ε), plus words below 2^40 (2^-24). The old exact path "
        "forms R**g (53·g bits, g ≈ s·ln(1/U)); the new one compares U with an enclosure of r^g "
        "at about 192 bits (kahm_dask/privacy/noise.py, *Exact comparisons*). Both decide every "
        "draw exactly and give the same noise for the same words (tests/privacy/test_noise.py); here "
        "both draw the same seeded words, so both decide the same draws. µs per exact draw includes "
        "building the new path's digit tables (a few ms a release), which dominates when there are few."
    )
    path = write_report(
        "noise_small_eps",
        "Noise at small ε: old and new exact path",
        facts,
        [("Release time", markdown_table(headers, rows) + "\n\n" + notes)],
    )
    print(path.read_text())


if __name__ == "__main__":
    main()
