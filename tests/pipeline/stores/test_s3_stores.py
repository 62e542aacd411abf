"""Stores at URLs: dataset, work and model stores on a real S3-compatible server.

The ``s3`` fixture starts moto's server mode as a subprocess on a free loopback port (as s3fs's own
tests do), creates a bucket and yields the ``storage_options`` that reach it; the tests are
skipped, with the reason, when it cannot start (failed in CI: ``$KAHM_DASK_REQUIRE_SERVICES``).
Checked: a dataset store written to S3 reads back as the local one; a fit from an ``s3://`` store
and a fit with ``store_dir`` on S3 (a DP fit: the noisy rows, the ledger and the model store on S3)
predict as the same fits on local stores; ``save``/``load`` to and from S3; the permuted copy
(staging files and output) on S3; ``file://`` URLs are local paths; a remote store without its
completion marker is not taken for a store; clear errors for an unknown protocol or a missing s3fs;
no credential in the manifest. All on one in-process LocalCluster (2 workers x 1 thread).
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
import uuid

import dask.array as da
import fsspec
import numpy as np
import pytest
from fsspec.registry import _registry as fsspec_registry

from kahm_dask import DaskKAHMClassifier
from kahm_dask.datasets import load_bundled, split_and_scale
from kahm_dask.pipeline.stores.dataset import open_dataset, write_dataset
from kahm_dask.pipeline.stores.manifest import MANIFEST_KEY, read_manifest
from kahm_dask.pipeline.stores.model import cluster_done
from kahm_dask.pipeline.training.permute import permuted_copy
from kahm_dask.storage.location import COMPLETE_FILE, as_location
from tests._kit import free_port, ledger_of, service_module, service_unavailable

BUCKET = "kahm-test"
SEED = 0
#: A small DP fit (iris: 3 classes, so few cluster models travel to and from the server).
DP = dict(n_components=4, epsilon=2.0, bounds=(0, 1), random_state=SEED, insecure_noise_seed=123, chunk_rows=50)


def _wait_until_up(proc: subprocess.Popen, endpoint: str, timeout: float = 30.0) -> str | None:
    """None once the server answers, else why it did not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"the moto server exited with code {proc.returncode}"
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
            return None
        except OSError:
            time.sleep(0.2)
    return f"the moto server did not answer at {endpoint} within {timeout:.0f} s"


@pytest.fixture(scope="module")
def s3():
    """storage_options of a bucket on a moto S3 server on loopback (skipped, or failed in CI, if it cannot start)."""
    service_module("s3fs", "s3fs is not installed (pip install 'kahm-dask[s3]')")
    service_module("moto.server", "moto's server mode is not installed (pip install 'moto[server]')")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as exc:
        service_unavailable(f"cannot start the moto server: {exc}")
    try:
        problem = _wait_until_up(proc, endpoint)
        if problem is not None:
            service_unavailable(problem)
        options = {"key": "testing", "secret": "testing",
                   "client_kwargs": {"endpoint_url": endpoint}}
        fsspec.filesystem("s3", **options).mkdir(BUCKET)
        yield options
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _url(name: str) -> str:
    """A fresh URL in the test bucket."""
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/{name}"


@pytest.fixture(scope="module")
def iris():
    return split_and_scale(*load_bundled("iris"))


@pytest.fixture(scope="module")
def remote_digits(s3, digits):
    """The digits training rows as a dataset store on S3."""
    url = _url("digits.zarr")
    write_dataset(url, digits.X_train, digits.y_train, chunk_rows=300, storage_options=s3)
    return url


