"""Reading files that a user or another process may have replaced: regular files only, size-capped.

Every file the proxy reads from a run directory or the command line, and every
file the dashboard reads, is opened here. A run directory is not trusted: a
name there may have been replaced by a symlink to /dev/zero (read without end),
a FIFO (an open that never returns) or a huge file. So an open here

- never blocks (O_NONBLOCK: a FIFO opens at once and is then refused),
- accepts only a regular file (after fstat, so what is checked is what is read),
- refuses a file larger than the cap its kind allows (rundir/layout.py's
  READ_LIMITS, config files' CONFIG_FILE_LIMIT), and
- given the directory that holds it (`within`), refuses a name whose symlinks
  lead out of that directory.

Anything refused raises UnsafeFileError, whose message is one line naming the
file and why; an absent file raises FileNotFoundError as open() does.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from typing import BinaryIO

from .errors import EXIT_USAGE
from .stop_signals import held

READ_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symlink"),
)


class UnsafeFileError(ValueError):
    """A file that is not read: not a regular file, too large, or reached through a symlink out of its
    directory. The message is one line, `<path>: <reason>`. Not a ProxyError (the dashboard and every
    reader share it, and some readers take it as a ValueError), but it carries its exit code as one."""

    code = EXIT_USAGE

    def __init__(self, path: str | os.PathLike, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def file_kind(mode: int) -> str:
    """What a stat mode is, in words ("a FIFO", "a character device", ...)."""
    for test, words in _KINDS:
        if test(mode):
            return words
    return "not a regular file"


NO_SUCH_FILE = "no such file"  # regular_file_problem's answer for a path that does not exist


def regular_file_problem(path: str | os.PathLike) -> str | None:
    """None when `path` (symlinks followed) is a regular file; else why it is not, in words, for a message
    about a file that was asked for: "no such file", "a FIFO, not a regular file", a stat error."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return NO_SUCH_FILE
    except OSError as exc:
        return exc.strerror or str(exc)
    return None if stat.S_ISREG(st.st_mode) else f"{file_kind(st.st_mode)}, not a regular file"


def inside(path: str | os.PathLike, within: str | os.PathLike) -> bool:
    """Whether `path`, with every symlink followed, is `within` or below it."""
    real, base = os.path.realpath(path), os.path.realpath(within)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def open_fd(path: str | os.PathLike, flags: int, limit: int | None) -> BinaryIO:
    """open(2) `path` with `flags`, then require a regular file of at most `limit` bytes (None: any size).

    The descriptor is made and handed to its file object while the stop signals wait (their handler
    raises wherever it lands): from then on only the file object closes it. A descriptor closed by hand
    and again by a file object closes whatever file has reused the number meanwhile."""
    with held():
        f = open(path, "rb", opener=lambda p, _mode: os.open(p, flags))
    try:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(path, f"{file_kind(st.st_mode)}, not a regular file; not read")
        if limit is not None and st.st_size > limit:
            raise UnsafeFileError(path, f"{st.st_size} bytes, more than the {limit} such a file may have; not read")
        return f
    except BaseException:
        f.close()
        raise


def open_own(path: str | os.PathLike, flags: int, role: str) -> int:
    """A descriptor on a file the proxy writes to itself (a log, a lock), opened with `flags` (which hold
    O_NOFOLLOW, and O_NONBLOCK so that a FIFO never blocks): a regular file, else UnsafeFileError naming
    `role` ("a log", "a lock file")."""
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFileError(path, f"a symlink, not {role}") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UnsafeFileError(path, f"{file_kind(mode)}, not {role}")
    return fd


def open_regular(path: str | os.PathLike, limit: int | None, within: str | os.PathLike | None = None) -> BinaryIO:
    """`path` opened for binary reading: a regular file of at most `limit` bytes; with `within`, reached
    only through symlinks that stay inside that directory."""
    if within is not None and not inside(path, within):
        raise UnsafeFileError(path, f"a symlink out of {within}; not read")
    return open_fd(path, READ_FLAGS, limit)


def read_regular(path: str | os.PathLike, limit: int | None, within: str | os.PathLike | None = None) -> bytes:
    """The whole content of `path` (see open_regular)."""
    with open_regular(path, limit, within) as f:
        data = f.read(limit + 1 if limit is not None else -1)
    if limit is not None and len(data) > limit:  # it grew after fstat
        raise UnsafeFileError(path, f"more than the {limit} bytes such a file may have; not read")
    return data


def file_sha256(path: str | os.PathLike, within: str | os.PathLike | None = None) -> tuple[int, str]:
    """(size, SHA-256 hex digest) of a regular file (see open_regular), read in 1 MiB pieces."""
    h, size = hashlib.sha256(), 0
    with open_regular(path, None, within) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def capped_lines(f: BinaryIO, max_line: int, start: int = 0) -> Iterator[tuple[int, bytes]]:
    """(offset, line) for every line of `f` from byte `start` (the last may lack its newline); a line
    longer than `max_line` bytes is skipped whole, read in pieces, so memory stays bounded."""
    f.seek(start)
    offset = start
    while True:
        line = f.readline(max_line + 1)
        if not line:
            return
        if len(line) > max_line and not line.endswith(b"\n"):
            skipped = len(line)
            while line and not line.endswith(b"\n"):
                line = f.readline(1 << 20)
                skipped += len(line)
            offset += skipped
            continue
        yield offset, line
        offset += len(line)
