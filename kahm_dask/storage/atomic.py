"""Atomic writes: a reader sees the old file or directory, or the new one, never a part.

Every file and directory the library writes goes through these helpers. A text file is
written to a uniquely named sibling, flushed to disk, then renamed over the target
(``os.replace`` is atomic on POSIX and Windows within one file system). A directory is built
under a sibling name and renamed into place; an existing target is moved aside first and
deleted only after the new one is in place. The model store's clusters
(:mod:`kahm_dask.pipeline.stores.model`) use the same sibling names but their own commit,
which never replaces a complete cluster (concurrent writers of one cluster).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "sibling_path",
    "write_text_atomic",
    "write_bytes_atomic",
    "write_json_atomic",
    "replace_directory",
    "atomic_directory",
]


def sibling_path(path: str | os.PathLike, tag: str) -> Path:
    """A new hidden sibling of ``path`` named ``.<name>.<tag>-<32 hex digits>``.

    Temporary (``tag="tmp"``) and moved-aside (``tag="old"``) files and directories are
    named so; a name is unique, so concurrent writers never collide.

    >>> sibling_path("/data/a.zarr", "tmp").name[:12]
    '.a.zarr.tmp-'
    """
    path = Path(path)
    return path.with_name(f".{path.name}.{tag}-{uuid.uuid4().hex}")


def write_text_atomic(path: str | os.PathLike, text: str, *, mode: int | None = None) -> Path:
    """Write ``text`` to ``path`` atomically (parent folders are created); ``mode`` (e.g.
    0o600) is the new file's permission bits from the start, else the process's default.

    >>> import tempfile
    >>> p = write_text_atomic(Path(tempfile.mkdtemp()) / "a" / "note.txt", "hello")
    >>> p.read_text()
    'hello'
    """
    return write_bytes_atomic(path, text.encode("utf-8"), mode=mode)


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` atomically (``mode``: as in :func:`write_text_atomic`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = sibling_path(path, "tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
        if mode is not None:
            os.fchmod(fd, mode)  # exactly ``mode``, whatever the umask
        with open(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | os.PathLike, obj: Any, *, mode: int | None = None, **dumps_kwargs: Any) -> Path:
    """Write ``json.dumps(obj, **dumps_kwargs)`` to ``path`` atomically (``mode``: as in
    :func:`write_text_atomic`)."""
    return write_text_atomic(path, json.dumps(obj, **dumps_kwargs), mode=mode)


def replace_directory(new: str | os.PathLike, target: str | os.PathLike) -> None:
    """Put the complete directory ``new`` at ``target``; an old ``target`` is moved aside
    first and removed only once ``new`` is in place (it is moved back if that fails)."""
    new, target = Path(new), Path(target)
    if not target.exists():
        os.replace(new, target)
        return
    old = sibling_path(target, "old")
    os.replace(target, old)
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_directory(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling directory path of ``target``; on success it replaces
    ``target`` (:func:`replace_directory`), on error it is removed.

    The caller creates the directory (e.g. as a Zarr store) at the yielded path.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = sibling_path(target, "tmp")
    try:
        yield tmp
        replace_directory(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
