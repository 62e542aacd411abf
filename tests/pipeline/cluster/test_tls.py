"""Mutual TLS: a cluster that lets in only its own (kahm_dask.pipeline.cluster.security).

Real ``dask scheduler`` and ``dask worker`` processes on 127.0.0.1, once with mutual TLS
(certificates made here by a test CA) and once in plain TCP: the estimator fits and predicts
on them by address (the same model as KAHMClassifier), a DP fit and the ``kahm-dask`` commands
run over TLS, and clients without a certificate of the cluster's CA are refused at once. Also
a local cluster with TLS, and the validation of the ``tls`` settings (files, tls:// without
TLS, TLS with tcp://).
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
from click.testing import CliRunner
from distributed import Client
from distributed.security import Security
from sklearn.base import clone

from kahm_dask import DaskKAHMClassifier, KAHMClassifier
from kahm_dask.cli import main
from kahm_dask.datasets import load_bundled, split_and_scale
from kahm_dask.pipeline.cluster import (
    BLAS_ENV,
    ClusterConnectionError,
    LocalSpec,
    RemoteSpec,
    connect,
    connect_address,
    load_cluster_config,
)
from kahm_dask.pipeline.cluster.security import to_security
from kahm_dask.pipeline.config import ClusterConfig, ConfigError, load_config
from kahm_dask.pipeline.config.sections import ClusterTLSConfig, TLSConfig
from kahm_dask.pipeline.estimator import ESTIMATOR_PARAMS_KEY
from kahm_dask.pipeline.stores.dataset import write_dataset
from kahm_dask.pipeline.stores.manifest import read_manifest
from tests._kit import REPO as ROOT
from tests._kit import (
    Authority,
    free_port,
    ledger_of,
    make_authority,
    pipeline_file,
    service_unavailable,
    start_session,
    stop_sessions,
)

DASK = [sys.executable, "-m", "dask"]
SEED = 0
N_COMPONENTS = 20
START_TIMEOUT = 90  # seconds for a scheduler and its two workers to come up on a busy machine


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Authority:
    """The cluster's CA, a certificate for the scheduler and workers, one for the clients."""
    return make_authority(tmp_path_factory.mktemp("tls-ca"), "cluster", ("server", "client"))


@pytest.fixture(scope="module")
def foreign(tmp_path_factory) -> Authority:
    """Another CA, and a client certificate it signed (valid, but not the cluster's)."""
    return make_authority(tmp_path_factory.mktemp("tls-other-ca"), "other", ("client",))


def _client_security(authority: Authority, name: str = "client") -> Security:
    tls = authority.tls(name)
    return Security(tls_ca_file=tls["ca_file"], tls_client_cert=tls["cert"], tls_client_key=tls["key"],
                    require_encryption=True)


@pytest.fixture(scope="module")
def reference(digits) -> KAHMClassifier:
    """The in-memory model the estimator must reproduce."""
    return KAHMClassifier(n_components=N_COMPONENTS, random_state=SEED).fit(digits.X_train, digits.y_train)


# --------------------------------------------------------------------------- processes


def _logs(tmp: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(tmp.glob("*.log")))


