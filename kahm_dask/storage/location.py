"""Where a store lives: a local path or a URL that fsspec reaches (``s3://``, ``gs://``, …).

This module is the only place that tells local paths from URLs. :func:`as_location` turns a
path or URL plus fsspec ``storage_options`` into a :class:`Location`, which gives a Zarr store
object, joins child names, tests existence, lists, deletes, reads and writes small files, and
reads byte ranges of a file into a buffer.
A ``file://`` URL is a local path. A :class:`Location` holds only the URL and the options (a
picklable dict), so tasks on Dask workers get it and open their own filesystem.

Committing a directory (:func:`committed_directory`):

* **local paths**: the directory is built under a temporary sibling name and renamed into
  place (:func:`kahm_dask.storage.atomic.atomic_directory`): a reader sees the old or the new one;
* **object stores** have no rename: the old directory is deleted, the new one is written in
  its final place and its completion marker ``_COMPLETE.json`` is written **last**. Readers
  treat a remote directory without its marker as absent or incomplete (:func:`is_committed`);
  a write that fails is deleted.

``storage_options`` may hold credentials: they are passed to fsspec and never written to a
store or shown in a repr.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fsspec
import zarr
from fsspec.core import split_protocol, url_to_fs
from fsspec.registry import known_implementations

from kahm_dask.storage.atomic import atomic_directory, write_text_atomic

__all__ = ["Location", "LocationLike", "as_location", "committed_directory", "is_committed", "copy_tree",
           "COMPLETE_FILE"]

#: The completion marker of a directory (a committed store on an object store, a cluster of
#: the model store, the work store's noisy rows).
COMPLETE_FILE = "_COMPLETE.json"
#: The extra that installs the fsspec implementation of a protocol.
_EXTRAS = {"s3": "kahm-dask[s3]", "s3a": "kahm-dask[s3]"}
#: fsspec options set unless given: listings are not cached, since workers write concurrently.
_DEFAULT_OPTIONS = {"use_listings_cache": False}
#: Temporary and moved-aside siblings (:func:`kahm_dask.storage.atomic.sibling_path`), never copied.
_SIBLINGS = shutil.ignore_patterns(".*.tmp-*", ".*.old-*")


@dataclass(frozen=True)
class Location:
    """A local directory or file (``protocol`` None, ``url`` an absolute path) or a URL.

    ``storage_options`` are fsspec's options for the URL's filesystem (not compared, not shown).
    """

    url: str
    protocol: str | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_local(self) -> bool:
        """True for a path of the local filesystem."""
        return self.protocol is None

    @property
    def path(self) -> Path:
        """The local path; ValueError for a URL."""
        if not self.is_local:
            raise ValueError(f"{self.url} is a URL, not a local path.")
        return Path(self.url)

    @property
    def name(self) -> str:
        """The last component of the path."""
        return self.url.rstrip("/").rsplit("/", 1)[-1] if not self.is_local else self.path.name

    def __str__(self) -> str:
        return self.url

    def __truediv__(self, name: str) -> Location:
        """The child ``name`` (may contain ``/``)."""
        if self.is_local:
            return Location(str(self.path / name))
        return Location(f"{self.url.rstrip('/')}/{name}", self.protocol, self.storage_options)

    def with_name(self, name: str) -> Location:
        """The sibling called ``name``."""
        if self.is_local:
            return Location(str(self.path.with_name(name)))
        return Location(f"{self.url.rstrip('/').rsplit('/', 1)[0]}/{name}", self.protocol, self.storage_options)

    def public(self) -> str | Path:
        """The local :class:`~pathlib.Path`, or the URL string (what users are given back)."""
        return self.path if self.is_local else self.url

    # ------------------------------------------------------------------ access
    def options(self) -> dict[str, Any]:
        """fsspec's options for this URL (defaults added); empty for a local path."""
        return {} if self.is_local else {**_DEFAULT_OPTIONS, **self.storage_options}

    def zarr_store(self, *, read_only: bool = False) -> zarr.storage.StoreLike:
        """A Zarr store object for :func:`zarr.open_group` / :func:`zarr.open_array`."""
        if self.is_local:
            return zarr.storage.LocalStore(self.path, read_only=read_only)
        return zarr.storage.FsspecStore.from_url(self.url, storage_options=self.options(), read_only=read_only)

    def dask_target(self) -> tuple[str, dict[str, Any] | None]:
        """``(url, storage_options)`` for :func:`dask.array.from_zarr` and ``to_zarr``."""
        return (self.url, None) if self.is_local else (self.url, self.options())

    def _fs(self) -> tuple[fsspec.AbstractFileSystem, str]:
        return url_to_fs(self.url, **self.options())

    def exists(self) -> bool:
        """Whether a file or directory (a key prefix on object stores) is here."""
        if self.is_local:
            return self.path.exists()
        fs, path = self._fs()
        return fs.exists(path)

    def children(self) -> list[str]:
        """The names in this directory (empty if it is absent or not a directory)."""
        if self.is_local:
            return [p.name for p in self.path.iterdir()] if self.path.is_dir() else []
        fs, path = self._fs()
        try:
            return [entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(path, detail=False)
                    if entry.rstrip("/") != path.rstrip("/")]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def files(self) -> list[str]:
        """Paths (with ``/``) relative to this directory of every file under it, sorted;
        temporary and moved-aside siblings of a local directory are left out."""
        if self.is_local:
            found = []
            for root, dirs, names in os.walk(self.path):
                ignored = _SIBLINGS(root, dirs + names)
                dirs[:] = [d for d in dirs if d not in ignored]
                rel = Path(root).relative_to(self.path)
                found += [(rel / n).as_posix() for n in names if n not in ignored]
            return sorted(found)
        fs, path = self._fs()
        prefix = path.rstrip("/") + "/"
        return sorted(p[len(prefix):] for p in fs.find(path) if p.startswith(prefix))

    def remove(self) -> None:
        """Delete this file or directory with everything under it (nothing if absent)."""
        if self.is_local:
            if self.path.is_dir():
                shutil.rmtree(self.path)
            else:
                self.path.unlink(missing_ok=True)
            return
        fs, path = self._fs()
        if fs.exists(path):
            fs.rm(path, recursive=True)

    def read_bytes(self) -> bytes:
        """The file's content; FileNotFoundError if absent."""
        if self.is_local:
            return self.path.read_bytes()
        fs, path = self._fs()
        return fs.cat_file(path)

    def write_bytes(self, data: bytes | memoryview) -> None:
        """Write the file (parent folders created); one PUT on object stores. A memoryview is
        written without a copy locally."""
        if self.is_local:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_bytes(data)
            return
        fs, path = self._fs()
        fs.pipe_file(path, bytes(data))

    def read_into(self, buffer: memoryview, offset: int) -> None:
        """Fill ``buffer`` (a writable byte view) with the file's bytes from ``offset`` on: a
        positioned read locally (no intermediate copy), one ranged GET on object stores.
        EOFError if the file ends first; FileNotFoundError if it is absent."""
        n = buffer.nbytes
        if self.is_local:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                done = 0
                while done < n:
                    got = os.preadv(fd, [buffer[done:]], offset + done)
                    if got == 0:
                        raise EOFError(f"{self.path} ends before byte {offset + n}.")
                    done += got
            finally:
                os.close(fd)
            return
        fs, path = self._fs()
        data = fs.cat_file(path, start=offset, end=offset + n)
        if len(data) != n:
            raise EOFError(f"{self.url} ends before byte {offset + n}.")
        buffer[:] = data

    def read_text(self) -> str:
        """The file's UTF-8 text; FileNotFoundError if absent."""
        return self.read_bytes().decode("utf-8")

    def write_text(self, text: str) -> None:
        """Write the file atomically: renamed into place locally, one PUT on object stores."""
        if self.is_local:
            write_text_atomic(self.path, text)
        else:
            self.write_bytes(text.encode("utf-8"))

    def read_json(self) -> Any:
        """The file's JSON value; FileNotFoundError if absent, ``json.JSONDecodeError`` if damaged."""
        return json.loads(self.read_text())

    def write_json(self, obj: Any, **dumps_kwargs: Any) -> None:
        """Write ``json.dumps(obj, **dumps_kwargs)`` atomically (:meth:`write_text`)."""
        self.write_text(json.dumps(obj, **dumps_kwargs))

    def stamp(self) -> tuple:
        """An identity of the file's current version (local: inode, mtime, size; remote: size and
        ETag or modification time); FileNotFoundError if absent."""
        if self.is_local:
            st = self.path.stat()
            return (st.st_ino, st.st_mtime_ns, st.st_size)
        fs, path = self._fs()
        info = fs.info(path)
        if info.get("type") == "directory":
            raise FileNotFoundError(f"{self.url} is a directory, not a file.")
        version = info.get("ETag") or info.get("mtime") or info.get("LastModified") or info.get("created")
        return (info.get("size"), str(version))


