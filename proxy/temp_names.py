"""The temporary files and directories the proxy creates: their names, their exclusive creation, and the
removal of those a killed process left behind.

A temp name is made from the name of what it will become (`target`), this
process's pid and 16 random hex digits, so no one can predict it:

    .<target>.<pid>.<random>.tmp        a file, renamed over <target> when whole (atomic.py)
    .<target>.<kind>-<pid>-<random>     a directory (DIR_KINDS): the data freeze's `tmp` and `old`, a
                                        fork's, an export's, a pivot archive's `tmp`

Each is created exclusively (O_CREAT|O_EXCL|O_NOFOLLOW for a file, mkdir(2)
for a directory; relative to a directory descriptor when the caller has one):
a name that something already holds (a planted symlink, file or directory) is
never reused, written through or followed; another random name is tried.

A process killed with SIGKILL leaves its temp behind. `remove_leftovers` removes
the entries of one directory that match these patterns (and the older names
without the random part, `.<target>.<pid>.tmp`, `.<target>.<kind>-<pid>`)
whose pid is no live process, or is this process (called before it creates a
temp of its own there). What is removed is what lstat finds: a symlink is
unlinked itself, a directory is removed by shutil.rmtree, which never follows
a symlink inside it. The engine's `.step_NNNNNN.bin.tmp` match neither pattern
(the engine removes its own at start), nor does the data cache's
`.tmp-<key>-<pid>-<ns>` (data/prepare.py removes those).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
from pathlib import Path

import psutil

from .safe_fs import NO_FOLLOW

# A file the proxy creates (a temp file, a file in a fresh directory): new, never through a symlink a
# user or another process left under its name.
NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NO_FOLLOW | getattr(os, "O_CLOEXEC", 0)
NAME_TRIES = 100  # random names tried before giving up (a collision of 64 random bits: never by chance)

DATA_TMP, DATA_OLD, FORK, EXPORT, ARCHIVE_TMP = "tmp", "old", "fork", "export", "tmp"
DIR_KINDS = (DATA_TMP, DATA_OLD, FORK, EXPORT)

FILE_PATTERN = re.compile(r"^\.(?P<target>.+)\.(?P<pid>[0-9]{1,10})(?:\.[0-9a-f]{16})?\.tmp$", re.S)
DIR_PATTERN = re.compile(
    r"^\.(?P<target>.+)\.(?P<kind>" + "|".join(DIR_KINDS) + r")-(?P<pid>[0-9]{1,10})(?:-[0-9a-f]{16})?$", re.S
)


def _random() -> str:
    return secrets.token_hex(8)


def file_name(target: str) -> str:
    return f".{target}.{os.getpid()}.{_random()}.tmp"


def dir_name(target: str, kind: str) -> str:
    assert kind in DIR_KINDS, kind
    return f".{target}.{kind}-{os.getpid()}-{_random()}"


def create_file(directory: str | os.PathLike, target: str, dir_fd: int | None = None) -> tuple[int, str]:
    """A new temp file for `target` in `directory` (or in the directory `dir_fd` is open on, when given):
    (a descriptor open for writing, its name)."""
    for _ in range(NAME_TRIES):
        name = file_name(target)
        try:
            if dir_fd is not None:
                return os.open(name, NEW_FLAGS, 0o644, dir_fd=dir_fd), name
            return os.open(Path(directory) / name, NEW_FLAGS, 0o644), name
        except FileExistsError:
            continue
    raise FileExistsError(f"{Path(directory) / file_name(target)}: {NAME_TRIES} temp names taken")


def make_dir(directory: str | os.PathLike, target: str, kind: str) -> Path:
    """A new, empty temp directory for `target` in `directory` (mkdir(2) fails on any name already there,
    a dangling symlink included, so nothing planted is reused)."""
    for _ in range(NAME_TRIES):
        path = Path(directory) / dir_name(target, kind)
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{Path(directory) / dir_name(target, kind)}: {NAME_TRIES} temp names taken")


def is_temp(name: str) -> bool:
    """Whether `name` is one of the temp names above (a file's or a directory's)."""
    return bool(FILE_PATTERN.match(name) or DIR_PATTERN.match(name))


def _pid(name: str, kinds: tuple[str, ...] | None) -> int | None:
    """The pid in a temp name (of a directory of one of `kinds`, when given), or None."""
    match = DIR_PATTERN.match(name) if kinds is not None else FILE_PATTERN.match(name) or DIR_PATTERN.match(name)
    if match is None or (kinds is not None and match["kind"] not in kinds):
        return None
    return int(match["pid"])


def _stale(pid: int) -> bool:
    """Whether a temp of `pid` can be no live writer's: its process is gone, or it is this process (which
    has created none in the directory yet)."""
    return pid == os.getpid() or not psutil.pid_exists(pid)


def remove_entry(path: Path) -> bool:
    """Remove what lstat finds at `path`: a directory with rmtree (which follows no symlink), anything else
    (a symlink included: the link itself) with unlink. Whether it is gone."""
    try:
        mode = os.lstat(path).st_mode
        if stat.S_ISDIR(mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:  # a read-only file system, a directory we may not write: left, nothing else touched
        return False


def remove_leftovers(directory: str | os.PathLike, kinds: tuple[str, ...] | None = None) -> list[str]:
    """Remove the temp entries of `directory` (not below it) that no live process of the proxy is writing;
    the names removed. With `kinds`, only temp directories of those kinds (in a directory that is not a
    run's, such as the one a fork or an export is made in). A directory that is absent, a symlink or
    unreadable: nothing is done."""
    directory = Path(directory)
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return []
        names = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for name in names:
        pid = _pid(name, kinds)
        if pid is not None and _stale(pid) and remove_entry(directory / name):
            removed.append(name)
    return sorted(removed)
