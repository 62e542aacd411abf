"""Shared helpers of the reliability tests (docs/reliability.md).

* :func:`sigkill` — kill a worker started by ``tests/_cluster.py:subprocess_cluster`` (which
  starts them with ``--no-nanny``, so a SIGKILLed worker stays dead);
* :func:`pipeline_yaml` — the synthetic DP pipeline used by the slow tests (≈ 20 cluster tasks
  of ≈ 250 rows, dask-ml k-means with S = 2 per class, ε = 2, fully post-processed);
* :func:`start_from_noise_of` — give a new run folder the stored noisy rows of another run, so
  that two runs of secure (never repeated) noise can be compared bit for bit;
* :func:`run_fingerprint` — every array and attribute of a run's model store and predictions,
  to compare two runs bit for bit;
* :class:`RowScanner` — finds original training rows (exact or to 1e-9) anywhere in a file,
  a Zarr store, a text or a Python object, whatever the layout.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from scipy.spatial import cKDTree

from .._objects import reachable_arrays

# --------------------------------------------------------------------------- processes


def sigkill(proc: subprocess.Popen) -> None:
    """SIGKILL one process this test started, by its pid."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


# --------------------------------------------------------------------------- the pipeline

#: Synthetic DP pipeline of the slow tests. 7200 rows × 16 features, 10 classes → 5040
#: training rows, ≈ 504 per class → one cluster per class (block_size 1000): 10 tasks of
#: ≈ 500 rows, each 10 fixed smoothing passes and a 5-layer DeepKAHM (≈ 1 s per task).
#: (dask-ml k-means on a process cluster costs ≈ 30 s here; its determinism is tested apart.)
SYNTHETIC_PIPELINE = """\
name: reliability
seed: {seed}
output: {output}
data:
  source: synthetic:blobs
  synthetic:
    n_samples: 7200
    n_features: 16
    n_classes: 10
  chunk_rows: 1000
  bounds: [0, 1]
model:
  n_components: 20
  n_layers: 5
  block_size: 1000
privacy:
  epsilon: 2.0
  r_source: passes
  r_value: 10
  cluster_on: noisy
evaluate:
  membership: false
report:
  plots: false
cluster:
{cluster}
"""


def pipeline_yaml(path: Path, output: Path, *, n_workers: int = 2, scheduler: str | None = None,
                  processes: bool = True, seed: int | None = 11) -> Path:
    """Write the synthetic pipeline file to ``path``; returns ``path``.

    ``seed=None`` is the default of real runs: a k-means seed drawn once and kept in
    ``<output>/owner/work``.
    """
    if scheduler is not None:
        cluster = f"  scheduler: {scheduler}"
    else:
        cluster = f"  n_workers: {n_workers}\n  processes: {str(processes).lower()}\n  memory_limit: 1GiB"
    seed_text = "null" if seed is None else str(seed)
    path.write_text(SYNTHETIC_PIPELINE.format(output=output, cluster=cluster, seed=seed_text))
    return path


def run_pipeline_file(path: Path, client=None) -> dict:
    """Run a pipeline file in this process (on ``client``, or on the cluster it describes)."""
    from kahm_dask.pipeline.cluster import connect
    from kahm_dask.pipeline.config import load_config
    from kahm_dask.pipeline.runs.central import run_pipeline

    cfg = load_config(path)
    if client is not None:
        return run_pipeline(cfg, client, progress=False)
    with connect(cfg.cluster) as own:
        return run_pipeline(cfg, own, progress=False)


def run_stores(run: Path) -> tuple[Path, Path]:
    """``(model store, predictions)`` of a DP run folder (``public/`` and ``owner/``)."""
    return Path(run) / "public" / "model.zarr", Path(run) / "owner" / "predictions.zarr"


def staged_model(run: Path) -> Path:
    """The model store of a run folder while it is trained: staged in the owner's work store,
    moved to ``public/`` when every cluster is written."""
    return Path(run) / "owner" / "work" / "model.zarr"


def start_from_noise_of(src_run: Path, dst_run: Path) -> None:
    """Copy the data stores (with their ledger) and the stored noisy rows (with their marker
    and noise_id) of the run folder ``src_run`` into a new run folder ``dst_run``: a run there
    reuses them, so it can be compared bit for bit with ``src_run`` although the noise is
    secure (never drawn twice). Nothing else of ``src_run`` is copied."""
    src, dst = Path(src_run) / "owner", Path(dst_run) / "owner"
    dst.mkdir(parents=True)
    shutil.copytree(src / "data", dst / "data")
    shutil.copytree(src / "work" / "X_noisy", dst / "work" / "X_noisy")