LocationLike = str | os.PathLike[str] | Location


def as_location(where: LocationLike, storage_options: Mapping[str, Any] | None = None) -> Location:
    """The :class:`Location` of a local path (``~`` expanded, made absolute), a ``file://`` URL
    (a local path) or another fsspec URL with its ``storage_options``.

    A :class:`Location` is returned as it is. Raises ValueError for a protocol fsspec does not
    know and ImportError naming what to install when its implementation is missing.

    >>> as_location("s3://bucket/data.zarr").protocol
    's3'
    >>> as_location("file:///tmp/data.zarr").url
    '/tmp/data.zarr'
    """
    if isinstance(where, Location):
        return where
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise TypeError(f"storage_options must be a dict or None, got {type(storage_options).__name__}.")
    text = os.fspath(where)
    protocol, rest = split_protocol(text) if isinstance(where, str) else (None, text)
    if protocol in (None, "file", "local"):
        return Location(str(Path(rest).expanduser().absolute()))
    _check_protocol(protocol, text)
    return Location(text.rstrip("/"), protocol, dict(storage_options or {}))


def _check_protocol(protocol: str, url: str) -> None:
    """Raise a clear error unless fsspec has a usable filesystem for ``protocol``."""
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise ValueError(f"unknown storage protocol {protocol!r} in {url!r}: give a local path or a URL "
                         f"fsspec knows (s3://, gs://, file://, …).") from None
    except ImportError as exc:
        extra = _EXTRAS.get(protocol)
        package = known_implementations.get(protocol, {}).get("class", "?").split(".")[0]
        how = f"pip install '{extra}'" if extra else f"install the {package!r} package"
        raise ImportError(f"{url!r} needs fsspec's {protocol!r} filesystem, which is not installed ({exc}): "
                          f"{how}.") from None