def test_dataset_store_on_s3_reads_as_the_local_one(s3, digits, remote_digits, tmp_path):
    local = write_dataset(tmp_path / "digits.zarr", digits.X_train, digits.y_train, chunk_rows=300)
    remote = open_dataset(remote_digits, storage_options=s3)
    assert remote.path == remote_digits and "testing" not in repr(remote)
    assert (remote.n_samples, remote.n_features, remote.classes, remote.chunk_rows) == \
        (local.n_samples, local.n_features, local.classes, local.chunk_rows)
    np.testing.assert_array_equal(remote.X().compute(), local.X().compute())
    np.testing.assert_array_equal(remote.y(), local.y())
    np.testing.assert_array_equal(remote.class_rows(3), local.class_rows(3))
    np.testing.assert_array_equal(remote.read_rows([5, 1, 5]), local.read_rows([5, 1, 5]))


def test_fit_from_an_s3_store_predicts_as_from_the_local_one(client, s3, digits, remote_digits, tmp_path):
    local = write_dataset(tmp_path / "digits.zarr", digits.X_train, digits.y_train, chunk_rows=300)
    expected = DaskKAHMClassifier(random_state=SEED, store_dir=tmp_path / "a").fit(str(local.path))
    est = DaskKAHMClassifier(random_state=SEED, store_dir=tmp_path / "b", storage_options=s3).fit(remote_digits)
    np.testing.assert_array_equal(est.predict(digits.X_test), expected.predict(digits.X_test))
    assert float(est.score(remote_digits)) == expected.score(digits.X_train, digits.y_train)


def test_the_permuted_copy_through_s3_equals_the_source_reordered(s3):
    # the copies of rows larger than memory: staging files written with one PUT each and read
    # back with ranged GETs, the output a Zarr array on S3
    rng = np.random.default_rng(4)
    X = rng.standard_normal((230, 6)).astype(np.float32)
    order = rng.permutation(230)
    root = _url("work")
    target, staging = as_location(f"{root}/copy", s3), as_location(f"{root}/.copy.staging", s3)
    out = permuted_copy(da.from_array(X, chunks=(50, 6)), order, target, staging, 64)
    np.testing.assert_array_equal(out.compute(), X[order])
    assert not staging.exists()


@pytest.fixture(scope="module")
def remote_fit(client, s3, iris):
    """A DP fit with ``store_dir`` on S3 (training rows, work store and model store there; the
    ledger in the owner's local ledger directory, where file locks work)."""
    root = _url("run")
    est = DaskKAHMClassifier(**DP, store_dir=root, storage_options=s3)
    return root, est.fit(iris.X_train, iris.y_train), ledger_of(iris.X_train)


def test_store_dir_on_s3_fits_predicts_saves_and_loads(s3, iris, remote_fit, tmp_path):
    root, est, ledger = remote_fit
    assert est.model_path_ == f"{root}/model.zarr"
    fs = fsspec.filesystem("s3", **s3)
    for written in ("train.zarr", "work/X_noisy/_COMPLETE.json", "model.zarr"):
        assert fs.exists(f"{root}/{written}".removeprefix("s3://")), written
    assert ledger.spent() == (2.0, 0.0)  # the remote rows' own ledger
    expected = DaskKAHMClassifier(**DP, store_dir=tmp_path / "local").fit(iris.X_train, iris.y_train)
    predicted = est.predict(iris.X_test)
    np.testing.assert_array_equal(predicted, expected.predict(iris.X_test))
    np.testing.assert_array_equal(est.to_local().predict(iris.X_test), predicted)

    saved = est.save(_url("saved.zarr"))
    loaded = DaskKAHMClassifier.load(saved, storage_options=s3)
    assert loaded.model_path_ == saved and loaded.get_params()["epsilon"] == DP["epsilon"]
    np.testing.assert_array_equal(loaded.predict(iris.X_test), predicted)
    local_copy = loaded.save(tmp_path / "copy.zarr")
    np.testing.assert_array_equal(DaskKAHMClassifier.load(local_copy).predict(iris.X_test), predicted)


