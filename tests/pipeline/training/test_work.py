"""The work store (kahm_dask/pipeline/training/work.py): the k-means seed and the settings it
keeps survive a write that fails half-way (a full disk) — the old files stay whole and no
temporary is left behind."""

from __future__ import annotations

import json

import pytest

from kahm_dask.storage.location import as_location
from tests._kit import leftovers


def test_train_seed_and_settings_failure_mid_write_keep_the_old_files(tmp_path, disk_full):
    from kahm_dask.pipeline.training import work as work_mod

    work, model = tmp_path / "w", tmp_path / "m.zarr"
    work.mkdir()
    seed = work_mod.kmeans_seed(None, work)
    assert work_mod.kmeans_seed(None, work) == seed  # kept in the work store
    models = (as_location(work / "model.zarr"), as_location(model))
    work_mod.check_same_settings(models, as_location(work), {"seed": seed, "clusters": []})
    seed_file, settings_file = work / work_mod.SEED_FILE, work / "settings.json"
    assert json.loads(settings_file.read_text()) == {"seed": seed, "clusters": []}
    seed_file.write_text("{")  # damaged: the next run draws and writes a new seed
    disk_full()
    with pytest.raises(OSError, match="No space left"):
        work_mod.kmeans_seed(None, work)
    with pytest.raises(OSError, match="No space left"):
        work_mod.check_same_settings(models, as_location(work), {"seed": seed + 1, "clusters": []})
    assert seed_file.read_text() == "{"
    assert json.loads(settings_file.read_text()) == {"seed": seed, "clusters": []}
    assert leftovers(work) == []


def test_commit_removes_the_temporary_clusters_of_killed_writers(tmp_path):
    # a writer killed after its marker but before its rename leaves `.c0_s0.tmp-<uuid>` with a
    # marker inside: the committed model store must hold the cluster once, and no temporary
    from kahm_dask.pipeline.training import work as work_mod
    from kahm_dask.storage.atomic import sibling_path

    staged, model = tmp_path / "work" / "model.zarr", tmp_path / "public" / "model.zarr"
    done = staged / "clusters" / "c0_s0"
    done.mkdir(parents=True)
    (done / "_COMPLETE.json").write_text("{}")
    killed = sibling_path(done, "tmp")
    killed.mkdir()
    (killed / "_COMPLETE.json").write_text("{}")
    assert leftovers(staged / "clusters") == [killed.name]
    work_mod.commit_model(as_location(staged), as_location(model))
    assert sorted(p.name for p in (model / "clusters").iterdir()) == ["c0_s0"]
    assert (model / "_COMPLETE.json").is_file()
