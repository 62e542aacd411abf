"""The privacy ledger's row index: check + update time and working memory at 10⁶ and 10⁷ rows.

For each size N, in a fresh ledger directory (kahm_dask/privacy/ledger.py):

* **first**: a release of N rows never seen (the index is written from empty);
* **overlap**: a release of N rows, half of them already in the index and half new (the index
  grows to 1.5 N rows: locate, new histories, blockwise merge into the next generation's files);
* **refused**: a release of the same rows again under a budget they would pass (locate and the
  check only: nothing is written);
* **digests**: the keyed digests of an (N, 64) float64 matrix in memory (``row_digests``),
  for N ≤ 10⁶ (the Dask path computes them block by block on the workers).

The rows are random 128-bit digests handed to the ledger as the function of the key it accepts
(what a dataset store passes), so the timings are the index's, not the hashing's. "heap peak"
is tracemalloc's peak of the operation (NumPy's allocations; the memory-mapped index files are
not heap), which includes the release's own digests (16 bytes a row) and their sort.

    python -m benchmarks.bench_row_ledger [--sizes 1000000 10000000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tracemalloc
import warnings

import numpy as np

from benchmarks._harness import blas_threads_loaded, machine_facts, markdown_table, peak_rss_mib, write_report
from kahm_dask.privacy.ledger import BudgetExceededError, BudgetRefusalWarning, PrivacyLedger
from kahm_dask.privacy.ledger_rows import new_key, row_digests

SIZES = (1_000_000, 10_000_000)


def _measure(fn) -> tuple[float, float]:
    """Wall seconds and tracemalloc heap peak (MiB) of ``fn()``."""
    tracemalloc.start()
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return seconds, peak


def _digests(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 2**64, size=(n, 2), dtype=np.uint64, endpoint=False)


def bench_size(n: int) -> list[list[object]]:
    rng = np.random.default_rng(n)
    old, new = _digests(rng, n), _digests(rng, n)
    overlap = np.r_[old[: n // 2], new[: n - n // 2]]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-row-ledger-") as root:
        def release(digests, name, budget=None):
            PrivacyLedger.for_data(lambda key: digests, root, budget).spend(1.0, 0.0, release_id=name, what=name)

        t, peak = _measure(lambda: release(old, "first"))
        rows.append([f"{n:,}", "first (N new rows)", f"{n:,}", t, peak])
        t, peak = _measure(lambda: release(overlap, "overlap"))
        rows.append([f"{n:,}", "overlap (N/2 known, N/2 new)", f"{n + n - n // 2:,}", t, peak])
        PrivacyLedger.for_data(lambda key: overlap, root).set_budget(2.0, 0.0)

        def refused():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", BudgetRefusalWarning)
                try:
                    release(overlap, "refused")
                except BudgetExceededError:
                    return
            raise AssertionError("the release beyond the budget was not refused")

        t, peak = _measure(refused)
        rows.append([f"{n:,}", "refused (check only)", f"{n + n - n // 2:,}", t, peak])
    if n <= 1_000_000:
        X = rng.uniform(size=(n, 64))
        key = new_key()
        t, peak = _measure(lambda: row_digests(X, key))
        rows.append([f"{n:,}", "digests of an (N, 64) matrix", "-", t, peak])
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    args = parser.parse_args(argv)
    with blas_threads_loaded(1):
        facts = machine_facts(1)
        table = []
        for n in args.sizes:
            table += bench_size(n)
            print(markdown_table(["N", "operation", "index rows after", "seconds", "heap peak MiB"], table), flush=True)
    facts["peak RSS of the process (MiB)"] = f"{peak_rss_mib():.0f}"
    write_report("row_ledger", "The privacy ledger's row index: check + update", facts,
                 [("Results", markdown_table(["N", "operation", "index rows after", "seconds", "heap peak MiB"],
                                              table))])


if __name__ == "__main__":
    main()
