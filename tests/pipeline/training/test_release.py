"""The pipeline's DP release: noise never reused, stored noisy rows reused on resume (and only
on the rows they were drawn for), the data set's privacy ledger and its budget, the stored
dtype, and what the model store may hold.

Attacks replayed: the old pipeline derived the noise from a seed kept in
``work/secret_seed.json`` and regenerated it on every run; the same seed at two runs (or two ε)
gave the same noise, so differencing recovered the private rows. Now the noise comes from the
operating system's secure generator, is drawn once per run and stored, and the seed seeds only
k-means.
"""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr

from kahm_dask.datasets import make_class_blobs
from kahm_dask.pipeline.stores.dataset import write_dataset
from kahm_dask.pipeline.stores.manifest import read_manifest
from kahm_dask.pipeline.training import NOISY, StoredNoiseError, TrainSettings, noisy_array, train_pipeline
from kahm_dask.privacy.bounds import BOUNDS_PRIVATE, BOUNDS_PUBLIC
from kahm_dask.privacy.ledger import BudgetChangeError, BudgetExceededError
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import PrivacyLeakWarning, SecureRandom
from kahm_dask.recipe import TrainParams
from tests._kit import interrupt_after_training, ledger_of


@pytest.fixture
def blobs(tmp_path):
    X, y = make_class_blobs(300, 6, 3, random_state=1)
    X = (X - X.min(0)) / (X.max(0) - X.min(0))  # in [0, 1]: the public bounds below
    return write_dataset(tmp_path / "train.zarr", X, y, chunk_rows=64), X


def _settings(**kw) -> TrainSettings:
    params = kw.pop("params", TrainParams(4, 2, epsilon=2.0, dp_data="fabricated", r_value=2))
    return TrainSettings(params, seed=kw.pop("seed", 5), block_size=kw.pop("block_size", 1000),
                         bounds=kw.pop("bounds", (0.0, 1.0)), **kw)


def _train(store, root: Path, settings: TrainSettings) -> dict:
    return train_pipeline(store, root / "model.zarr", root / "work", settings, progress=False)


def _noisy(root: Path) -> np.ndarray:
    return zarr.open_array(str(root / "work" / NOISY), mode="r")[...]


def _marker(root: Path) -> dict:
    return json.loads((root / "work" / NOISY / "_COMPLETE.json").read_text())


def _ledger(store) -> list[dict]:
    return ledger_of(store).entries


def test_resumed_run_reuses_the_stored_noisy_rows(tmp_path, blobs):
    store, X = blobs
    first = _train(store, tmp_path / "run", _settings())
    noisy, marker = _noisy(tmp_path / "run"), _marker(tmp_path / "run")
    assert first["privacy"]["noise_reused"] is False
    assert marker["noise_id"] == first["privacy"]["release_id"] and len(marker["noise_id"]) == 32
    assert not np.array_equal(noisy, X)
    interrupt_after_training(tmp_path / "run" / "model.zarr", tmp_path / "run" / "work", (1, 0))
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
    (tmp_path / "run" / "work" / NOISY / "_COMPLETE.json").unlink()  # damaged after the run
    # clusters trained on the old draw exist: new noise must not be mixed with them
    with pytest.raises(ValueError, match="new noise cannot be mixed"):
        _train(store, tmp_path / "run", _settings())
    assert [e["release_id"] for e in _ledger(store)] == [old_id]  # refused before anything was spent
    shutil.rmtree(tmp_path / "run" / "model.zarr")
    summary = _train(store, tmp_path / "run", _settings())
    new_id = _marker(tmp_path / "run")["noise_id"]
    assert new_id != old_id and summary["privacy"]["release_id"] == new_id
    assert not np.array_equal(_noisy(tmp_path / "run"), noisy)
    assert [e["release_id"] for e in _ledger(store)] == [old_id, new_id]


