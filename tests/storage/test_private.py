"""Owner-only file modes (kahm_dask/storage/private.py).

Finding replayed (failed on the code before): Ctrl-C during a run's training ended with
``FileNotFoundError: .../clusters/.c2_s1.tmp-…/zarr.….partial`` (exit 1) instead of the one
interrupt line (exit 130). The run makes its owner folder private on the way out, while the
workers are still writing: a temporary file listed by the walk was renamed before its chmod.
"""

from __future__ import annotations

import os
import stat

from kahm_dask.storage.private import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, make_private


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_every_folder_and_file_becomes_owner_only(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f.json").write_text("{}")
    (tmp_path / "g").write_text("x")
    os.chmod(tmp_path / "a", 0o755)
    os.chmod(tmp_path / "g", 0o644)
    make_private(tmp_path)
    assert {_mode(tmp_path), _mode(tmp_path / "a"), _mode(tmp_path / "a" / "b")} == {PRIVATE_DIR_MODE}
    assert {_mode(tmp_path / "g"), _mode(tmp_path / "a" / "b" / "f.json")} == {PRIVATE_FILE_MODE}


def test_entries_that_vanish_during_the_walk_are_skipped(tmp_path, monkeypatch):
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "f").write_text("x")
    real_walk = os.walk

    def walk_listing_vanished_entries(top, *args, **kwargs):
        for root, dirs, files in real_walk(top, *args, **kwargs):
            # what a concurrent writer renamed or removed after the listing
            yield root, [*dirs, ".gone.tmp-1"], [*files, "zarr.1.partial"]

    monkeypatch.setattr(os, "walk", walk_listing_vanished_entries)
    make_private(tmp_path)
    assert _mode(tmp_path / "kept") == PRIVATE_DIR_MODE and _mode(tmp_path / "kept" / "f") == PRIVATE_FILE_MODE