def _wait_for_workers(address: str, security: Security | None, procs: list[subprocess.Popen], tmp: Path) -> None:
    """Until the scheduler reports 2 workers; skip the tests (fail them in CI) if the processes cannot start."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            service_unavailable(f"the dask scheduler or worker process exited at start:\n{_logs(tmp)}")
        try:
            with Client(address, security=security, timeout=5) as client:
                client.wait_for_workers(2, timeout=max(1.0, deadline - time.monotonic()))
                return
        except (OSError, TimeoutError):
            time.sleep(0.5)
    service_unavailable(f"no scheduler with 2 workers at {address} after {START_TIMEOUT} s:\n{_logs(tmp)}")


@contextmanager
def _process_cluster(tmp: Path, tls_args: list[str], security: Security | None) -> Iterator[str]:
    """``dask scheduler`` on a free port of 127.0.0.1 and ``dask worker`` with 2 single-threaded
    worker processes, with ``tls_args`` (mutual TLS) or without (plain TCP); its address."""
    protocol = "tls" if tls_args else "tcp"
    port = free_port()
    address = f"{protocol}://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []
    try:
        procs.append(start_session([*DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                                    "--protocol", protocol, "--no-dashboard", *tls_args],
                                   tmp / "scheduler.log", BLAS_ENV))
        procs.append(start_session([*DASK, "worker", address, "--nthreads", "1", "--nworkers", "2",
                                    "--memory-limit", "1GiB", "--no-dashboard", *tls_args],
                                   tmp / "worker.log", BLAS_ENV))
        _wait_for_workers(address, security, procs, tmp)
        yield address
    finally:
        stop_sessions(procs[::-1])


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory, certs) -> Iterator[str]:
    """A mutual-TLS scheduler and 2 workers (the server certificate); its tls:// address."""
    with _process_cluster(tmp_path_factory.mktemp("tls-cluster"), certs.cli("server"), _client_security(certs)) as a:
        yield a


@pytest.fixture(scope="module")
def tcp_cluster(tmp_path_factory) -> Iterator[str]:
    """A plain-TCP scheduler and 2 workers; its tcp:// address."""
    with _process_cluster(tmp_path_factory.mktemp("tcp-cluster"), [], None) as address:
        yield address


# --------------------------------------------------------------------------- the estimator by address


def _assert_same_model(est: DaskKAHMClassifier, clf: KAHMClassifier, X: np.ndarray) -> None:
    np.testing.assert_array_equal(est.predict(X), clf.predict(X))
    np.testing.assert_allclose(est.class_distances(X), clf.class_distances(X), rtol=1e-10, atol=1e-12)


def test_estimator_fits_over_mutual_tls_like_kahm_classifier(tls_cluster, certs, digits, reference, tmp_path):
    """The cluster is a client (xgboost.dask's and LightGBM's habit): one mutual-TLS connection,
    made by the user, used by fit and predict; nothing about it is stored or pickled."""
    with Client(tls_cluster, security=_client_security(certs), timeout=10) as client:
        est = DaskKAHMClassifier(n_components=N_COMPONENTS, random_state=SEED, store_dir=tmp_path)
        est.client = client
        est.fit(digits.X_train, digits.y_train)
        assert est.score(digits.X_test, digits.y_test) >= 0.99
        _assert_same_model(est, reference, digits.X_test)
        lazy = est.predict(da.from_array(digits.X_test, chunks=(300, -1), name=False))  # the caller computes it
        assert isinstance(lazy, da.Array)
        np.testing.assert_array_equal(lazy.compute(), reference.predict(digits.X_test))
        copy = pickle.loads(pickle.dumps(est))  # the client is not pickled: the copy uses the current one
        assert "_client" not in copy.__dict__ and copy.client is client
        np.testing.assert_array_equal(copy.predict(digits.X_test), reference.predict(digits.X_test))
    manifest = read_manifest(est.model_path_)  # where the fit ran, and the key's path, are not stored
    assert not {"client", "store_dir", "storage_options"} & set(manifest[ESTIMATOR_PARAMS_KEY])
    assert str(certs.pairs["client"].key) not in json.dumps(manifest)
    assert "client" not in clone(est).get_params()


@pytest.mark.slow  # about 14 s; the mutual-TLS fit (default suite) covers the same fit over a secured link
def test_estimator_fits_over_plain_tcp_like_kahm_classifier(tcp_cluster, digits, reference, tmp_path):
    with Client(tcp_cluster, timeout=10):  # the current client
        est = DaskKAHMClassifier(n_components=N_COMPONENTS, random_state=SEED, store_dir=tmp_path)
        est.fit(digits.X_train, digits.y_train)
        assert est.score(digits.X_test, digits.y_test) >= 0.99
        _assert_same_model(est, reference, digits.X_test)


