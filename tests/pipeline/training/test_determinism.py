"""Determinism of the pipeline: the same seed (and, for a DP run, the same noisy rows) gives
bit-identical models and predictions across runs and across 1 vs 2 workers (docs/reliability.md;
tests/core/test_determinism.py: the in-memory classifier).

Why it holds: the DP noise is drawn once per run from the operating system's secure generator
and stored (a resumed or repeated run on the same work store reuses it); every other random
draw (k-means) comes from one root ``SeedSequence`` spawned per class and attempt, never from
the worker or the task order; every task is a pure function of its inputs; BLAS runs one thread
per task (a multi-threaded BLAS may sum in another order); reductions (min over clusters,
argmin over classes) are exact. Two DP fits with the same seed and fresh noise must differ:
the seed is public. To compare two code paths on the same noise, the tests fix it with
``insecure_noise_seed`` (which voids the guarantee). The slow tests also compare runs that were
interrupted (test_worker_loss, test_interrupted_run) with the same baseline, started from the
baseline's stored noisy rows.
"""

from __future__ import annotations

import numpy as np
import pytest

from kahm_dask.datasets import make_class_blobs
from kahm_dask.pipeline.stores.dataset import write_dataset
from kahm_dask.pipeline.training import TrainSettings, train_pipeline
from kahm_dask.recipe import TrainParams
from tests._kit import (
    SYNTHETIC_RUN,
    assert_same_fingerprint,
    pipeline_file,
    run_fingerprint,
    run_pipeline_file,
    run_stores,
    start_from_noise_of,
)


@pytest.fixture(scope="module")
def blobs():
    X, y = make_class_blobs(400, 8, 3, random_state=4)
    return X[:300], y[:300], X[300:]


@pytest.mark.filterwarnings("ignore::kahm_dask.privacy.randomness.PrivacyLeakWarning")
def test_pipeline_same_seed_same_bits_with_threads(tmp_path, blobs):
    X, y, _ = blobs
    store = write_dataset(tmp_path / "s.zarr", X, y, chunk_rows=64)
    settings = TrainSettings(TrainParams(5, 3, epsilon=2.0), seed=5, block_size=100,  # S = 1
                             insecure_noise_seed=3)
    fps = []
    for run in ("a", "b"):
        train_pipeline(store, tmp_path / f"{run}.zarr", tmp_path / f"{run}.work", settings, progress=False)
        fps.append(run_fingerprint(tmp_path / f"{run}.zarr"))
    for fp in fps:  # the release id is random whatever the noise
        fp["manifest"]["kahm_dask_model"]["privacy"].pop("release_id")
    assert_same_fingerprint(*fps)


def test_pipeline_same_seed_same_noisy_rows_same_bits(tmp_path, blobs):
    """Secure noise: a second run on the same work store reuses the stored noisy rows and
    rebuilds the same model bit for bit."""
    X, y, _ = blobs
    store = write_dataset(tmp_path / "s.zarr", X, y, chunk_rows=64)
    settings = TrainSettings(TrainParams(5, 3, epsilon=2.0), seed=5, block_size=100, bounds=(X.min(), X.max()))
    train_pipeline(store, tmp_path / "a.zarr", tmp_path / "w", settings, progress=False)
    train_pipeline(store, tmp_path / "b.zarr", tmp_path / "w", settings, progress=False)
    assert_same_fingerprint(run_fingerprint(tmp_path / "a.zarr"), run_fingerprint(tmp_path / "b.zarr"))


@pytest.mark.slow
def test_pipeline_one_worker_equals_two_workers(tmp_path, baseline_run, baseline_fingerprint):
    start_from_noise_of(baseline_run, tmp_path / "run")
    cfg = pipeline_file(tmp_path / "p.yaml", **{**SYNTHETIC_RUN, "cluster.n_workers": 1}, output=tmp_path / "run")
    run_pipeline_file(cfg)
    one = run_fingerprint(*run_stores(tmp_path / "run"))
    assert_same_fingerprint(baseline_fingerprint, one)


@pytest.mark.slow
@pytest.mark.parametrize("route", ["dask-ml", "principal coordinates"])
def test_out_of_core_partition_is_the_same_on_threads_one_and_two_workers(route):
    """The out-of-core k-means partition (dask-ml with k-means||, or the randomized SVD behind
    the principal coordinates) is the only stage with reductions whose order could depend on
    the cluster; its labels must not (a resumed run recomputes it)."""
    from distributed import Client, LocalCluster

    from kahm_dask.pipeline.stores.synthetic import synthetic_blobs
    from kahm_dask.pipeline.training.partition import partition_classes

    p, extra = (8, {}) if route == "dask-ml" else (64, {"kmeans_dims": 10, "task_bytes": 3 * 600 * 8 * 10})
    X, y = synthetic_blobs(600, p, 1, seed=3, chunk_rows=150)  # one class, S = 2
    kw = dict(n_components=5, block_size=300, s_rule="round", min_cluster_size=None,
              seed=np.random.SeedSequence(17), init_max_iter=2, max_iter=10, **extra)
    bounds = [(0, 0, X.shape[0])]
    labels = [partition_classes(X, bounds, **kw)]
    for n_workers in (1, 2):
        with LocalCluster(n_workers=n_workers, threads_per_worker=1, dashboard_address=":0") as cluster, \
                Client(cluster):
            labels.append(partition_classes(X, bounds, **kw))
    assert labels[0].max() >= 1  # S = 2 clusters per class: k-means really ran
    for other in labels[1:]:
        np.testing.assert_array_equal(other, labels[0])
