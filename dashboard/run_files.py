"""The only way the dashboard touches the file system: fixed names inside a run directory.

Names come from this package's code, never from a URL. Even so, every open
refuses a name with a path separator or a dot-dot, a symlink (O_NOFOLLOW: the
dashboard is stricter than the proxy, which follows a symlink that stays in
the run), and anything that is not a regular file (a FIFO would block the
server): the checks are proxy/safe_fs.py's, shared with the proxy. No request
can make the server read outside the run directories it was given.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from proxy.safe_fs import NO_FOLLOW, READ_FLAGS, UnsafeFileError, open_fd

_FLAGS = READ_FLAGS | NO_FOLLOW


def _check_name(name: str) -> None:
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in name or "\0" in name:
        raise ValueError(f"not a plain relative name: {name!r}")


def open_in_root(root: Path, name: str) -> BinaryIO | None:
    """`root/name` opened for binary reading, or None if absent, a symlink or not a regular file.

    `name` may have one directory level ("checkpoints/x"); that directory must not be a symlink.
    """
    _check_name(name)
    parts = name.split("/")
    try:
        for i in range(1, len(parts)):
            st = os.lstat(os.path.join(root, *parts[:i]))
            if not stat.S_ISDIR(st.st_mode):
                return None
        return open_fd(os.path.join(root, name), _FLAGS, None)
    except (OSError, UnsafeFileError):
        return None


def read_small(root: Path, name: str, limit: int) -> bytes | None:
    """Whole content of `root/name` if it is at most `limit` bytes, else None."""
    f = open_in_root(root, name)
    if f is None:
        return None
    with f:
        data = f.read(limit + 1)
    return data if len(data) <= limit else None


def scan_dir(root: Path, name: str) -> list[os.DirEntry]:
    """Entries of the real (not symlinked) directory `root/name`; [] if absent."""
    _check_name(name)
    path = os.path.join(root, name)
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return []
        with os.scandir(path) as it:
            return list(it)
    except OSError:
        return []


def stat_sig(root: Path, name: str) -> tuple | None:
    """(inode, size, mtime_ns) of `root/name` without following a symlink; None if absent."""
    _check_name(name)
    try:
        st = os.lstat(os.path.join(root, name))
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)