@contextmanager
def committed_directory(target: Location) -> Iterator[Location]:
    """Yield where to write a directory that replaces ``target`` once complete (module doc).

    Local: a temporary sibling, renamed into place on success. Object stores: ``target``
    itself, emptied first, with :data:`COMPLETE_FILE` written last on success. On error the
    partial directory is deleted.
    """
    if target.is_local:
        with atomic_directory(target.path) as tmp:
            yield as_location(tmp)
        return
    target.remove()
    try:
        yield target
        (target / COMPLETE_FILE).write_json({"complete": True, "time": datetime.now(UTC).isoformat()})
    except BaseException:
        target.remove()
        raise


def is_committed(target: Location) -> bool:
    """Whether a directory committed by :func:`committed_directory` is complete at ``target``:
    it exists (local), or it has its completion marker (object stores)."""
    return target.exists() if target.is_local else (target / COMPLETE_FILE).exists()


def copy_tree(source: Location, target: Location, *, last: tuple[str, ...] = ("zarr.json",)) -> None:
    """Copy every file under ``source`` to ``target`` (across filesystems): completion markers
    after the other files, the files named in ``last`` (relative paths) after all of them. The
    source's own top-level marker and temporary or moved-aside siblings are not copied (the
    caller commits ``target``). Local to local is one ``shutil.copytree`` (the order does not
    matter there: the caller renames the finished copy into place)."""
    if source.is_local and target.is_local:
        def skipped(directory: str, names: list[str]) -> set[str]:
            top = {COMPLETE_FILE} if Path(directory) == source.path else set()
            return _SIBLINGS(directory, names) | (top & set(names))

        shutil.copytree(source.path, target.path, ignore=skipped, dirs_exist_ok=True)
        return
    files = [rel for rel in source.files() if rel != COMPLETE_FILE]
    for rel in sorted(files, key=lambda rel: (rel in last, rel.rsplit("/", 1)[-1] == COMPLETE_FILE)):
        (target / rel).write_bytes((source / rel).read_bytes())
