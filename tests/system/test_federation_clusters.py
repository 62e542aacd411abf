"""A federation across separately run clusters, for real (docs/usage.md#run-it-on-your-cluster).

Two sites, each with its own ``dask scheduler`` and worker (subprocesses) and its own privacy
ledger directory, train a DP model of their half of the digits with ``kahm-dask train
--scheduler``; ``kahm-dask combine`` writes the global store, a third cluster (a LocalCluster)
predicts it and ``evaluate`` gives its accuracy, which must equal the simulated federated rule
over the same site models (:func:`tests._kit.federated_rule`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kahm_dask.federated import split_sites
from kahm_dask.pipeline.stores.dataset import open_dataset, write_dataset
from kahm_dask.privacy.ledger import LEDGER_DIR_ENV
from tests._kit import federated_rule, subprocess_cluster

pytestmark = pytest.mark.slow

TRAIN = ["--epsilon", "2", "--n-components", "5", "--n-layers", "2", "--seed", "1"]


def _cli(*args, env: dict | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "kahm_dask.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})}, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def test_two_clusters_train_combine_and_a_third_predicts(tmp_path: Path):
    _cli("ingest", "sklearn:digits", tmp_path / "train.zarr", "--test-store", tmp_path / "test.zarr",
         "--bounds", "0", "16", "--scale", "minmax")
    pooled = open_dataset(tmp_path / "train.zarr")
    X, y, attrs = pooled.X().compute(), pooled.y(), pooled.attrs
    models = []
    for q, rows in enumerate(split_sites(y, 2, "iid", random_state=0)):
        site = tmp_path / f"site{q}"
        store = write_dataset(site / "data.zarr", X[rows], y[rows], scaling=attrs["scaling"],
                              feature_range=(attrs["feature_range"]["min"], attrs["feature_range"]["max"]))
        models.append(tmp_path / "published" / f"site{q}.zarr")
        with subprocess_cluster(site / "cluster", n_workers=1) as cluster:
            out = json.loads(_cli("train", store.path, models[-1], "--scheduler", cluster.address, *TRAIN,
                                  env={LEDGER_DIR_ENV: str(site / "ledgers")}))
        assert out["ledger"]["releases"] == 1 and Path(out["ledger_path"]).parent == site / "ledgers"
    glob = tmp_path / "published" / "global.zarr"
    _cli("combine", *models, glob)
    _cli("predict", glob, tmp_path / "test.zarr", tmp_path / "pred.zarr", "--n-workers", "1")
    metrics = json.loads(_cli("evaluate", glob, tmp_path / "pred.zarr", tmp_path / "train.zarr",
                              tmp_path / "test.zarr", "--no-membership", "--n-workers", "1"))
    test = open_dataset(tmp_path / "test.zarr")
    rule = federated_rule(models, test.X().compute())
    assert metrics["accuracy"] == pytest.approx(np.mean(rule.label == test.y()), abs=1e-12), metrics