def complete_clusters(model_path: Path) -> int:
    """Number of clusters with a completion marker in a model store."""
    clusters = Path(model_path) / "clusters"
    if not clusters.is_dir():
        return 0
    return sum(1 for d in clusters.iterdir() if (d / "_COMPLETE.json").is_file())


def n_planned_clusters(model_path: Path) -> int | None:
    """Number of clusters the manifest lists (None before the manifest is written)."""
    try:
        from kahm_dask.pipeline.stores.manifest import read_manifest

        return len(read_manifest(model_path)["clusters"])
    except (FileNotFoundError, ValueError, KeyError, json.JSONDecodeError):
        return None


def _arrays(root: Path) -> dict[str, np.ndarray]:
    out = {}
    for meta in sorted(root.rglob("zarr.json")):
        node = json.loads(meta.read_text())
        if node.get("node_type") == "array":
            out[str(meta.parent.relative_to(root))] = zarr.open_array(meta.parent, mode="r")[...]
    return out


def _attrs(root: Path) -> dict[str, dict]:
    out = {}
    for meta in sorted(root.rglob("zarr.json")):
        out[str(meta.parent.relative_to(root))] = json.loads(meta.read_text()).get("attributes", {})
    return out


def run_fingerprint(model_path: Path, pred_path: Path | None = None) -> dict:
    """Arrays and attributes of the complete clusters (+ predictions), for bitwise comparison."""
    model_path = Path(model_path)
    clusters = sorted(d for d in (model_path / "clusters").iterdir() if (d / "_COMPLETE.json").is_file())
    fp = {"manifest": _attrs(model_path)["."], "clusters": [d.name for d in clusters]}
    for d in clusters:
        fp[f"arrays/{d.name}"] = _arrays(d)
        fp[f"attrs/{d.name}"] = _attrs(d)
    if pred_path is not None:
        fp["predictions"] = _arrays(Path(pred_path))
        fp["prediction_attrs"] = _attrs(Path(pred_path))
    return fp


def assert_same_fingerprint(a: dict, b: dict) -> None:
    """Bit-for-bit equality of two fingerprints (dtype, shape and every byte of every array)."""
    assert a.keys() == b.keys()
    for key in a:
        if key.startswith("arrays/") or key == "predictions":
            assert a[key].keys() == b[key].keys(), key
            for name, arr in a[key].items():
                other = b[key][name]
                assert arr.dtype == other.dtype and arr.shape == other.shape, (key, name)
                assert arr.tobytes() == other.tobytes(), f"{key}/{name} differs"
        else:
            assert a[key] == b[key], key


# --------------------------------------------------------------------------- leak scanning

