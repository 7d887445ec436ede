"""Every write the proxy makes: atomic, durable replacement, whole-line appends, and what a failure becomes.

A reader of `path` sees either the old complete file or the new complete
file, never a mix, and after return the new file survives a power cut:
temp file in the same directory, write, fsync, rename over `path`, fsync the
directory. An append (`.loss.json`, engine.log) lands whole or not at all: a
write that fails partway is cut back off, so no torn line is left.

A write that fails because of the storage (disk full, file too large, I/O
error, read-only file system: errors.STORAGE_ERRNOS) raises StorageError,
one line naming the file; no temp file is left behind.

Temp files and directories are named and created by temp_names.py: exclusively,
under names no one can predict, so nothing planted under a temp name is followed.

A directory can be *anchored* to a descriptor of it (the run's lock holds one:
rundir/lock.py): a replacing write of a file directly in it then creates,
renames and syncs relative to that descriptor, so it lands in the directory
the descriptor names even if the path was moved or replaced meanwhile.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from . import temp_names
from .errors import STORAGE_ERRNOS, StorageError
from .safe_fs import NO_FOLLOW, open_own, open_regular
from .temp_names import NEW_FLAGS

APPEND_FLAGS = (
    os.O_RDWR | os.O_APPEND | os.O_CREAT | NO_FOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
)
UNIQUE_TRIES = 1000  # write_unique's names: stem, stem_2, ... stem_1000


@contextmanager
def storage_guard(path: str | os.PathLike, action: str = "write") -> Iterator[None]:
    """Turn an OSError the storage caused (errors.STORAGE_ERRNOS) into StorageError naming `path`."""
    try:
        yield
    except OSError as exc:
        if exc.errno in STORAGE_ERRNOS:
            raise StorageError(path, exc, action) from None
        raise


def fsync_dir(directory: str | os.PathLike) -> None:
    """fsync a directory so that a rename or a new name in it is durable."""
    with storage_guard(directory, "sync"):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def make_dirs(directory: str | os.PathLike) -> None:
    """mkdir -p, with a full or read-only disk reported as StorageError."""
    with storage_guard(directory, "create"):
        Path(directory).mkdir(parents=True, exist_ok=True)


_ANCHORS: dict[str, int] = {}  # a directory's path, as its files' paths name it -> a descriptor of it


def anchor(directory: str | os.PathLike, fd: int) -> None:
    """From now on, replacing writes of files in `directory` go through `fd` (a descriptor of it)."""
    _ANCHORS[str(Path(directory))] = fd


def unanchor(directory: str | os.PathLike) -> None:
    _ANCHORS.pop(str(Path(directory)), None)


def _create_new(path: str | os.PathLike) -> BinaryIO:
    """`path` created for writing: a new file (O_EXCL), so no symlink or file left there is written through."""
    return os.fdopen(os.open(path, NEW_FLAGS, 0o644), "wb")


def _unlink(name: str | os.PathLike, dir_fd: int | None = None) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:  # gone already, or a read-only file system: nothing was written there either
        pass


@contextmanager
def _temp_writer(path: Path, dir_fd: int | None) -> Iterator[BinaryIO]:
    """A new temp file beside `path` (temp_names.py: a name no one can predict, created exclusively),
    written in the block, fsynced, renamed over `path`; removed if anything fails. With `dir_fd` (an
    anchored directory) every step is relative to that descriptor."""
    with storage_guard(path):
        fd, name = temp_names.create_file(path.parent, path.name, dir_fd)
    tmp = name if dir_fd is not None else path.parent / name
    try:
        with storage_guard(path):
            with os.fdopen(fd, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            if dir_fd is not None:
                os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            else:
                os.replace(tmp, path)
    except BaseException:
        _unlink(tmp, dir_fd)
        raise
    if dir_fd is not None:
        with storage_guard(path.parent, "sync"):
            os.fsync(dir_fd)
    else:
        fsync_dir(path.parent)


@contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file that replaces `path` atomically and durably when the block ends without an error.
    A `path` that is a symlink is replaced (the link itself), never written through."""
    path = Path(path)
    with _temp_writer(path, _ANCHORS.get(str(path.parent))) as f:
        yield f


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace `path` with `data` atomically and durably."""
    with atomic_writer(path) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def json_bytes(obj: object, indent: int | None = 1) -> bytes:
    """How the proxy writes a JSON file: indented, newline-terminated, no NaN."""
    return (json.dumps(obj, indent=indent, allow_nan=False) + "\n").encode("utf-8")


def atomic_write_json(path: str | os.PathLike, obj: object, indent: int | None = 1) -> None:
    """Replace `path` with `obj` as JSON (newline-terminated) atomically and durably."""
    atomic_write_bytes(path, json_bytes(obj, indent))


def _source(src: str | os.PathLike) -> BinaryIO:
    """A file to copy: regular, reached through no symlink out of its own directory (safe_fs.py)."""
    return open_regular(src, None, within=Path(src).parent)


def atomic_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copy `src` over `dst` atomically and durably (dst appears whole or not at all)."""
    with _source(src) as fin, atomic_writer(dst) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)