def test_dp_fit_over_mutual_tls(tls_cluster, certs, digits, tmp_path):
    with Client(tls_cluster, security=_client_security(certs), timeout=10):
        est = DaskKAHMClassifier(n_components=N_COMPONENTS, random_state=SEED, epsilon=2.0, bounds=(0, 1),
                                 store_dir=tmp_path)
        est.fit(digits.X_train, digits.y_train)
        assert est.privacy_statement_.mechanism["epsilon"] == 2.0 and est.privacy_statement_.holds
        assert est.score(digits.X_test, digits.y_test) >= 0.8  # fresh secure noise: typically about 0.93
    assert ledger_of(digits.X_train).spent() == (2.0, 0.0)  # recorded in the rows' ledger


# --------------------------------------------------------------------------- the CLI over TLS


def test_cli_run_over_mutual_tls(tls_cluster, certs, tmp_path):
    out = tmp_path / "run"
    args = ["run", str(ROOT / "pipelines" / "quickstart.yaml"), "--scheduler", tls_cluster, "--output", str(out),
            "--no-progress"]
    refused = CliRunner().invoke(main, args)  # the address alone: TLS settings missing
    assert refused.exit_code == 1 and "missing 'cluster.tls'" in refused.output
    result = CliRunner().invoke(main, [*args, *certs.cli("client")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "owner" / "report.json").read_text())
    assert report["accuracy"] >= 0.8