# a number not glued to a name ("float64", "c0_s1"): "np.float64(0.5)" gives 0.5 only
_NUMBER = re.compile(rb"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


class RowScanner:
    """Find rows of X (N, p) written anywhere, as ``p`` consecutive values to ``tol``.

    A KD-tree of the rows (Chebyshev metric) is queried with every window of ``p``
    consecutive values of a sequence: raw bytes read as float64 (8 byte offsets) and as
    float32 (4 offsets, tolerance 1e-6), numbers printed in text, every array of a Zarr
    store (decompressed; C and Fortran order), every ndarray reachable from an object.
    """

    def __init__(self, X: np.ndarray, tol: float = 1e-9) -> None:
        self.X = np.ascontiguousarray(X, dtype=np.float64)
        self.p = self.X.shape[1]
        self.tol = tol
        self.tree = cKDTree(self.X)
        self.row_sums = np.sort(np.r_[self.X.sum(axis=1), np.inf, -np.inf])
        self.bound = float(np.abs(self.X).max()) + 1.0  # windows with larger values cannot match

    # sequences -------------------------------------------------------------
    def in_sequence(self, seq: np.ndarray, tol: float | None = None) -> set[int]:
        """Rows found as ``p`` consecutive entries of ``seq`` (to ``tol``, Chebyshev).

        Windows are pre-filtered by their sum (a row's sum to ``p·tol``) and by the range of
        X; the survivors are checked exactly against a KD-tree of the rows.
        """
        tol = self.tol if tol is None else tol
        with np.errstate(invalid="ignore", over="ignore"):
            seq = np.asarray(seq, dtype=np.float64).ravel()
        p = self.p
        if seq.size < p:
            return set()
        bad = ~np.isfinite(seq) | (np.abs(seq) > self.bound)
        clean = np.where(bad, 0.0, seq)
        slack = p * tol * 1.01 + 1e-12
        hits: set[int] = set()
        n_windows = seq.size - p + 1
        for start in range(0, n_windows, 200_000):
            stop = min(start + 200_000, n_windows)
            W = np.lib.stride_tricks.sliding_window_view(clean[start : stop + p - 1], p)
            has_bad = np.lib.stride_tricks.sliding_window_view(bad[start : stop + p - 1], p).any(axis=1)
            sums = W.sum(axis=1)
            pos = np.clip(np.searchsorted(self.row_sums, sums), 1, len(self.row_sums) - 1)
            near = np.minimum(np.abs(self.row_sums[pos] - sums), np.abs(self.row_sums[pos - 1] - sums)) <= slack
            keep = np.flatnonzero(near & ~has_bad)
            if keep.size:
                dist, idx = self.tree.query(np.ascontiguousarray(W[keep]), k=1, p=np.inf, distance_upper_bound=tol)
                hits.update(int(i) for i in idx[np.isfinite(dist)])
        return hits

    def in_bytes(self, blob: bytes) -> set[int]:
        hits: set[int] = set()
        for offset in range(8):
            n = (len(blob) - offset) // 8
            if n >= self.p:
                hits |= self.in_sequence(np.frombuffer(blob, dtype="<f8", count=n, offset=offset))
        for offset in range(4):
            n = (len(blob) - offset) // 4
            if n >= self.p:
                hits |= self.in_sequence(np.frombuffer(blob, dtype="<f4", count=n, offset=offset), tol=1e-6)
        return hits

    def in_text(self, blob: bytes) -> set[int]:
        values = [float(m) for m in _NUMBER.findall(blob)]
        return self.in_sequence(np.array(values)) if len(values) >= self.p else set()

    def in_array(self, arr: np.ndarray) -> set[int]:
        if arr.dtype.kind not in "fiu" or arr.size < self.p:
            return set()
        hits = self.in_sequence(arr.ravel(order="C"))
        if arr.ndim > 1:
            hits |= self.in_sequence(arr.ravel(order="F"))
        return hits

    # containers ------------------------------------------------------------
    def in_file(self, path: Path) -> set[int]:
        blob = Path(path).read_bytes()
        return self.in_bytes(blob) | self.in_text(blob)

    def in_zarr_arrays(self, root: Path) -> dict[str, set[int]]:
        """Every Zarr array under ``root`` (also leftovers of interrupted writes)."""
        found = {}
        for meta in Path(root).rglob("zarr.json"):
            try:
                node = json.loads(meta.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if node.get("node_type") == "array":
                hits = self.in_array(zarr.open_array(meta.parent, mode="r")[...])
                if hits:
                    found[str(meta.parent)] = hits
        return found

    def in_tree(self, root: Path) -> dict[str, set[int]]:
        """Every file under ``root`` (raw bytes and printed numbers) and every Zarr array."""
        found = {}
        for path in Path(root).rglob("*"):
            if path.is_file():
                hits = self.in_file(path)
                if hits:
                    found[str(path)] = hits
        found.update(self.in_zarr_arrays(root))
        return found

    def in_object(self, obj) -> set[int]:
        """The pickle of ``obj`` (raw bytes) and every float array reachable from it."""
        hits = self.in_bytes(pickle.dumps(obj))
        for arr in reachable_arrays(obj):
            hits |= self.in_array(arr)
        return hits


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def baseline_run(tmp_path_factory) -> Path:
    """The synthetic pipeline run uninterrupted on a 2-worker LocalCluster (slow tests only)."""
    tmp = tmp_path_factory.mktemp("baseline")
    cfg = pipeline_yaml(tmp / "p.yaml", tmp / "run", n_workers=2)
    t0 = time.perf_counter()
    metrics = run_pipeline_file(cfg)
    metrics["wall_seconds"] = time.perf_counter() - t0
    (tmp / "metrics.json").write_text(json.dumps(metrics, default=str))
    return tmp / "run"


@pytest.fixture(scope="session")
def baseline_fingerprint(baseline_run) -> dict:
    return run_fingerprint(*run_stores(baseline_run))
