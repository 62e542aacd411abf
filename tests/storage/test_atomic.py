"""Atomic writes (kahm_dask/storage/atomic.py, docs/reliability.md §3): every file and directory
kahm-dask writes goes through these helpers, so a write that fails half-way (a full disk) or is
interrupted before its rename leaves the old file or directory intact and no temporary behind.
Each writer that uses them is tested the same way beside its own tests (the report, the ledger,
the work store's seed and settings, the dataset store and its marker, the model store's clusters,
the predictions); the slow tests in tests/system/test_interrupted_run.py kill real runs.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from kahm_dask.storage import atomic as _atomic
from kahm_dask.storage.atomic import (
    atomic_directory,
    replace_directory,
    sibling_path,
    write_json_atomic,
    write_text_atomic,
)
from tests._kit import leftovers as _leftovers

# --------------------------------------------------------------------------- kahm_dask.storage.atomic


def test_sibling_path_is_a_hidden_unique_sibling(tmp_path):
    a, b = sibling_path(tmp_path / "x.zarr", "tmp"), sibling_path(str(tmp_path / "x.zarr"), "tmp")
    assert a.parent == tmp_path and a != b
    assert a.name.startswith(".x.zarr.tmp-") and len(a.name) == len(".x.zarr.tmp-") + 32
    assert sibling_path(tmp_path / "x", "old").name.startswith(".x.old-")


def test_write_text_atomic_creates_parents_and_replaces(tmp_path):
    path = tmp_path / "a" / "b" / "note.md"
    assert write_text_atomic(path, "ε = 1\n") == path
    assert path.read_bytes() == "ε = 1\n".encode()
    write_text_atomic(str(path), "new")
    assert path.read_text() == "new"
    assert _leftovers(path.parent) == []


def test_write_json_atomic_passes_dumps_options_and_fails_before_writing(tmp_path):
    path = write_json_atomic(tmp_path / "d.json", {"b": 1, "a": [1, 2]}, indent=2, sort_keys=True)
    assert path.read_text() == json.dumps({"a": [1, 2], "b": 1}, indent=2)
    with pytest.raises(TypeError, match="not JSON serializable"):
        write_json_atomic(path, {"x": object()})
    assert json.loads(path.read_text()) == {"a": [1, 2], "b": 1}
    assert _leftovers(tmp_path) == []


def test_write_text_atomic_failure_mid_write_keeps_the_old_file(tmp_path, disk_full):
    path = tmp_path / "note.txt"
    path.write_text("old")
    disk_full()
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(path, "new text")
    assert path.read_text() == "old"
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(tmp_path / "fresh.txt", "new text")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["note.txt"]


def test_write_text_atomic_interrupted_before_the_rename(tmp_path, monkeypatch):
    path = tmp_path / "note.txt"
    path.write_text("old")

    def interrupt(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(_atomic.os, "fsync", interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(path, "new")
    assert path.read_text() == "old" and _leftovers(tmp_path) == []


def _make_dir(path: Path, content: str) -> Path:
    path.mkdir()
    (path / "f.txt").write_text(content)
    return path


def test_replace_directory_into_a_free_and_an_occupied_place(tmp_path):
    replace_directory(_make_dir(tmp_path / "new1", "one"), tmp_path / "target")
    assert (tmp_path / "target" / "f.txt").read_text() == "one"
    replace_directory(str(_make_dir(tmp_path / "new2", "two")), str(tmp_path / "target"))
    assert (tmp_path / "target" / "f.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]


def test_replace_directory_restores_the_old_target_if_the_move_fails(tmp_path, monkeypatch):
    _make_dir(tmp_path / "target", "old")
    new = _make_dir(tmp_path / "new", "new")
    real = os.replace

    def fails_for_new(src, dst):
        if Path(src) == new:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real(src, dst)

    monkeypatch.setattr(_atomic.os, "replace", fails_for_new)
    with pytest.raises(OSError, match="cross-device"):
        replace_directory(new, tmp_path / "target")
    assert (tmp_path / "target" / "f.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "target"]


def test_atomic_directory_commits_on_success_and_cleans_up_on_error(tmp_path):
    target = tmp_path / "sub" / "out"
    with atomic_directory(target) as tmp:
        assert tmp.parent == target.parent and not tmp.exists()
        _make_dir(tmp, "first")
    assert (target / "f.txt").read_text() == "first"
    for error in (RuntimeError("failed"), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            with atomic_directory(target) as tmp:
                _make_dir(tmp, "second")
                raise error
        assert (target / "f.txt").read_text() == "first"
        assert sorted(p.name for p in target.parent.iterdir()) == ["out"]