def test_no_credentials_in_the_stores(s3, remote_fit):
    root, est, _ = remote_fit
    fs = fsspec.filesystem("s3", **s3)
    manifest = fs.cat_file(f"{est.model_path_}/zarr.json".removeprefix("s3://")).decode()
    assert MANIFEST_KEY in manifest and "storage_options" not in manifest
    secrets = ("testing", s3["client_kwargs"]["endpoint_url"], "127.0.0.1")
    written = [fs.cat_file(p).decode() for p in fs.find(root.removeprefix("s3://")) if p.endswith(".json")]
    assert written and not any(secret in text for secret in secrets for text in written)


def test_cli_ingest_train_predict_on_s3(s3, iris, tmp_path, monkeypatch):
    """kahm-dask ingest / train / predict with URL arguments and --storage-options (threads)."""
    import contextlib
    import json

    from click.testing import CliRunner

    from kahm_dask.cli import main

    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))
    options = ["--storage-options", json.dumps(s3)]
    store, model = _url("iris.zarr"), _url("iris-model.zarr")
    run = CliRunner().invoke
    for args in (["ingest", "sklearn:iris", store], ["train", store, model, "--n-components", "3", "--seed", "1"],
                 ["predict", model, store, str(tmp_path / "pred.zarr")]):
        result = run(main, [*args, *options])
        assert result.exit_code == 0, result.output
    assert read_manifest(model, storage_options=s3)["n_features"] == 4
    fs = fsspec.filesystem("s3", **s3)
    work = fs.ls(store.removeprefix("s3://").replace("iris.zarr", "iris.kahm-work"))  # beside the data, not the model
    assert len(work) == 1 and work[0].rsplit("/", 1)[-1].startswith("iris-model.zarr-")
    assert (tmp_path / "pred.zarr").is_dir()
    result = run(main, ["predict", model, store, str(tmp_path / "p2.zarr"), "--storage-options", "[1]"])
    assert result.exit_code == 2 and "must be a JSON object" in result.output
    result = run(main, ["predict", model, "nosuch://x.zarr", str(tmp_path / "p3.zarr")])
    assert result.exit_code == 2 and "unknown storage protocol" in result.output


def test_the_repr_masks_the_credentials(s3):
    clf = DaskKAHMClassifier(n_components=3, store_dir="s3://bucket/x", storage_options=s3)
    text = repr(clf)
    assert "testing" not in text and "127.0.0.1" not in text and "'secret': '***'" in text
    assert "n_components=3" in text
    assert clf.storage_options == s3  # the estimator itself keeps them


def test_file_urls_are_local_paths(iris, remote_fit, tmp_path):
    url = f"file://{tmp_path}/iris.zarr"
    assert as_location(url).is_local and as_location(url).path == tmp_path / "iris.zarr"
    write_dataset(url, iris.X_test, iris.y_test)
    assert open_dataset(tmp_path / "iris.zarr").n_samples == len(iris.y_test)
    _, est, _ = remote_fit
    saved = est.save(f"file://{tmp_path}/model.zarr")
    assert saved == tmp_path / "model.zarr" and not (saved / COMPLETE_FILE).exists()
    loaded = DaskKAHMClassifier.load(f"file://{saved}")
    assert loaded.model_path_ == saved
    np.testing.assert_array_equal(loaded.predict(url), est.predict(iris.X_test))


