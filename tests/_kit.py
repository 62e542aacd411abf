"""The test kit: every helper the test folders share (the shared fixtures are in tests/conftest.py).

* paths — :data:`REPO`, :data:`PIPELINES`, :data:`CLUSTER_CONFIGS`, :data:`README`;
* data — :func:`digits_split` (the bundled digits, 70/30, scaled by their public bounds 0–16:
  the ``digits`` fixture), :func:`three_blobs` (the oracle blobs of docs/algorithm.md);
* the per-cluster recipe — :data:`RECIPE_SETTINGS`, :func:`recipe_data`, :func:`recipe_classifier`,
  :func:`recipe_params`, :func:`recipe_fits` (shared by the core's and the pipeline task's tests);
* pipeline files — :func:`pipeline_dict` and :func:`pipeline_file` (a minimal valid pipeline plus
  dotted overrides), :data:`SYNTHETIC_RUN` (the synthetic DP run of the slow tests),
  :func:`run_pipeline_file`;
* privacy — :func:`ledger_of` (the ledger a test's releases went to), :func:`reachable_arrays`,
  :class:`RowScanner` (training rows written anywhere), :func:`forbid_warnings`;
* services — :data:`REQUIRE_SERVICES`, :func:`service_unavailable`, :func:`service_module`: a
  service a test needs (the moto S3 server, TLS certificates and processes) that cannot start
  skips the test, or fails it when ``KAHM_DASK_REQUIRE_SERVICES`` is set (CI sets it);
* processes — :func:`free_port`, :func:`start_session`, :func:`stop_sessions`,
  :func:`subprocess_cluster`, :func:`wait_for`, :func:`sigkill`;
* TLS — :func:`make_authority` (a test CA and the certificates it signs);
* stores and runs — :func:`leftovers`, :func:`small_training`, :func:`train_small`,
  :func:`interrupt_after_training`, :func:`run_stores`,
  :func:`staged_model`, :func:`start_from_noise_of`, :func:`complete_clusters`,
  :func:`n_planned_clusters`, :func:`zarr_arrays`, :func:`run_fingerprint`,
  :func:`assert_same_fingerprint`, :func:`federated_rule`, :func:`assert_same_deep`;
* float32 evaluation — :data:`FLOAT32_RTOL`, :func:`max_rel`, :func:`assert_float32_of`;
* bad input — :class:`Rejection` and :func:`assert_rejects` (a table row: a call, its exception
  and the patterns its message must match), :data:`BAD_INPUT_X`, :data:`BAD_INPUT_Y`,
  :data:`MIXED_LABELS`, :func:`with_entry`, :func:`write_small_stores`.

This module is imported by the core and privacy tests too, which must not load the pipeline,
Dask or Zarr (tests/system/test_layers.py): those are imported inside the helpers that use them.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import importlib
import ipaddress
import json
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pytest
import yaml
from scipy.spatial import cKDTree

from kahm_dask.datasets import PUBLIC_BOUNDS, Split, load_bundled, split_and_scale
from kahm_dask.privacy.ledger import PrivacyLedger

# --------------------------------------------------------------------------- paths

REPO = Path(__file__).resolve().parents[1]
PIPELINES = REPO / "pipelines"
CLUSTER_CONFIGS = REPO / "cluster_configs"
README = REPO / "README.md"

# --------------------------------------------------------------------------- data


def digits_split() -> Split:
    """The bundled digits, split 70/30 (stratified, split seed 0) and scaled to [0, 1] by their
    public bounds (pixel counts 0–16): no private statistic is used, ``split.bounds`` is public."""
    return split_and_scale(*load_bundled("digits"), bounds=PUBLIC_BOUNDS["digits"])


def three_blobs(seed: int, n_train: int = 200, n_test: int = 100, p: int = 5, sigma: float = 1.0):
    """Data of docs/oracles.md#oracle-blobs and docs/oracles.md#oracle-dp-end-to-end: three
    Gaussian blobs in ``p``-D, centres pairwise 10σ apart.

    Returns ``X_train (3·n_train, p), y_train, X_test (3·n_test, p), y_test, centres (3, p)``.
    """
    rng = np.random.default_rng(seed)
    # three points of a regular simplex with side 10σ, rotated at random
    Q, _ = np.linalg.qr(rng.normal(size=(p, p)))
    centres = (10 * sigma / np.sqrt(2)) * Q[:3]
    Xtr = np.vstack([c + sigma * rng.normal(size=(n_train, p)) for c in centres])
    Xte = np.vstack([c + sigma * rng.normal(size=(n_test, p)) for c in centres])
    return Xtr, np.repeat(np.arange(3), n_train), Xte, np.repeat(np.arange(3), n_test), centres


# --------------------------------------------------------------------------- the per-cluster recipe

#: The settings of the per-cluster recipe (kahm_dask/recipe.py) that the classifier and the
#: pipeline's task must build alike: non-private, DP rows as released, fabricated with a fixed
#: number of passes, fabricated with the private r.
RECIPE_SETTINGS = {
    "plain": {},
    "noisy": {"dp_data": "noisy"},
    "fabricated": {"dp_data": "fabricated", "r_value": 2},
    "fabricated-private-r": {"dp_data": "fabricated", "r_source": "private"},
}


def recipe_data(seed: int = 0, n: int = 120, p: int = 5):
    """Two classes in [0, 1]^p and a within-class partition into two parts of ≥ 2 rows."""
    rng = np.random.default_rng(seed)
    y = np.repeat([0, 1], n // 2)
    X = np.clip(0.5 + 0.15 * rng.normal(size=(n, p)) + 0.2 * y[:, None], 0.0, 1.0)
    part = np.tile(np.repeat([0, 1], n // 4), 2)
    return X, y, part


def recipe_classifier(kw: dict, dp_data: str | None = None):
    """The KAHMClassifier of a setting (DP ones with public bounds and the test-only noise seed 3)."""
    from kahm_dask import KAHMClassifier

    dp = {} if not kw and dp_data is None else {
        "epsilon": 2.0, "bounds": (0.0, 1.0), "insecure_noise_seed": 3, **kw,
        **({} if dp_data is None else {"dp_data": dp_data}),
    }
    return KAHMClassifier(3, 2, block_size=30, random_state=0, **dp)


def recipe_params(kw: dict):
    """The recipe's TrainParams of a setting."""
    from kahm_dask.recipe import TrainParams

    if not kw:
        return TrainParams(3, 2)
    return TrainParams(3, 2, epsilon=2.0, **kw)


