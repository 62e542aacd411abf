"""Nothing exposed by default: the dashboard listens on this machine only, and no task key is
derived from private content.

Findings replayed (each failed on the code before): the LocalCluster's dashboard listened on
0.0.0.0:8787 with no authentication (the federated cluster on every interface too);
``DaskKAHMClassifier`` wrapped NumPy input with ``da.from_array``, so task keys were
``array-<content hash of the private matrix>`` and the dashboard's ``/info/task/<key>.html``
answered 200 for a right guess of a private entry.
"""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import psutil
import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import SchedulerPlugin

from kahm_dask import DaskKAHMClassifier
from kahm_dask.pipeline.cluster import connect
from kahm_dask.pipeline.cluster.sites import site_cluster
from kahm_dask.pipeline.config import ClusterConfig
from kahm_dask.pipeline.stores.rows import rows_per_chunk
from kahm_dask.privacy.randomness import PrivacyLeakWarning


def _listening(port: int) -> set[str]:
    """The addresses this process listens on at ``port``."""
    return {c.laddr.ip for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def _port(link: str) -> int:
    return int(link.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


def test_the_local_clusters_dashboard_listens_on_loopback_only():
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        with connect(ClusterConfig(n_workers=1, dashboard_address="127.0.0.1:0")) as client:
            assert _listening(_port(client.dashboard_link)) == {"127.0.0.1"}
            assert _listening(_port(client.scheduler.address)) == {"127.0.0.1"}
    assert ClusterConfig().dashboard_address == "127.0.0.1:8787"


def test_the_federated_site_clusters_dashboard_listens_on_loopback_only():
    with site_cluster(1, 2) as cluster, Client(cluster) as client:
        assert _listening(_port(client.dashboard_link)) == {"127.0.0.1"}


def test_exposing_the_dashboard_warns():
    with pytest.warns(PrivacyLeakWarning, match="no authentication"):
        with connect(ClusterConfig(n_workers=1, processes=False, dashboard_address="0.0.0.0:0")) as client:
            assert _listening(_port(client.dashboard_link)) == {"0.0.0.0"}


class _Keys(SchedulerPlugin):
    """Records every task key the scheduler sees."""

    name = "record-keys"

    def __init__(self) -> None:
        self.keys: set[str] = set()

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        self.keys.add(str(key))


def test_no_task_key_is_derived_from_the_private_rows(tmp_path, digits):
    split = digits
    X = split.X_test
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.register_plugin(_Keys())
        clf = DaskKAHMClassifier(n_components=5, random_state=0, store_dir=tmp_path).fit(split.X_train, split.y_train)
        clf.predict(X)
        clf.predict(X)
        keys = client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.plugins["record-keys"].keys))
    # the name dask would give these queries (a hash of their content), as the old code did
    content_name = da.from_array(X, chunks=(rows_per_chunk(None, *X.shape, X.dtype), -1)).name
    content_hash = content_name.split("-", 1)[1]
    assert not [k for k in keys if content_hash in k]
    queries = {k.split("'")[1] if "'" in k else k for k in keys if "kahm-queries-" in k}
    assert len({q.split("kahm-queries-")[1][:32] for q in queries}) == 2  # a random name per call
    assert not [k for k in keys if k.startswith("('array-") or k.startswith("array-")]
    assert np.isfinite(clf.class_distances(X)).all()


class _ComputedKeys(_Keys):
    """Records the keys of the tasks that start running (not those released later)."""

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if finish == "processing":
            self.keys.add(str(key))


def test_no_task_key_of_the_in_memory_partition_is_derived_from_the_rows_or_their_labels(tmp_path):
    """The in-memory route's tasks take the private class labels (and rows) as arguments. A key
    hashed from them (``pure=True``) would be the same in every run on the same data, so a
    dashboard viewer could confirm a guess of a label by hashing it: two runs on the same rows
    must share no key of those tasks."""
    from kahm_dask.datasets import make_class_blobs
    from kahm_dask.pipeline.stores.dataset import write_dataset
    from kahm_dask.pipeline.training import TrainSettings, train_pipeline
    from kahm_dask.recipe import TrainParams

    X, y = make_class_blobs(300, 5, 3, random_state=0)
    store = write_dataset(tmp_path / "s.zarr", X, y, chunk_rows=100)
    settings = TrainSettings(TrainParams(3, 1), seed=0, block_size=50)
    runs = []
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        for run in ("a", "b"):
            client.register_plugin(_ComputedKeys(), name=f"keys-{run}")
            summary = train_pipeline(store, tmp_path / f"{run}.zarr", tmp_path / f"{run}.work", settings, client)
            assert summary["rows_held"] == "worker memory"
            name = f"keys-{run}"
            keys = client.run_on_scheduler(lambda dask_scheduler, n=name: sorted(dask_scheduler.plugins[n].keys))
            client.run_on_scheduler(lambda dask_scheduler, n=name: dask_scheduler.remove_plugin(name=n))
            runs.append({k for k in keys if "_split_by_class" in k or "cluster_class" in k})
    assert runs[0] and runs[1]
    assert not runs[0] & runs[1]
