"""Owner-side files: folders 0700, files 0600, so that no other user of the machine reads them.

Everything computed from private rows that is not DP (dataset stores, work stores, the privacy
ledger, a run's ``owner/`` folder, a non-private model store) is private by file mode. Folders are
created 0700 before anything is written into them, so no file inside is reachable by another
user even for an instant; :func:`make_private` then tightens every file and folder of a tree
(Dask workers write with their own umask). Remote stores (object stores) have no modes: their
access is the bucket's policy.

Examples
--------
>>> import tempfile, stat
>>> d = private_directory(Path(tempfile.mkdtemp()) / "owner")
>>> oct(stat.S_IMODE(d.stat().st_mode))
'0o700'
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["PRIVATE_DIR_MODE", "PRIVATE_FILE_MODE", "private_directory", "make_private"]

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def private_directory(path: str | os.PathLike) -> Path:
    """Create ``path`` (and missing parents, which keep the default mode) with mode 0700, or set
    an existing directory to 0700; returns it as an absolute Path."""
    path = Path(path).expanduser().absolute()
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    os.chmod(path, PRIVATE_DIR_MODE)
    return path


def make_private(path: str | os.PathLike) -> None:
    """Set every folder under ``path`` (itself included) to 0700 and every file to 0600; nothing
    if ``path`` does not exist. Symbolic links are not followed."""
    path = Path(path)
    if not path.exists():
        return
    if path.is_file():
        os.chmod(path, PRIVATE_FILE_MODE)
        return
    os.chmod(path, PRIVATE_DIR_MODE)
    for root, dirs, files in os.walk(path):
        for name in dirs:
            _chmod_if_present(os.path.join(root, name), PRIVATE_DIR_MODE)
        for name in files:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                _chmod_if_present(full, PRIVATE_FILE_MODE)


def _chmod_if_present(path: str, mode: int) -> None:
    """chmod ``path`` (not following a link); an entry removed or renamed since the walk listed
    it (a writer's temporary file, e.g. of a task still running after Ctrl-C) is skipped: it is
    inside a folder already made owner-only."""
    try:
        os.chmod(path, mode, follow_symlinks=False)
    except FileNotFoundError:
        pass