def recipe_fits():
    """``X, y, part, noisy, fitted``: :func:`recipe_data`, the noisy rows of the release (a
    dp_data="noisy" twin with the same test-only noise seed, by class) and, for every setting of
    :data:`RECIPE_SETTINGS`, the classifier fitted with the partition ``part``."""
    from kahm_dask.privacy.randomness import PrivacyLeakWarning

    X, y, part = recipe_data()
    with ignore_warnings(PrivacyLeakWarning):  # the test-only noise seed and the private r warn
        noisy = recipe_classifier({}, "noisy").fit(X, y, partition=part).dp_data_
        out = {name: recipe_classifier(kw).fit(X, y, partition=part) for name, kw in RECIPE_SETTINGS.items()}
    return X, y, part, noisy, out


# --------------------------------------------------------------------------- pipeline files

#: The smallest valid pipeline file: the overrides of :func:`pipeline_dict` start from it.
MINIMAL_PIPELINE = {"name": "test", "output": "run", "data": {"source": "sklearn:iris"}}


def pipeline_dict(**overrides) -> dict:
    """:data:`MINIMAL_PIPELINE` with each dotted key of ``overrides`` set (sections created as
    needed; a section given as a whole replaces it; paths become strings), e.g.
    ``pipeline_dict(**{"privacy.epsilon": 2.0, "data.source": "sklearn:digits"})``."""
    config = copy.deepcopy(MINIMAL_PIPELINE)
    for dotted, value in overrides.items():
        *parents, last = dotted.split(".")
        node = config
        for name in parents:
            if not isinstance(node.get(name), dict):
                node[name] = {}
            node = node[name]
        node[last] = _plain(copy.deepcopy(value))
    return config


