"""The model store's manifest: model stores of format 1 (written before the parameters were kept
in one ``parameters`` entry) still load, with the parameters they were trained with, and give
the same predictions; a format this version does not know is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from kahm_dask import DaskKAHMClassifier
from kahm_dask.pipeline.estimator.stores import ESTIMATOR_PARAMS_KEY
from kahm_dask.pipeline.stores.manifest import MANIFEST_KEY, read_manifest

NOISE_SEED = 7


def _rewrite(path, change) -> None:
    group = zarr.open_group(str(path), mode="a", zarr_format=3)
    manifest = dict(group.attrs[MANIFEST_KEY])
    group.attrs[MANIFEST_KEY] = change(manifest)


def _as_format_1(manifest: dict) -> dict:
    """The manifest as kahm-dask wrote it in format 1 from ``kahm-dask train`` (no estimator
    keys): the recipe under ``params``, ``block_size`` and ``cluster_on`` beside it."""
    p = manifest.pop("parameters")
    manifest.pop(ESTIMATOR_PARAMS_KEY, None)
    recipe = {k: p[k] for k in ("n_components", "n_layers", "epsilon", "dp_data", "r_source", "r_value",
                                "max_passes")}
    return {**manifest, "format_version": 1, "params": {**recipe, "min_range": 1e-3},
            "block_size": p["block_size"], "cluster_on": p["cluster_on"]}


@pytest.fixture(scope="module")
def dp_model(client, digits, tmp_path_factory):
    est = DaskKAHMClassifier(epsilon=2.0, delta=1e-5, bounds=(0.0, 16.0), n_components=10, block_size=500,
                             cluster_on="noisy", random_state=3, insecure_noise_seed=NOISE_SEED, ledger=None)
    with pytest.warns(Warning):
        est.fit(digits.X_train, digits.y_train)
    return est.save(tmp_path_factory.mktemp("manifest") / "dp.zarr"), est


def test_a_format_1_store_loads_with_its_parameters_and_predictions(dp_model, digits):
    path, est = dp_model
    expected = est.predict(digits.X_test)
    _rewrite(path, _as_format_1)
    manifest = read_manifest(path)
    assert manifest["format_version"] == 2
    loaded = DaskKAHMClassifier.load(path)
    for name in ("epsilon", "delta", "n_components", "block_size", "cluster_on", "dp_data", "r_source"):
        assert getattr(loaded, name) == getattr(est, name), name
    assert loaded.random_state == 3 and loaded.bounds == (0.0, 16.0)
    np.testing.assert_array_equal(loaded.predict(digits.X_test), expected)


def test_an_unknown_format_is_refused_by_name(dp_model):
    path, _ = dp_model
    _rewrite(path, lambda m: {**m, "format_version": 99})
    with pytest.raises(ValueError, match=r"model store of format 99.*reads formats 1 and 2"):
        read_manifest(path)