def test_an_unfinished_remote_write_is_not_a_store(s3, iris, remote_fit):
    fs = fsspec.filesystem("s3", **s3)
    bad = iris.X_test.copy()
    bad[7, 3] = np.nan
    url = _url("bad.zarr")
    with pytest.raises(ValueError, match="NaN"):
        write_dataset(url, bad, iris.y_test, storage_options=s3)
    assert not fs.exists(url.removeprefix("s3://"))  # a failed write is deleted

    url = _url("killed.zarr")
    write_dataset(url, iris.X_test, iris.y_test, storage_options=s3)
    fs.rm(f"{url}/{COMPLETE_FILE}".removeprefix("s3://"))  # as if the writer died before its marker
    with pytest.raises(FileNotFoundError, match="did not finish"):
        open_dataset(url, storage_options=s3)

    _, est, _ = remote_fit
    saved = est.save(_url("model.zarr"))
    fs.rm(f"{saved}/{COMPLETE_FILE}".removeprefix("s3://"))
    with pytest.raises(FileNotFoundError, match="incomplete"):
        DaskKAHMClassifier.load(saved, storage_options=s3)
    with pytest.raises(FileExistsError, match="not a kahm-dask model store"):
        est.save(saved)
    cluster = read_manifest(est.model_path_, storage_options=s3)["clusters"][0]
    assert cluster_done(est.model_path_, cluster["class"], cluster["cluster"], s3) is not None
    fs.rm(f"{saved}/clusters/c0_s0/{COMPLETE_FILE}".removeprefix("s3://"))
    assert cluster_done(saved, 0, 0, s3) is None


def test_unknown_protocol_and_missing_s3fs_are_clear(monkeypatch, digits):
    with pytest.raises(ValueError, match="unknown storage protocol 'nosuch'"):
        as_location("nosuch://bucket/data.zarr")
    with pytest.raises(ValueError, match="unknown storage protocol"):
        DaskKAHMClassifier(store_dir="nosuch://bucket/run").fit(digits.X_test, digits.y_test)
    monkeypatch.delitem(fsspec_registry, "s3", raising=False)
    monkeypatch.setitem(sys.modules, "s3fs", None)  # import s3fs now fails
    with pytest.raises(ImportError, match=r"kahm-dask\[s3\]"):
        open_dataset("s3://bucket/data.zarr")


def test_cli_combine_model_stores_published_on_s3(s3, iris, tmp_path, monkeypatch):
    """Two sites publish their DP model stores to S3; ``kahm-dask combine`` reads them there and
    writes the global store there too; it predicts as the simulated federated rule over the
    sites' stores on S3, and holds no credential."""
    import contextlib
    import json

    import zarr
    from click.testing import CliRunner

    from kahm_dask.cli import main
    from kahm_dask.federated import split_sites
    from kahm_dask.pipeline.predict import PREDICTIONS
    from tests._kit import federated_rule

    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))
    options = ["--storage-options", json.dumps(s3)]
    run = CliRunner().invoke
    sites = []
    for q, rows in enumerate(split_sites(iris.y_train, 2, "iid", random_state=SEED)):
        store = write_dataset(tmp_path / f"site{q}.zarr", iris.X_train[rows], iris.y_train[rows])
        sites.append(_url(f"site{q}.zarr"))
        result = run(main, ["train", str(store.path), sites[-1], "--epsilon", "2", "--bounds", "0", "1",
                            "--n-components", "3", "--seed", "1", *options])
        assert result.exit_code == 0, result.output
    test_store = write_dataset(tmp_path / "test.zarr", iris.X_test, iris.y_test)
    glob = _url("global.zarr")
    result = run(main, ["combine", *sites, glob, *options])
    assert result.exit_code == 0, result.output
    result = run(main, ["predict", glob, str(test_store.path), str(tmp_path / "pred.zarr"), *options])
    assert result.exit_code == 0, result.output
    group = zarr.open_group(tmp_path / "pred.zarr", mode="r")
    predicted = np.asarray(group.attrs["classes"])[group[PREDICTIONS][:]]
    np.testing.assert_array_equal(predicted, federated_rule(sites, iris.X_test, s3).label)
    fs = fsspec.filesystem("s3", **s3)
    assert "No row left a site" in fs.cat_file(f"{glob}.PRIVACY.md".removeprefix("s3://")).decode()
    manifest = fs.cat_file(f"{glob}/zarr.json".removeprefix("s3://")).decode()
    assert "testing" not in manifest and s3["client_kwargs"]["endpoint_url"] not in manifest
    assert [s["model"] for s in read_manifest(glob, storage_options=s3)["federation"]["sites"]] == sites