def test_a_draw_interrupted_before_its_commit_is_drawn_again_and_not_called_reused(tmp_path, blobs, monkeypatch):
    """A crash between storing the noise and marking it complete leaves the pending marker: the
    rerun continues that release (charged once) but redraws its noise, so noise_reused is false."""
    store, _ = blobs

    def crash(*args, **kwargs):
        raise OSError("worker lost")

    with monkeypatch.context() as mp:
        mp.setattr(sys.modules["kahm_dask.pipeline.training.release"], "mark_complete", crash)
        with pytest.raises(OSError, match="worker lost"):
            _train(store, tmp_path / "run", _settings())
    charged = [e["release_id"] for e in _ledger(store)]
    summary = _train(store, tmp_path / "run", _settings())
    assert summary["privacy"]["noise_reused"] is False
    assert summary["privacy"]["release_id"] == _marker(tmp_path / "run")["noise_id"] == charged[0]
    assert [e["release_id"] for e in _ledger(store)] == charged  # one release, charged once


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
    # and a caller cannot raise it (a stored (3, 0) was once replaced by (100, 0))
    with pytest.raises(BudgetChangeError, match="may lower it but not raise it"):
        _train(store, tmp_path / "d", _settings(budget=(100.0, 0.0)))
    assert ledger_of(store).budget == (3.0, 0.0) and len(_ledger(store)) == 1


def test_the_budget_belongs_to_the_rows_not_to_the_folder_or_the_store(tmp_path, blobs):
    """Finding 1: two output folders, and a copy of the store, share one ledger: the same rows
    released twice under a budget of 3 is refused the second time."""
    store, X = blobs
    y = store.labels()
    _train(store, tmp_path / "a", _settings(budget=(3.0, 0.0)))
    copy = write_dataset(tmp_path / "copy.zarr", X[::-1], y[::-1], chunk_rows=50)  # same rows, another order
    with pytest.raises(BudgetExceededError, match="1 release"):
        _train(copy, tmp_path / "b", _settings())
    assert not (tmp_path / "b" / "work" / NOISY).exists()
    subset = write_dataset(tmp_path / "subset.zarr", X[:-1], y[:-1])  # a row removed: the same rows' budget
    with pytest.raises(BudgetExceededError, match="299 of its 299 row"):
        _train(subset, tmp_path / "c", _settings())
    other = write_dataset(tmp_path / "other.zarr", X[:, ::-1], y)  # other rows (columns permuted)
    _train(other, tmp_path / "d", _settings())
    assert len(_ledger(store)) == 1 and len(_ledger(other)) == 1


def test_stored_noise_is_refused_for_changed_rows(tmp_path, blobs):
    """Finding 4: re-ingesting the store path with other rows (permuted, one entry changed)
    and resuming refused, saying what changed, with nothing spent."""
    store, X = blobs
    y = store.labels()
    first = _train(store, tmp_path / "run", _settings())
    release = first["privacy"]["release_id"]
    cases = {
        "the same rows in another order": (X[::-1], y[::-1]),
        "at least one entry differs": (np.where(np.arange(X.size).reshape(X.shape) == 7, 1.0 - X, X), y),
        "other rows": (X[:200], y[:200]),
    }
    for what, (Xc, yc) in cases.items():
        changed = write_dataset(tmp_path / "train.zarr", Xc, yc, chunk_rows=64, overwrite=True)
        with pytest.raises(StoredNoiseError, match=what) as err:
            _train(changed, tmp_path / "run", _settings())
        assert release in str(err.value) and "new work store" in str(err.value)
    assert [e["release_id"] for e in _ledger(store)] == [release]
    # the same rows again (re-ingested unchanged): the stored release is continued
    same = write_dataset(tmp_path / "train.zarr", X, y, chunk_rows=100, overwrite=True)
    assert _train(same, tmp_path / "run", _settings())["privacy"]["noise_reused"]


def test_other_privacy_settings_draw_new_noise(tmp_path, blobs):
    store, _ = blobs
    _train(store, tmp_path / "run", _settings())
    shutil.rmtree(tmp_path / "run" / "model.zarr")
    params = TrainParams(4, 2, epsilon=1.0, dp_data="fabricated", r_value=2)
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
    # the release and the private rows carry the rows' codec (zstd level 1: storage/codecs.py)
    from zarr.codecs import ZstdCodec

    for arr in (zarr.open_array(str(tmp_path / "run" / "work" / NOISY), mode="r"),
                zarr.open_group(store.path, mode="r")["X"]):
        assert ZstdCodec(level=1) in arr.metadata.codecs, arr.metadata.codecs
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
        private_r = TrainParams(4, 2, epsilon=2.0, dp_data="fabricated", r_source="private")
        _train(store, tmp_path / "b", _settings(params=private_r))
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
