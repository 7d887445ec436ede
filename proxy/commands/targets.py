"""The new directory `export --out` and `fork --to` write: what is refused, and its parents made.

The directory is built beside the target under a temporary name and renamed into place, so the target
may be missing or an empty directory (the rename replaces it); anything else there (a file, a symlink,
a directory with something in it) is refused with one line, before anything is written. Missing parent
directories are created (as `save_pretrained` and most tools do), only once the command is about to write.
"""

from __future__ import annotations

from pathlib import Path

from ..atomic import make_dirs
from ..errors import EXIT_USAGE, ProxyError


class TargetError(ProxyError):
    """The path given for the new directory (`flag`) cannot be one: bad input, exit 2."""

    code = EXIT_USAGE


def check_new_dir(target: Path, flag: str) -> None:
    """TargetError unless `target` is missing or an empty directory that is not a symlink."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise TargetError(f"{flag} {target} exists and is not a directory; give a new path (nothing was written)")
    if target.is_dir() and any(target.iterdir()):
        raise TargetError(f"{flag} {target} exists and is not empty; give a new path (nothing was written)")
    for parent in target.parents:  # a file where a parent directory would go
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise TargetError(f"{flag} {target}: {parent} is not a directory (nothing was written)")
            break


def make_parents(target: Path, flag: str) -> None:
    """Create `target`'s missing parent directories; TargetError when one cannot be (a full disk stays a
    StorageError, exit 5)."""
    try:
        make_dirs(target.parent)
    except OSError as exc:  # make_dirs raised StorageError for a full disk; this is the path's own fault
        raise TargetError(f"{flag} {target}: cannot create {target.parent}: {exc.strerror or exc}") from None
