"""The pipeline's DP release: noise never reused, stored noisy rows reused on resume, the
privacy ledger and its budget, the stored dtype, and what the model store may hold.

Attacks replayed: the old pipeline derived the noise from a seed kept in
``work/secret_seed.json`` and regenerated it on every run; the same seed at two runs (or two ε)
gave the same noise, so differencing recovered the private rows. Now the noise comes from the
operating system's secure generator, is drawn once per run and stored, and the seed seeds only
k-means.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr

from kahm_dask.datasets import make_class_blobs
from kahm_dask.pipeline.modelstore import cluster_dir, read_manifest
from kahm_dask.pipeline.store import write_dataset
from kahm_dask.pipeline.train import NOISY, TrainSettings, noisy_array, train_pipeline
from kahm_dask.privacy.bounds import BOUNDS_PRIVATE, BOUNDS_PUBLIC
from kahm_dask.privacy.ledger import BudgetExceededError, PrivacyLedger, ledger_path
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import PrivacyLeakWarning, SecureRandom
from kahm_dask.recipe import TrainParams


@pytest.fixture
def blobs(tmp_path):
    X, y = make_class_blobs(300, 6, 3, random_state=1)
    X = (X - X.min(0)) / (X.max(0) - X.min(0))  # in [0, 1]: the public bounds below
    return write_dataset(tmp_path / "train.zarr", X, y, chunk_rows=64), X


def _settings(**kw) -> TrainSettings:
    params = kw.pop("params", TrainParams(4, 2, epsilon=2.0, r_value=2))
    return TrainSettings(params, seed=kw.pop("seed", 5), block_size=kw.pop("block_size", 1000),
                         bounds=kw.pop("bounds", (0.0, 1.0)), **kw)


def _train(store, root: Path, settings: TrainSettings) -> dict:
    return train_pipeline(store, root / "model.zarr", root / "work", settings, progress=False)


def _noisy(root: Path) -> np.ndarray:
    return zarr.open_array(str(root / "work" / NOISY), mode="r")[...]


def _marker(root: Path) -> dict:
    return json.loads((root / "work" / NOISY / "_COMPLETE.json").read_text())


def _ledger(store) -> list[dict]:
    return PrivacyLedger(ledger_path(store.path)).entries


def test_resumed_run_reuses_the_stored_noisy_rows(tmp_path, blobs):
    store, X = blobs
    first = _train(store, tmp_path / "run", _settings())
    noisy, marker = _noisy(tmp_path / "run"), _marker(tmp_path / "run")
    assert first["privacy"]["noise_reused"] is False
    assert marker["noise_id"] == first["privacy"]["release_id"] and len(marker["noise_id"]) == 32
    assert not np.array_equal(noisy, X)
    shutil.rmtree(cluster_dir(tmp_path / "run" / "model.zarr", 1, 0))  # a cluster lost mid-run
    second = _train(store, tmp_path / "run", _settings())
    assert second["privacy"]["noise_reused"] is True and second["n_resumed"] == first["n_clusters"] - 1
    assert _noisy(tmp_path / "run").tobytes() == noisy.tobytes()
    assert _marker(tmp_path / "run")["noise_id"] == marker["noise_id"]
    assert [e["release_id"] for e in _ledger(store)] == [marker["noise_id"]]  # recorded once
    assert read_manifest(tmp_path / "run" / "model.zarr")["privacy"]["release_id"] == marker["noise_id"]


def test_incomplete_noisy_rows_are_rewritten_with_fresh_noise(tmp_path, blobs):
    store, _ = blobs
    _train(store, tmp_path / "run", _settings())
    noisy, old_id = _noisy(tmp_path / "run"), _marker(tmp_path / "run")["noise_id"]
    (tmp_path / "run" / "work" / NOISY / "_COMPLETE.json").unlink()  # killed mid-write
    # clusters trained on the old draw exist: new noise must not be mixed with them
    with pytest.raises(ValueError, match="new noise cannot be mixed"):
        _train(store, tmp_path / "run", _settings())
    shutil.rmtree(tmp_path / "run" / "model.zarr")
    summary = _train(store, tmp_path / "run", _settings())
    new_id = _marker(tmp_path / "run")["noise_id"]
    assert new_id != old_id and summary["privacy"]["release_id"] == new_id
    assert not np.array_equal(_noisy(tmp_path / "run"), noisy)
    assert [e["release_id"] for e in _ledger(store)] == [old_id, new_id]


def test_two_runs_with_the_same_seed_draw_different_noise(tmp_path, blobs):
    """The seed is public now: it must not determine the noise (the two-run differencing
    attack recovered X from two releases with one seed)."""
    store, X = blobs
    a = _train(store, tmp_path / "a", _settings(seed=3))
    b = _train(store, tmp_path / "b", _settings(seed=3))
    na, nb = _noisy(tmp_path / "a"), _noisy(tmp_path / "b")
    assert a["seed"] == b["seed"] == 3
    assert not np.array_equal(na, nb) and np.mean(na == nb) < 0.05
    assert a["privacy"]["release_id"] != b["privacy"]["release_id"]
    assert len(_ledger(store)) == 2
    assert read_manifest(tmp_path / "a" / "model.zarr")["seed"] == 3  # not secret any more
    assert not list(tmp_path.rglob("secret_seed.json"))


def test_budget_refuses_a_release_beyond_it_before_drawing_noise(tmp_path, blobs):
    store, _ = blobs
    _train(store, tmp_path / "a", _settings(budget=(3.0, 0.0)))
    with pytest.raises(BudgetExceededError, match="beyond the budget"):
        _train(store, tmp_path / "b", _settings(budget=(3.0, 0.0)))
    assert not (tmp_path / "b" / "work" / NOISY).exists()  # no noise drawn
    assert len(_ledger(store)) == 1
    # a rerun of the first run reuses its noisy rows: no new release, within the budget
    assert _train(store, tmp_path / "a", _settings(budget=(3.0, 0.0)))["privacy"]["noise_reused"]
    # the budget is kept in the ledger: a later run without one is refused too
    with pytest.raises(BudgetExceededError):
        _train(store, tmp_path / "c", _settings())


def test_other_privacy_settings_draw_new_noise(tmp_path, blobs):
    store, _ = blobs
    _train(store, tmp_path / "run", _settings())
    shutil.rmtree(tmp_path / "run" / "model.zarr")
    params = TrainParams(4, 2, epsilon=1.0, r_value=2)
    summary = _train(store, tmp_path / "run", _settings(params=params))
    assert summary["privacy"]["noise_reused"] is False
    assert [e["epsilon"] for e in _ledger(store)] == [2.0, 1.0]


def test_noisy_rows_keep_the_stored_dtype_and_the_public_grid(tmp_path):
    X, y = make_class_blobs(200, 5, 2, random_state=3)
    X = np.clip(X / 10 + 0.5, 0, 1).astype(np.float32)
    store = write_dataset(tmp_path / "s.zarr", X, y, dtype="float32", chunk_rows=50)
    _train(store, tmp_path / "run", _settings(params=TrainParams(4, 1, epsilon=2.0, dp_data="noisy")))
    noisy = _noisy(tmp_path / "run")
    assert noisy.dtype == np.float32
    steps = noisy.astype(np.float64) * 1024  # lower 0, grid step d/1024 = 1/1024
    np.testing.assert_array_equal(steps, np.rint(steps))
    # the blockwise release of a big float32 chunk stays float32 (no float64 copy of it)
    import dask.array as da

    mech = GridLaplace(2.0, np.zeros(5), np.ones(5))
    big = noisy_array(da.from_array(X, chunks=(100, 5)), mech, SecureRandom())
    assert big.dtype == np.float32 and big.compute().dtype == np.float32


def test_model_store_holds_nothing_else_from_private_rows(tmp_path, blobs):
    store, _ = blobs
    _train(store, tmp_path / "a", _settings())
    for d in (tmp_path / "a" / "model.zarr" / "clusters").iterdir():
        info = json.loads((d / "_COMPLETE.json").read_text())
        assert set(info) == {"class", "cluster", "n_rows", "passes", "layer_dims"}  # no timing
        assert info["passes"] == 2  # r_source "passes": a public constant
    with pytest.warns(PrivacyLeakWarning, match="r_source='private'"):
        _train(store, tmp_path / "b", _settings(params=TrainParams(4, 2, epsilon=2.0, r_source="private")))
    for d in (tmp_path / "b" / "model.zarr" / "clusters").iterdir():
        assert "passes" not in json.loads((d / "_COMPLETE.json").read_text())
    statement = read_manifest(tmp_path / "b" / "model.zarr")["privacy"]["statement"]
    assert any("r_source='private'" in w for w in statement["weakenings"])


def test_bounds_come_from_settings_else_the_store_else_private_data(tmp_path, blobs):
    store, X = blobs
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        a = _train(store, tmp_path / "a", _settings())  # public bounds: no warning
    assert a["privacy"]["statement"]["bounds_source"] == BOUNDS_PUBLIC
    with pytest.warns(PrivacyLeakWarning, match="private data"):
        b = _train(store, tmp_path / "b", _settings(bounds=None))
    assert b["privacy"]["statement"]["bounds_source"] == BOUNDS_PRIVATE
    assert "bounds" in " ".join(b["privacy"]["statement"]["weakenings"])
    public = write_dataset(tmp_path / "p.zarr", X, np.zeros(len(X), int) + (np.arange(len(X)) % 2),
                           feature_range=(0.0, 2.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        c = _train(public, tmp_path / "c", _settings(bounds=None))
    assert c["privacy"]["statement"]["mechanism"]["upper"] == 2.0
    assert c["privacy"]["statement"]["bounds_source"] == BOUNDS_PUBLIC


def test_weakening_options_warn_and_are_named(tmp_path, blobs):
    store, _ = blobs
    with pytest.warns(PrivacyLeakWarning, match="cluster_on='original'"):
        s = _train(store, tmp_path / "a", _settings(cluster_on="original"))
    assert any("cluster_on='original'" in w for w in s["privacy"]["statement"]["weakenings"])
    assert "cluster_on='original'" in s["privacy_statement_markdown"]
    with pytest.warns(PrivacyLeakWarning, match="NOT differentially private"):
        s = _train(store, tmp_path / "b", _settings(insecure_noise_seed=1))
    assert s["privacy"]["statement"]["holds"] is False
