"""Folders one process at a time: a second kahm-dask run on a run folder or work store is
refused at once, with a message, instead of racing the first (which lost releases).

The lock is an exclusive file lock (``filelock``: ``flock`` on POSIX, released by the kernel
if the process dies) on ``<folder>/.kahm-dask.lock``. It needs a local file system with working
locks; remote stores (object stores) are not locked, and concurrent runs on one of them are not
detected.

Examples
--------
>>> import tempfile
>>> folder = Path(tempfile.mkdtemp())
>>> with exclusive(folder, "the run folder"):
...     with exclusive(folder, "the run folder"):
...         pass
Traceback (most recent call last):
...
kahm_dask.storage.locks.FolderBusyError: the run folder ... is in use by another kahm-dask process ...
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

__all__ = ["FolderBusyError", "exclusive", "LOCK_NAME"]

#: The lock file inside a locked folder.
LOCK_NAME = ".kahm-dask.lock"


class FolderBusyError(RuntimeError):
    """Another process holds the folder's lock."""


@contextmanager
def exclusive(folder: str | os.PathLike | None, what: str) -> Iterator[None]:
    """Hold ``folder``'s lock for the block, or raise :class:`FolderBusyError` at once if another
    process (or another ``exclusive`` of this one) holds it; None: nothing to lock (remote)."""
    if folder is None:
        yield
        return
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(folder / LOCK_NAME, timeout=0, is_singleton=False, mode=0o600)
    try:
        lock.acquire()
    except Timeout:
        raise FolderBusyError(
            f"{what} {folder} is in use by another kahm-dask process (lock {folder / LOCK_NAME}); wait for it "
            "to finish, or use another folder."
        ) from None
    try:
        yield
    finally:
        lock.release()
