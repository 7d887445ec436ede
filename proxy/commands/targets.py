"""The new directory `export --out` and `fork --to` write: what is refused, and its parents made.

The directory is built beside the target under a temporary name and renamed into place, so the target
may be missing or an empty directory (the rename replaces it); anything else there (a file, a symlink,
a directory with something in it) is refused with one line, before anything is written. Missing parent
directories are created (as `save_pretrained` and most tools do), only once the command is about to write.
"""
from __future__ import annotations

from pathlib import Path

from ..atomic import make_dirs
from ..errors import EXIT_USAGE, ProxyError, StorageError


def check_new_dir(target: Path, flag: str) -> None:
    """ProxyError (exit 2) unless `target` is missing or an empty directory that is not a symlink."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise ProxyError(f"{flag} {target} exists and is not a directory; give a new path (nothing was written)",
                         EXIT_USAGE)
    if target.is_dir() and any(target.iterdir()):
        raise ProxyError(f"{flag} {target} exists and is not empty; give a new path (nothing was written)",
                         EXIT_USAGE)
    for parent in target.parents:  # a file where a parent directory would go
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise ProxyError(f"{flag} {target}: {parent} is not a directory (nothing was written)", EXIT_USAGE)
            break


def make_parents(target: Path, flag: str) -> None:
    """Create `target`'s missing parent directories (a full disk stays a StorageError, exit 5)."""
    try:
        make_dirs(target.parent)
    except StorageError:
        raise
    except OSError as exc:
        raise ProxyError(f"{flag} {target}: cannot create {target.parent}: {exc.strerror or exc}", EXIT_USAGE) \
            from None
