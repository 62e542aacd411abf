"""Public bounds in the ingest stage: raw rows clipped to ``data.bounds``, scaled by them, and the
feature bounds of the DP release (one function: ``feature_bounds``), public or private;
``privacy.d`` is in raw units and the run turns it into feature units."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest
from click.testing import CliRunner

from kahm_dask.cli import main
from kahm_dask.datasets import load_bundled, split_and_scale
from kahm_dask.pipeline.config import PipelineConfig
from kahm_dask.pipeline.runs.central import estimator_from_config, settings_from_config
from kahm_dask.pipeline.runs.data import feature_bounds, prepare_stores, raw_bounds, scaled_d
from kahm_dask.pipeline.stores.dataset import open_dataset, write_dataset
from kahm_dask.privacy.bounds import BOUNDS_PRIVATE, BOUNDS_PRIVATE_SCALING, BOUNDS_PUBLIC, Scaling
from kahm_dask.privacy.randomness import PrivacyLeakWarning
from tests._kit import ledger_of, pipeline_dict


def _cfg(tmp_path, data: dict, epsilon=2.0) -> PipelineConfig:
    return PipelineConfig.from_dict(pipeline_dict(output=tmp_path / "run", data=data, **{"privacy.epsilon": epsilon}),
                                    base_dir=tmp_path)


def _npz(tmp_path, X, y):
    path = tmp_path / "d.npz"
    np.savez(path, X=X, y=y)
    return str(path)


@contextlib.contextmanager
def _no_leak_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        yield


def test_digits_public_bounds_scale_by_16_and_record_the_feature_range(tmp_path):
    cfg = _cfg(tmp_path, {"source": "sklearn:digits", "bounds": [0, 16]})
    train, test = prepare_stores(cfg, tmp_path / "run")
    assert train.path == tmp_path / "run" / "owner" / "data" / "train.zarr"
    raw = split_and_scale(*load_bundled("digits"), split_seed=0, scale=False)
    np.testing.assert_array_equal(train.X().compute(), raw.X_train / 16)
    assert train.attrs["feature_range"] == {"min": [0.0] * 64, "max": [1.0] * 64}
    with _no_leak_warning():
        settings = settings_from_config(cfg, train)
    np.testing.assert_array_equal(settings.bounds[0], 0) and np.testing.assert_array_equal(settings.bounds[1], 1)
    assert settings.bounds_source == BOUNDS_PUBLIC and settings.d is None and settings.delta == 0


def test_raw_rows_are_clipped_to_the_bounds(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.uniform(-5, 15, size=(60, 3))
    y = np.arange(60) % 2
    cfg = _cfg(tmp_path, {"source": _npz(tmp_path, X, y), "bounds": [[0, 0, 0], [10, 10, 20]], "scale": "none"})
    train, test = prepare_stores(cfg, tmp_path / "run")
    for store in (train, test):
        Z = store.X().compute()
        assert Z.min() >= 0 and Z[:, :2].max() <= 10 and Z[:, 2].max() <= 20
    lower, upper, source, _ = feature_bounds(cfg.data, 3, train)
    assert source == BOUNDS_PUBLIC and upper.tolist() == [10.0, 10.0, 20.0]


def test_tanh255_implies_pixel_bounds(tmp_path):
    X = np.array([[0, 255, 300]] * 10 + [[10, 20, -4]] * 10, dtype=np.float64)
    y = np.arange(20) % 2
    cfg = _cfg(tmp_path, {"source": _npz(tmp_path, X, y), "scale": "tanh255"})
    lower, upper = raw_bounds(cfg.data, 3)
    assert lower.tolist() == [0.0] * 3 and upper.tolist() == [255.0] * 3
    train, _ = prepare_stores(cfg, tmp_path / "run")
    Z = train.X().compute()
    assert Z.max() <= np.tanh(1.0) and Z.min() >= 0  # 300 clipped to 255, -4 to 0
    with _no_leak_warning():
        lower, upper, source, _ = feature_bounds(cfg.data, 3)
    assert source == BOUNDS_PUBLIC and np.allclose(upper, np.tanh(1.0)) and np.all(lower == 0)


def test_minmax_without_bounds_is_private_and_warns(tmp_path, digits_private_scaling):
    cfg = _cfg(tmp_path, {"source": "sklearn:digits"})
    train, _ = prepare_stores(cfg, tmp_path / "run")
    np.testing.assert_array_equal(train.X().compute(), digits_private_scaling.X_train)
    assert "feature_range" not in train.attrs
    with pytest.warns(PrivacyLeakWarning, match="data.bounds"):
        settings = settings_from_config(cfg, train)
    assert settings.bounds_source == BOUNDS_PRIVATE_SCALING and not settings.bounds.public


def test_none_without_bounds_takes_the_private_min_max(tmp_path):
    X = np.random.default_rng(1).uniform(2, 3, size=(40, 2))
    cfg = _cfg(tmp_path, {"source": _npz(tmp_path, X, np.arange(40) % 2), "scale": "none"})
    train, _ = prepare_stores(cfg, tmp_path / "run")
    with pytest.warns(PrivacyLeakWarning, match="private data"):
        lower, upper, source, _ = feature_bounds(cfg.data, 2, train)
    Z = train.X().compute()
    assert source == BOUNDS_PRIVATE and np.array_equal(lower, Z.min(0)) and np.array_equal(upper, Z.max(0))
    assert settings_from_config(cfg).bounds is None  # without the store: left to the training stage


def test_non_private_runs_need_no_bounds(tmp_path):
    cfg = _cfg(tmp_path, {"source": "sklearn:digits"}, epsilon=None)
    train, _ = prepare_stores(cfg, tmp_path / "run")
    with _no_leak_warning():
        assert settings_from_config(cfg, train).bounds is None


def test_cli_train_bounds_statement_and_budget(tmp_path, monkeypatch):
    """`kahm-dask train --bounds LOW HIGH --budget EPS DELTA` (threads instead of a cluster)."""
    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))
    X = np.random.default_rng(2).uniform(0, 1, size=(80, 4))
    y = np.arange(80) % 2
    write_dataset(tmp_path / "s.zarr", X, y, chunk_rows=40)
    args = ["train", str(tmp_path / "s.zarr"), str(tmp_path / "m.zarr"), "--n-components", "3", "--n-layers", "1",
            "--epsilon", "2", "--bounds", "0", "1", "--budget", "3", "0"]
    with _no_leak_warning():
        result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    statement = (tmp_path / "m.zarr.PRIVACY.md").read_text()
    assert "public (stated by the data owner)" in statement and "ε = 2" in statement
    assert ledger_of(open_dataset(tmp_path / "s.zarr")).spent() == (2.0, 0.0)
    args[2] = str(tmp_path / "m2.zarr")  # a second model from the same store: a new release
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 1 and "beyond the budget" in again.output


# --------------------------------------------------------------------------- privacy.d in raw units


#: A DP pipeline file on digits with public bounds (pipeline_dict overrides; privacy.d is added).
DIGITS_D = {"privacy.epsilon": 2.0, "data.source": "sklearn:digits", "data.bounds": [0, 16]}


def test_privacy_d_is_in_raw_units():
    """``privacy.d: 8`` for digits counted 0-16 covers a change of 8 counts: 0.5 of the scaled
    features (it was applied as 8 scaled units, 8 times the bound width)."""
    cfg = PipelineConfig.from_dict(pipeline_dict(**DIGITS_D, **{"privacy.d": 8}), base_dir=".")
    assert scaled_d(cfg.data, 8, 64) == 0.5
    assert scaled_d(cfg.data, None, 64) is None  # the width
    tanh = Scaling("tanh255", 0.0, 255.0)
    assert tanh.scaled_d(51.0) == pytest.approx(0.2) and tanh.raw_d(np.tanh(1.0)) == 255.0


def test_the_run_turns_raw_d_into_feature_units(tmp_path):
    cfg = PipelineConfig.from_dict(pipeline_dict(**DIGITS_D, **{"privacy.d": 4}, output=tmp_path), base_dir=".")
    train, _ = prepare_stores(cfg, tmp_path)
    estimator, source = estimator_from_config(cfg, train)
    assert estimator.d == 0.25 and source == BOUNDS_PUBLIC and estimator.bounds.scaling.kind == "minmax"
