"""The float32 evaluation path (``eval_dtype``, docs/algorithm.md#evaluation-precision) in the Dask
pipeline: the estimator's distances, a pipeline file's ``model.eval_dtype``, manifests written
before the setting existed, and ``kahm-dask predict --eval-dtype`` (tests/core/test_eval_dtype.py
tests the setting in the core models).
"""

from __future__ import annotations

import contextlib

import dask.array as da
import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from kahm_dask import DaskKAHMClassifier, KAHMClassifier
from kahm_dask.cli import main
from kahm_dask.pipeline.config import PipelineConfig
from kahm_dask.pipeline.estimator import ESTIMATOR_PARAMS_KEY
from kahm_dask.pipeline.estimator.stores import params_from_manifest, stored_params
from kahm_dask.pipeline.predict import DISTANCES, class_distance_array
from kahm_dask.pipeline.stores.dataset import write_dataset
from tests._kit import assert_float32_of as _assert_float32_of
from tests._kit import pipeline_dict


@pytest.fixture(scope="module")
def classifiers(digits):
    """The fitted KAHMClassifier of depth L = 1 (default float64), by depth."""
    return {1: KAHMClassifier(n_layers=1, random_state=0).fit(digits.X_train, digits.y_train)}


@pytest.fixture(scope="module")
def stored(classifiers, tmp_path_factory):
    """The L = 1 classifier as a model store, and the estimator on it."""
    path = tmp_path_factory.mktemp("eval-dtype") / "model.zarr"
    return path, DaskKAHMClassifier.from_local(classifiers[1], path)


def test_dask_classifier_float32_predicts_as_kahm_classifier(client, classifiers, stored, digits):
    path, est = stored
    D64 = classifiers[1].class_distances(digits.X_test)
    est32 = DaskKAHMClassifier.load(path).set_params(eval_dtype="float32", chunk_rows=300)
    dask_D32 = est32.class_distances(digits.X_test)
    assert dask_D32.dtype == np.float64
    _assert_float32_of(dask_D32, D64)
    np.testing.assert_array_equal(est32.predict(digits.X_test), classifiers[1].classes_[D64.argmin(axis=1)])
    _assert_float32_of(est32.class_distances(da.from_array(digits.X_test, chunks=(150, -1))).compute(), D64)
    np.testing.assert_array_equal(est.class_distances(digits.X_test), D64)  # the default's distances: float64
    with pytest.raises(ValueError, match="'eval_dtype' parameter of class_distance_array"):
        class_distance_array(path, da.from_array(digits.X_test), eval_dtype="float16")


def test_pipeline_file_and_old_manifests(stored):
    cfg = PipelineConfig.from_dict(pipeline_dict(**{"model.eval_dtype": "float32"}), base_dir=".")
    assert cfg.model.eval_dtype == "float32"
    assert DaskKAHMClassifier.from_config(cfg).eval_dtype == "float32"
    path, est = stored
    stored = {k: v for k, v in stored_params(est.get_params(deep=False)).items() if k != "eval_dtype"}
    manifest = {ESTIMATOR_PARAMS_KEY: stored}  # a manifest written before eval_dtype existed
    assert DaskKAHMClassifier(**params_from_manifest(manifest)).eval_dtype == "auto"  # today's default


def test_cli_predict_eval_dtype(stored, classifiers, digits, tmp_path, monkeypatch):
    path, _ = stored
    store = write_dataset(tmp_path / "test.zarr", digits.X_test, digits.y_test, chunk_rows=200).path
    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext())
    out = tmp_path / "pred.zarr"
    result = CliRunner().invoke(main, ["predict", str(path), str(store), str(out), "--eval-dtype", "float32"])
    assert result.exit_code == 0, result.output
    D = zarr.open_group(str(out), mode="r")[DISTANCES][...]
    _assert_float32_of(D, classifiers[1].class_distances(digits.X_test))
    result = CliRunner().invoke(main, ["predict", str(path), str(store), str(out), "--eval-dtype", "float16"])
    assert result.exit_code == 2 and "'--eval-dtype'" in result.output, result.output
