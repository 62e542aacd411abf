"""The pipeline's per-cluster task (kahm_dask/pipeline/training/tasks.py) is the recipe of
kahm_dask/recipe.py: ``train_cluster`` on a cluster's grouped rows stores exactly the in-memory
classifier's branch model and DP rows, for every setting of tests/core/test_recipe.py."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from kahm_dask.pipeline.stores.model import cluster_dir, load_cluster
from kahm_dask.pipeline.training.tasks import GROUPED_X, GROUPED_X_NOISY, train_cluster
from kahm_dask.privacy.randomness import PrivacyLeakWarning
from tests._kit import RECIPE_SETTINGS as SETTINGS
from tests._kit import assert_same_deep as _assert_same_deep
from tests._kit import ignore_warnings, recipe_fits, recipe_params


@pytest.fixture(scope="module")
def fitted():
    """For every setting: the classifier fitted with a given partition and the noisy rows of
    the release it used (:func:`tests._kit.recipe_fits`)."""
    return recipe_fits()


@pytest.mark.parametrize("name", list(SETTINGS))
def test_pipeline_task_builds_the_same_cluster_as_the_classifier(fitted, name, tmp_path):
    """train_cluster on the grouped rows of (class 1, branch 1) stores exactly the classifier's
    branch model and DP rows."""
    X, y, part, noisy, out = fitted
    clf, params = out[name], recipe_params(SETTINGS[name])
    rows = y == 1
    branch = part[rows] == 1
    work, model = tmp_path / "work", tmp_path / "model.zarr"
    zarr.create_array(str(work / GROUPED_X), data=np.ascontiguousarray(X[rows][branch]))
    zarr.create_array(str(work / GROUPED_X_NOISY), data=np.ascontiguousarray(noisy[1][branch]))
    with ignore_warnings(PrivacyLeakWarning):
        info = train_cluster(str(work), str(model), 1, 1, 0, int(branch.sum()), params)
    assert info["n_rows"] == branch.sum() and not info["resumed"]
    _assert_same_deep(load_cluster(cluster_dir(model, 1, 1)), clf.models_[1].branches_[1])
    stored = zarr.open_group(str(cluster_dir(model, 1, 1)), mode="r")
    if params.private:
        assert stored["dp_rows"][:].tobytes() == clf.dp_data_[1][branch].tobytes()
    else:
        assert "dp_rows" not in stored
    assert ("passes" in info) == (params.r_source != "private" or not params.private)