def _plain(value):
    """``value`` with paths as strings and tuples as lists (what YAML writes)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, os.PathLike) else value


def pipeline_file(where: str | os.PathLike[str], **overrides) -> Path:
    """Write :func:`pipeline_dict` ``(**overrides)`` as a pipeline YAML file; returns its path.

    ``where`` is a directory (the file is ``where/pipeline.yaml``) or the file's path (``.yaml``);
    ``output`` defaults to ``run`` beside the file: ``pipeline_file(tmp_path, **{"privacy.epsilon":
    2.0})`` runs into ``tmp_path/run``.
    """
    where = Path(where)
    path = where if where.suffix in (".yaml", ".yml") else where / "pipeline.yaml"
    config = pipeline_dict(**{"output": path.parent / "run", **overrides})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


#: The synthetic DP pipeline of the slow tests (:func:`pipeline_file` overrides). 7200 rows × 16
#: features, 10 classes → 5040 training rows, ≈ 504 per class → one cluster per class (block_size
#: 1000): 10 tasks of ≈ 500 rows, each 10 fixed smoothing passes and a 5-layer DeepKAHM (≈ 1 s per
#: task). (dask-ml k-means on a process cluster costs ≈ 30 s here; its determinism is tested apart.)
#: ``seed`` 11; ``"seed": None`` is the default of real runs (a k-means seed drawn once and kept in
#: ``<output>/owner/work``). The cluster: 2 worker processes of 1 GiB, unless overridden.
SYNTHETIC_RUN = {
    "name": "reliability",
    "seed": 11,
    "data.source": "synthetic:blobs",
    "data.synthetic": {"n_samples": 7200, "n_features": 16, "n_classes": 10},
    "data.chunk_rows": 1000,
    "data.bounds": [0, 1],
    "model": {"n_components": 20, "n_layers": 5, "block_size": 1000},
    "privacy": {"epsilon": 2.0, "r_source": "passes", "r_value": 10, "cluster_on": "noisy"},
    "evaluate.membership": False,
    "report.plots": False,
    "cluster": {"n_workers": 2, "processes": True, "memory_limit": "1GiB"},
}


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


# --------------------------------------------------------------------------- privacy


def ledger_of(rows) -> PrivacyLedger:
    """The privacy ledger a test's DP releases of ``rows`` went to, viewed on those rows: the
    ledger in the test's own ledger directory (``$KAHM_DASK_LEDGER_DIR``, set per test by
    tests/conftest.py). ``rows``: a dataset store (anything with ``row_digests(key)``) or a matrix."""
    return PrivacyLedger.for_data(rows if hasattr(rows, "row_digests") else np.asarray(rows))


def reachable_arrays(obj, seen: set[int] | None = None) -> Iterator[np.ndarray]:
    """Every non-object ndarray reachable from ``obj`` through ``__dict__``, lists, tuples, sets
    and dicts (keys and values), each once; object arrays are searched item by item (is a
    training row in a fitted model or anything reachable from it?)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            for item in obj.ravel():
                yield from reachable_arrays(item, seen)
        else:
            yield obj
        return
    if isinstance(obj, dict):
        items = list(obj.keys()) + list(obj.values())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = list(obj)
    elif hasattr(obj, "__dict__"):
        items = list(vars(obj).values())
    else:
        return
    for item in items:
        yield from reachable_arrays(item, seen)


@contextlib.contextmanager
def forbid_warnings(*categories: type[Warning]) -> Iterator[None]:
    """Turn warnings of ``categories`` into errors inside the block (a case that must not warn)."""
    with warnings.catch_warnings():
        for category in categories:
            warnings.simplefilter("error", category)
        yield


@contextlib.contextmanager
def ignore_warnings(*categories: type[Warning]) -> Iterator[None]:
    """Ignore warnings of ``categories`` inside the block (warnings a test expects and does not
    check, e.g. the test-only noise seed's PrivacyLeakWarning)."""
    with warnings.catch_warnings():
        for category in categories:
            warnings.simplefilter("ignore", category)
        yield


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
        import zarr

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


