"""Shared benchmark plumbing: fixed BLAS threads, machine facts, timing, markdown tables.

The machine is shared and noisy, so every benchmark (1) fixes the BLAS thread count with
threadpoolctl and records it, (2) records the load average before and after, and (3) reports
ratios against baselines measured in the same run.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import resource
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

RESULTS = Path(__file__).resolve().parent / "results"


@contextmanager
def blas_threads(n: int):
    """Limit BLAS/OpenMP threads to ``n`` for the block."""
    with threadpool_limits(limits=n):
        yield


def machine_facts(blas: int) -> dict[str, str]:
    """Facts a reader needs to judge the numbers: CPU, BLAS, threads, load, versions."""
    import dask
    import scipy
    import sklearn

    libs = {f"{i['internal_api']}:{i.get('version')}" for i in threadpool_info()}
    return {
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "scikit-learn": sklearn.__version__,
        "dask": dask.__version__,
        "cpu": f"{os.cpu_count()} cores, {platform.machine()}",
        "blas libraries": ", ".join(sorted(libs)),
        "blas threads (fixed)": str(blas),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "(unset)"),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def timed(fn: Callable[[], object], repeat: int = 1) -> tuple[float, object]:
    """Best wall time over ``repeat`` runs (the least disturbed by other load), and the result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def matmul_gflops(n: int = 2000, dtype=np.float64, repeat: int = 3) -> float:
    """Measured dense matmul rate (2n³ flops per product), GFLOP/s, best of ``repeat``."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    t, _ = timed(lambda: a @ b, repeat)
    return 2 * n**3 / t / 1e9


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_report(name: str, title: str, facts: dict[str, str], sections: Sequence[tuple[str, str]]) -> Path:
    """Write ``benchmarks/results/<name>.md`` with the facts and the tables; return the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    facts = dict(facts, **{"load average at end": " ".join(f"{x:.2f}" for x in os.getloadavg())})
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    command = f"python -m {spec.name}" if spec else f"python {sys.argv[0]}"
    parts = [f"# {title}", "", f"Command: `{' '.join([command, *sys.argv[1:]])}`", ""]
    parts += ["| fact | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in facts.items()]
    for heading, body in sections:
        parts += ["", f"## {heading}", "", body]
    path = RESULTS / f"{name}.md"
    path.write_text("\n".join(parts) + "\n")
    return path