def write_synced(path: str | os.PathLike, data: bytes) -> None:
    """Write a new file and fsync it: for files inside a temp directory that is renamed into place whole.
    A name already there is an error (FileExistsError), never overwritten or written through."""
    with storage_guard(path):
        with _create_new(path) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def copy_synced(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copy `src` to a new file `dst` and fsync it (see write_synced)."""
    with _source(src) as fin, storage_guard(dst), _create_new(dst) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
        fout.flush()
        os.fsync(fout.fileno())


def write_new(path: str | os.PathLike, data: bytes) -> None:
    """Create `path` holding `data`, whole and durable, never replacing what has that name: a temp file is
    written and fsynced, then hard-linked to `path` (link(2) fails with FileExistsError when the name is
    taken), then removed; the directory is fsynced."""
    path = Path(path)
    with storage_guard(path):
        fd, name = temp_names.create_file(path.parent, path.name)
    tmp = path.parent / name
    try:
        with storage_guard(path):
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, path)
    finally:
        _unlink(tmp)
    fsync_dir(path.parent)


def write_unique(directory: str | os.PathLike, stem: str, suffix: str, data: bytes) -> Path:
    """write_new under the first free name of `stem + suffix`, `stem_2 + suffix`, `stem_3 + suffix`, ...
    (two writers in the same second never collide, and neither replaces the other); the name used."""
    for n in range(1, UNIQUE_TRIES + 1):
        path = Path(directory) / (f"{stem}{suffix}" if n == 1 else f"{stem}_{n}{suffix}")
        try:
            write_new(path, data)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{Path(directory) / stem}: {UNIQUE_TRIES} names taken")


def open_append(path: str | os.PathLike) -> int:
    """A log file's descriptor for appending (created if absent): a regular file only, never a symlink,
    a FIFO or a device (UnsafeFileError), and opening it never blocks."""
    with storage_guard(path, "open"):
        return open_own(path, APPEND_FLAGS, "a log")


def append_whole(fd: int, data: bytes, path: str | os.PathLike) -> None:
    """Append `data` (whole lines) to the file open on `fd` (O_APPEND), whole or not at all: a write
    that fails partway is cut back off before StorageError (or the OSError) is raised."""
    start = os.fstat(fd).st_size
    view = memoryview(data)
    try:
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except OSError as exc:
        try:
            os.ftruncate(fd, start)
        except OSError:
            pass
        if exc.errno in STORAGE_ERRNOS:
            raise StorageError(path, exc, "append to") from None
        raise


def overwrite_in_place(path: str | os.PathLike, data: bytes) -> bool:
    """Write `data` over `path` in place, only when it fits in the blocks the file already holds (on a
    full disk no new block can be had). Not atomic: for a snapshot its readers never trust (.state.json),
    and only when an atomic replace cannot be made. Returns whether it was written."""
    try:
        fd = os.open(path, os.O_WRONLY | NO_FOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or len(data) > st.st_blocks * 512:
            return False
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def sync_fd(fd: int, path: str | os.PathLike) -> None:
    """fsync an open file (an append-only log), a storage failure reported as StorageError."""
    with storage_guard(path, "sync"):
        os.fsync(fd)