# --------------------------------------------------------------------------- services

#: Set (to anything but "" or "0") where every service must start: CI (.ci/run), where the test
#: extras are installed. A missing service then fails the test instead of skipping it.
REQUIRE_SERVICES = "KAHM_DASK_REQUIRE_SERVICES"


def services_required() -> bool:
    return os.environ.get(REQUIRE_SERVICES, "") not in ("", "0")


def service_unavailable(reason: str) -> NoReturn:
    """A service the test needs cannot start: skip with ``reason``, or fail where services are
    required (``$KAHM_DASK_REQUIRE_SERVICES``, set in CI)."""
    if services_required():
        pytest.fail(f"{reason} (required: {REQUIRE_SERVICES} is set)", pytrace=False)
    pytest.skip(reason)


def service_module(name: str, reason: str):
    """``import name`` for a service, or :func:`service_unavailable` with ``reason``."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        service_unavailable(f"{reason} ({exc})")


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server the test starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_session(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``args`` in a process of its own session (so that its children stop with it), output to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})


def stop_sessions(procs: list[subprocess.Popen], timeout: float = 20) -> None:
    """Terminate the sessions of processes started by :func:`start_session`, then kill what is left
    of each (its own session only)."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _stop(procs: list[subprocess.Popen]) -> None:
    """Terminate the processes this test started (by their own pid), then kill stragglers."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def sigkill(proc: subprocess.Popen) -> None:
    """SIGKILL one process this test started, by its pid."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def wait_for(condition: Callable[[], bool], timeout: float, message: str, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s: {message}")
        time.sleep(interval)


@dataclass
class SubprocessCluster:
    address: str
    scheduler: subprocess.Popen
    workers: list[subprocess.Popen]


@contextlib.contextmanager
def subprocess_cluster(
    tmp: Path, n_workers: int = 2, memory_limit: str = "1GiB", *, nanny: bool = False
) -> Iterator[SubprocessCluster]:
    """Real ``dask scheduler`` and ``n_workers`` single-threaded ``dask worker`` processes on
    127.0.0.1, logging to ``tmp/cluster.log``. Without a nanny (the default) a SIGKILLed worker
    stays dead; with ``nanny=True`` the workers run as ``dask worker`` starts them by default."""
    from distributed import Client

    from kahm_dask.pipeline.cluster import BLAS_ENV

    tmp.mkdir(parents=True, exist_ok=True)
    sched_file = tmp / "scheduler.json"
    env = {**os.environ, **BLAS_ENV}
    log = open(tmp / "cluster.log", "ab")
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
         "--no-dashboard", "--scheduler-file", str(sched_file)],
        env=env, stdout=log, stderr=log,
    )
    workers: list[subprocess.Popen] = []
    try:
        wait_for(sched_file.exists, 60, "the scheduler did not start")
        for _ in range(n_workers):
            workers.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(sched_file),
                 "--nthreads", "1", "--nanny" if nanny else "--no-nanny", "--no-dashboard",
                 "--memory-limit", memory_limit],
                env=env, stdout=log, stderr=log,
            ))
        address = json.loads(sched_file.read_text())["address"]
        with Client(address, timeout=30) as client:
            client.wait_for_workers(n_workers, timeout=60)
        yield SubprocessCluster(address, scheduler, workers)
    finally:
        _stop(workers[::-1] + [scheduler])
        log.close()


# --------------------------------------------------------------------------- TLS