def test_cli_train_over_mutual_tls(tls_cluster, certs, tmp_path):
    """The commands of ``_cluster_options`` (here ``train``) take the same --tls-* options."""
    split = split_and_scale(*load_bundled("iris"))
    store = write_dataset(tmp_path / "iris.zarr", split.X_train, split.y_train).path
    args = ["train", str(store), str(tmp_path / "model.zarr"), "--n-components", "2", "--scheduler", tls_cluster]
    partial = CliRunner().invoke(main, [*args, "--tls-cert", str(certs.pairs["client"].cert)])
    assert partial.exit_code == 2 and "TLS needs --tls-ca-file too" in partial.output
    result = CliRunner().invoke(main, [*args, *certs.cli("client")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert read_manifest(tmp_path / "model.zarr")["classes"] == [0, 1, 2]


# --------------------------------------------------------------------------- refused clients

_ATTEMPTS = r"""
import json, sys, time
from distributed import Client
from distributed.security import Security

tls_address, ca, other_ca, other_cert, other_key = sys.argv[1:]
tcp_address = tls_address.replace("tls://", "tcp://")
attempts = {
    "plain tcp to the TLS port": (tcp_address, None),
    "a certificate of another CA": (tls_address, Security(tls_ca_file=ca, tls_client_cert=other_cert,
                                                          tls_client_key=other_key, require_encryption=True)),
    "trusting another CA": (tls_address, Security(tls_ca_file=other_ca, tls_client_cert=other_cert,
                                                  tls_client_key=other_key, require_encryption=True)),
    "no certificate": (tls_address, None),  # last: this failure leaves the client machinery unusable
}
outcome = {}
for name, (address, security) in attempts.items():
    start = time.monotonic()
    try:
        Client(address, security=security, timeout=3).close()
        outcome[name] = ["connected", time.monotonic() - start]
    except Exception as exc:  # a refused connection is an OSError; tls:// without a context a TypeError
        refused = isinstance(exc, OSError) or "ssl_context" in str(exc)
        outcome[name] = [f"refused ({type(exc).__name__})" if refused else repr(exc), time.monotonic() - start]
print(json.dumps(outcome))
"""


def test_clients_without_a_certificate_of_the_cluster_are_refused(tls_cluster, certs, foreign):
    """An outsider (a fresh process): plain TCP, no certificate, or another CA's certificate."""
    other = foreign.pairs["client"]
    proc = subprocess.run([sys.executable, "-c", _ATTEMPTS, tls_cluster, str(certs.ca_file), str(foreign.ca_file),
                           str(other.cert), str(other.key)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(outcome) == 4
    for name, (result, seconds) in outcome.items():
        assert result.startswith("refused"), (name, result)
        assert seconds < 8, (name, seconds)


def test_connect_with_another_ca_fails_fast_naming_the_address(tls_cluster, certs, foreign):
    outsider = ClusterTLSConfig.from_mapping({**foreign.tls("client"), "ca_file": str(certs.ca_file)})
    start = time.monotonic()
    with pytest.raises(ClusterConnectionError, match=f"{tls_cluster}.*signed by the CA"):
        with connect(ClusterConfig(scheduler=tls_cluster, tls=outsider), timeout=3):
            pass
    assert time.monotonic() - start < 8
    with connect(ClusterConfig(scheduler=tls_cluster, tls=ClusterTLSConfig.from_mapping(certs.tls("client")))) as c:
        assert c.submit(sum, [1, 2]).result(timeout=30) == 3  # the cluster itself is unharmed
        assert len(c.scheduler_info()["workers"]) == 2


def test_remote_tls_cluster_config_file(tls_cluster, certs, tmp_path):
    path = tmp_path / "remote_tls.yaml"
    tls = certs.tls("client")
    path.write_text(f"kind: remote\naddress: {tls_cluster}\ntls:\n  ca_file: {tls['ca_file']}\n"
                    f"  cert: {tls['cert']}\n  key: {tls['key']}\n")
    assert load_cluster_config(path) == RemoteSpec(address=tls_cluster, tls=TLSConfig.from_mapping(tls))
    with connect(ClusterConfig(config=path)) as client:
        assert client.submit(pow, 2, 5).result(timeout=30) == 32


# --------------------------------------------------------------------------- a local cluster with TLS


@pytest.mark.parametrize("resources", [None, [{"site0": 1}]], ids=["LocalCluster", "with resources"])
def test_local_cluster_with_tls(certs, resources):
    """Scheduler, worker and client in this process, all presenting the server certificate."""
    tls = ClusterTLSConfig.from_mapping(certs.tls("server"))
    with connect(ClusterConfig(n_workers=1, processes=False, tls=tls), worker_resources=resources) as client:
        assert client.scheduler.address.startswith("tls://127.0.0.1:")
        assert all(w.startswith("tls://") for w in client.scheduler_info()["workers"])
        assert client.submit(sum, [4, 5]).result(timeout=30) == 9


def test_local_cluster_file_with_tls(certs, tmp_path):
    path = tmp_path / "local.yaml"
    tls = certs.tls("server")
    path.write_text(f"kind: local\nn_workers: 1\nprocesses: false\ntls: {json.dumps(tls)}\n")
    spec = load_cluster_config(path)
    assert spec == LocalSpec(n_workers=1, processes=False, tls=TLSConfig.from_mapping(tls))
    with connect(ClusterConfig(config=path)) as client:
        assert client.scheduler.address.startswith("tls://")


# --------------------------------------------------------------------------- validation


def test_security_of_the_tls_section(certs):
    tls = TLSConfig.from_mapping(certs.tls("client"))
    security = to_security(tls)
    assert security.require_encryption
    assert (security.tls_ca_file, security.tls_client_cert, security.tls_client_key) == (
        str(certs.ca_file), str(certs.pairs["client"].cert), str(certs.pairs["client"].key))
    assert security.tls_scheduler_cert is None  # a client: it presents only the client certificate


def test_a_certificate_file_holding_its_key_needs_no_key(certs, tmp_path):
    pair = certs.pairs["client"]
    combined = tmp_path / "client-with-key.pem"
    combined.write_bytes(pair.cert.read_bytes() + pair.key.read_bytes())
    tls = TLSConfig.from_mapping({"ca_file": str(certs.ca_file), "cert": str(combined)})
    assert tls.key is None and to_security(tls).tls_client_key is None
    with pytest.raises(ConfigError, match="'tls.cert'.*do not load.*'tls.key' unless 'tls.cert' holds the key"):
        TLSConfig.from_mapping({"ca_file": str(certs.ca_file), "cert": str(pair.cert)})


def test_tls_settings_validation(certs, foreign, tmp_path):
    good = certs.tls("client")
    cases = [
        ({**good, "cert": str(tmp_path / "nope.pem")},
         f"invalid value for 'cluster.tls.cert': no such file.*{tmp_path}"),
        ({**good, "key": str(foreign.pairs["client"].key)}, "'cluster.tls.key'.*do not load"),
        ({**good, "ca_file": str(certs.pairs["client"].key)}, "'cluster.tls.ca_file'.*not a PEM CA certificate"),
        ({**good, "certfile": "x"}, "unknown key 'cluster.tls.certfile'"),
        ({"cert": good["cert"]}, "missing required key 'cluster.tls.ca_file'"),
        ({**good, "require_encryption": "yes"}, "'cluster.tls.require_encryption'.*expected bool"),
    ]
    for tls, message in cases:
        with pytest.raises(ConfigError, match=message):
            ClusterConfig.from_mapping({"scheduler": "tls://127.0.0.1:8786", "tls": tls})


def test_address_and_tls_must_agree(certs, tmp_path):
    tls = certs.tls("client")
    with pytest.raises(ConfigError, match="missing 'cluster.tls' for the tls:// address 'cluster.scheduler'"):
        ClusterConfig(scheduler="tls://127.0.0.1:8786")
    with pytest.raises(ConfigError, match="'cluster.tls' is given but 'cluster.scheduler' is not a tls:// address.*"
                                          "neither encrypted nor authenticated"):
        ClusterConfig.from_mapping({"scheduler": "tcp://127.0.0.1:8786", "tls": tls})
    config = tmp_path / "local.yaml"
    config.write_text("kind: local\n")
    with pytest.raises(ConfigError, match="conflicting keys 'cluster.tls' and 'cluster.config'"):
        ClusterConfig.from_mapping({"config": str(config), "tls": tls})
    with pytest.raises(ConfigError, match="missing 'tls' for the tls:// address 'address'"):
        RemoteSpec(address="tls://127.0.0.1:8786")
    with pytest.raises(ConfigError, match="'tls' is given but 'address' is not a tls:// address"):
        RemoteSpec.from_mapping({"address": "tcp://127.0.0.1:8786", "tls": tls})


def test_pipeline_file_with_cluster_tls(certs, tmp_path):
    path = pipeline_file(tmp_path / "p.yaml", name="p", output="out",
                         **{"cluster.scheduler": "tls://127.0.0.1:8786", "cluster.tls": certs.tls("client")})
    cfg = load_config(path)
    assert cfg.cluster.tls == ClusterTLSConfig.from_mapping(certs.tls("client"))
    assert cfg.with_overrides() == cfg  # the section round-trips
    plain = cfg.with_overrides(**{"cluster.scheduler": "tcp://127.0.0.1:8786", "cluster.tls": None})
    assert plain.cluster.tls is None
    pipeline_file(path, name="p", output="out", **{"cluster.scheduler": "tls://h:1"})
    with pytest.raises(ConfigError, match=f"missing 'cluster.tls'.* in {path}"):
        load_config(path)


def test_connect_address_checks_the_security(certs):
    with pytest.raises(ConfigError, match="missing 'security' for the tls:// address 'scheduler'"):
        with connect_address("tls://127.0.0.1:8786"):
            pass
    with pytest.raises(ConfigError, match="'security' is given but 'scheduler' is not a tls:// address"):
        with connect_address("tcp://127.0.0.1:8786", security=_client_security(certs)):
            pass


def test_cli_tls_options_are_checked(certs, tmp_path):
    quickstart = str(ROOT / "pipelines" / "quickstart.yaml")
    config = tmp_path / "local.yaml"
    config.write_text("kind: local\n")
    result = CliRunner().invoke(main, ["run", quickstart, "--cluster-config", str(config), *certs.cli("client")])
    assert result.exit_code == 2 and "a --cluster-config file holds its own 'tls'" in result.output
    result = CliRunner().invoke(main, ["run", quickstart, "--tls-key", str(certs.pairs["client"].key)])
    assert result.exit_code == 2 and "TLS needs --tls-ca-file and --tls-cert too" in result.output
    result = CliRunner().invoke(main, ["run", quickstart, "--tls-cert", str(tmp_path / "nope.pem")])
    assert result.exit_code == 2 and "--tls-cert" in result.output and "does not exist" in result.output