@dataclass(frozen=True)
class CertPair:
    """A certificate and its private key (PEM files)."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Authority:
    """A CA certificate file and the certificates it signed, by name."""

    ca_file: Path
    pairs: dict[str, CertPair]

    def tls(self, name: str) -> dict[str, str]:
        """The ``tls`` settings of the pair ``name`` (the keys of kahm-dask's ``tls`` section)."""
        return {"ca_file": str(self.ca_file), "cert": str(self.pairs[name].cert), "key": str(self.pairs[name].key)}

    def cli(self, name: str) -> list[str]:
        """The ``--tls-*`` options of ``dask scheduler``/``dask worker`` and of kahm-dask."""
        pair = self.pairs[name]
        return ["--tls-ca-file", str(self.ca_file), "--tls-cert", str(pair.cert), "--tls-key", str(pair.key)]


def make_authority(directory: Path, name: str, leaves: tuple[str, ...] = ("server", "client")) -> Authority:
    """A CA ``name`` in ``directory`` (``ca.pem``) and one certificate and key per leaf name
    (``<leaf>.pem``, ``<leaf>-key.pem``) for 127.0.0.1 and localhost, valid for a day, usable by
    servers and clients (Dask's scheduler, workers and clients all are both). Made with
    ``cryptography`` (a test extra: a service of :func:`service_module`)."""
    service_module("cryptography", "the TLS tests make their certificates with cryptography (pip install '.[test]')")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def x509_name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    def builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.UTC)
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1)))

    def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        path.chmod(0o600)

    def write_cert(cert: x509.Certificate, path: Path) -> None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509_name(f"kahm-dask test CA {name}")
    ca = (builder(ca_name, ca_name, ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    write_cert(ca, directory / "ca.pem")
    loopback = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
    alt_names = x509.SubjectAlternativeName([x509.DNSName("localhost"), loopback])
    usages = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    pairs = {}
    for leaf in leaves:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (builder(x509_name("127.0.0.1"), ca_name, key.public_key())
                .add_extension(alt_names, critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(usages, critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
                .sign(ca_key, hashes.SHA256()))
        pair = CertPair(directory / f"{leaf}.pem", directory / f"{leaf}-key.pem")
        write_cert(cert, pair.cert)
        write_key(key, pair.key)
        pairs[leaf] = pair
    return Authority(directory / "ca.pem", pairs)


# --------------------------------------------------------------------------- stores and runs


def leftovers(directory: Path) -> list[str]:
    """Temporary or moved-aside files and directories in ``directory`` (sorted names)."""
    return sorted(p.name for p in Path(directory).iterdir() if ".tmp" in p.name or ".old-" in p.name)


def interrupt_after_training(model: Path, work: Path, *lost: tuple[int, int]) -> Path:
    """Move the finished model store ``model`` back to where a run interrupted before its commit
    leaves it: staged in ``work``, without its completion marker and without the clusters
    ``lost``. Returns the staged store."""
    from kahm_dask.pipeline.stores.model import cluster_dir
    from kahm_dask.pipeline.training import STAGED_MODEL

    staged = Path(work) / STAGED_MODEL
    Path(model).rename(staged)
    (staged / "_COMPLETE.json").unlink()
    for c, s in lost:
        shutil.rmtree(cluster_dir(staged, c, s))
    return staged


def small_training(directory: Path):
    """``(store, labels, X)``: 240 rows of 3 blob classes (6 features) as ``directory/s.zarr``
    and a given partition into two clusters per class (no k-means: fast)."""
    from kahm_dask.datasets import make_class_blobs
    from kahm_dask.pipeline.stores.dataset import write_dataset

    X, y = make_class_blobs(240, 6, 3, random_state=1)
    store = write_dataset(Path(directory) / "s.zarr", X, y, chunk_rows=50)
    labels = np.zeros(len(y), dtype=np.int64)
    for c in range(3):
        rows = np.flatnonzero(y == c)
        labels[rows[len(rows) // 2 :]] = 1
    return store, labels, X


def train_small(store, labels, directory: Path, **params) -> dict:
    """Train :func:`small_training`'s store with its partition into ``directory/m.zarr`` (work
    store ``directory/w``): n = 4, L = 2, ε = 2 with 3 smoother passes, seed 4, unless ``params``."""
    from kahm_dask.pipeline.training import TrainSettings, train_pipeline
    from kahm_dask.recipe import TrainParams

    settings = TrainSettings(TrainParams(**{"n_components": 4, "n_layers": 2, "epsilon": 2.0,
                                            "r_source": "passes", "r_value": 3, **params}), seed=4)
    return train_pipeline(store, Path(directory) / "m.zarr", Path(directory) / "w", settings, partition=labels,
                          progress=False)


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
    secure (never drawn twice). The releases the copied stores remember are adopted into the
    test's own ledger (``kahm-dask ledger adopt``: it continues them, as the owner's one ledger
    would). Nothing else of ``src_run`` is copied."""
    from kahm_dask.pipeline.stores.dataset import open_dataset

    src, dst = Path(src_run) / "owner", Path(dst_run) / "owner"
    dst.mkdir(parents=True)
    shutil.copytree(src / "data", dst / "data")
    shutil.copytree(src / "work" / "X_noisy", dst / "work" / "X_noisy")
    for store in sorted((dst / "data").glob("*.zarr")):
        data = open_dataset(store)
        PrivacyLedger.for_data(data).adopt_remembered(data.releases)


def complete_clusters(model_path: Path) -> int:
    """Number of clusters with a completion marker in a model store (temporary directories of
    writers not counted)."""
    clusters = Path(model_path) / "clusters"
    if not clusters.is_dir():
        return 0
    # a writer's hidden temporary directory holds its marker before it is renamed into place
    return sum(1 for d in clusters.iterdir() if not d.name.startswith(".") and (d / "_COMPLETE.json").is_file())


def n_planned_clusters(model_path: Path) -> int | None:
    """Number of clusters the manifest lists (None before the manifest is written)."""
    try:
        from kahm_dask.pipeline.stores.manifest import read_manifest

        return len(read_manifest(model_path)["clusters"])
    except (FileNotFoundError, ValueError, KeyError, json.JSONDecodeError):
        return None


def zarr_arrays(root: Path) -> dict[str, np.ndarray]:
    """Every Zarr array under ``root``, by its path relative to ``root``."""
    import zarr

    out = {}
    for meta in sorted(Path(root).rglob("zarr.json")):
        node = json.loads(meta.read_text())
        if node.get("node_type") == "array":
            out[str(meta.parent.relative_to(root))] = zarr.open_array(meta.parent, mode="r")[...]
    return out


def zarr_attrs(root: Path) -> dict[str, dict]:
    """The attributes of every Zarr node under ``root``, by its path relative to ``root``."""
    out = {}
    for meta in sorted(Path(root).rglob("zarr.json")):
        out[str(meta.parent.relative_to(root))] = json.loads(meta.read_text()).get("attributes", {})
    return out


def run_fingerprint(model_path: Path, pred_path: Path | None = None) -> dict:
    """Arrays and attributes of the complete clusters (+ predictions), for bitwise comparison."""
    model_path = Path(model_path)
    clusters = sorted(d for d in (model_path / "clusters").iterdir() if (d / "_COMPLETE.json").is_file())
    fp = {"manifest": zarr_attrs(model_path)["."], "clusters": [d.name for d in clusters]}
    for d in clusters:
        fp[f"arrays/{d.name}"] = zarr_arrays(d)
        fp[f"attrs/{d.name}"] = zarr_attrs(d)
    if pred_path is not None:
        fp["predictions"] = zarr_arrays(Path(pred_path))
        fp["prediction_attrs"] = zarr_attrs(Path(pred_path))
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


def federated_rule(models: list, X: np.ndarray, storage_options: dict | None = None):
    """The simulated federation's decision for the rows X (m, p) from the sites' model stores
    ``models`` (paths or URLs): each site's class distances
    (:func:`kahm_dask.pipeline.predict.class_distance_array`, on the default scheduler), its
    answer (ρ_q, ĉ_q) and their minimum-distance :func:`kahm_dask.federated.combine`."""
    import dask.array as da

    from kahm_dask.federated import combine, site_answer
    from kahm_dask.pipeline.predict import class_distance_array
    from kahm_dask.pipeline.stores.manifest import read_manifest

    rows = da.from_array(np.asarray(X, dtype=np.float64), chunks=(200, -1))
    answers = [site_answer(class_distance_array(m, rows, storage_options=storage_options).compute(),
                           read_manifest(m, storage_options=storage_options)["classes"]) for m in models]
    return combine(answers)


def assert_same_deep(a, b) -> None:
    """Two fitted DeepKAHMs have bit-identical state (every stored array and scalar) and parameters."""
    (states_a, meta_a), (states_b, meta_b) = a.to_state(), b.to_state()
    assert meta_a == meta_b and len(states_a) == len(states_b)
    for (arr_a, sc_a), (arr_b, sc_b) in zip(states_a, states_b, strict=True):
        assert sc_a == sc_b
        assert arr_a.keys() == arr_b.keys()
        assert all(arr_a[k].tobytes() == arr_b[k].tobytes() for k in arr_a)


# --------------------------------------------------------------------------- float32 evaluation

#: Tolerance of float32 evaluation (``eval_dtype``) against float64: relative, per distance and per
#: image row norm (docs/algorithm.md#evaluation-precision); the measured maxima are ~4e-6 on digits
#: and ~4e-7 on a high-dimensional random case.
FLOAT32_RTOL = 1e-4


def max_rel(a: np.ndarray, b: np.ndarray) -> float:
    """Largest |a − b| / |b| over the entries where b is finite (both infinite alike)."""
    finite = np.isfinite(b)
    np.testing.assert_array_equal(np.isfinite(a), finite)
    return float(np.max(np.abs(a[finite] - b[finite]) / np.abs(b[finite])))


def assert_float32_of(D32: np.ndarray, D64: np.ndarray) -> None:
    """D32 are float32 evaluations of the float64 distances D64: within :data:`FLOAT32_RTOL` of
    them, and not bit-identical (the float32 path ran).

    Two float32 evaluations that block the rows differently (the pipeline's chunks, the
    estimator's blocks) round differently: each is within the tolerance of float64, so they are
    compared with float64, never with each other at a tolerance one machine happened to meet.
    """
    assert not np.array_equal(D32, D64) and max_rel(D32, D64) <= FLOAT32_RTOL


# --------------------------------------------------------------------------- bad input


#: The rows of the bad-input tables: 40 rows × 5 features in [0, 1), labels two classes of 20
#: (their messages name row 3, column 2, the 40 rows and the 5 features).
BAD_INPUT_X = np.random.default_rng(0).random((40, 5))
BAD_INPUT_Y = np.repeat([0, 1], 20)
#: Labels that mix ints and strings (np.asarray would silently make them all strings).
MIXED_LABELS = [0] * 20 + ["a"] * 20


def with_entry(value, row: int = 3, col: int = 2) -> np.ndarray:
    """:data:`BAD_INPUT_X` with the entry ``[row, col]`` set to ``value`` (a copy)."""
    out = BAD_INPUT_X.copy()
    out[row, col] = value
    return out


def write_small_stores(directory: Path) -> Path:
    """Dataset stores of :data:`BAD_INPUT_X` in ``directory``: ``s.zarr`` (all of it), ``s4.zarr``
    (4 features) and ``s1.zarr`` (21 rows: class 1 has one row). Returns ``directory``."""
    from kahm_dask.pipeline.stores.dataset import write_dataset

    X, Y = BAD_INPUT_X, BAD_INPUT_Y
    write_dataset(directory / "s.zarr", X, Y, chunk_rows=20)
    write_dataset(directory / "s4.zarr", X[:, :4], Y, chunk_rows=20)
    write_dataset(directory / "s1.zarr", X[:21], Y[:21], chunk_rows=20)
    return directory


@dataclass(frozen=True)
class Rejection:
    """``call(ctx)`` must raise ``exc`` with a message matching ``problem`` (and ``fix``)."""

    call: Callable
    exc: type[BaseException] | tuple[type[BaseException], ...]
    problem: str
    fix: str | None = None


def assert_rejects(case: Rejection, ctx: Any) -> None:
    """Run a :class:`Rejection`: the exception, a message naming the problem and the fix."""
    with pytest.raises(case.exc) as info:
        case.call(ctx)
    message = str(info.value)
    assert re.search(case.problem, message, re.I), f"problem not named in: {message}"
    if case.fix is not None:
        assert re.search(case.fix, message, re.I), f"fix not named in: {message}"
