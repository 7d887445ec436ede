"""Locks on a run directory: `RUN/.lock` (one proxy per run) and `RUN/.pivot.lock` (one `proxy pivot`).

The run's lock also names the running proxy, so `proxy checkpoint`, `stop` and `pivot` signal it.

Both are an exclusive flock on a file holding the holder's pid, so a waiter
can name who holds it. The descriptor is not inherited by children
(Python's default), so an orphaned engine never keeps a run locked.
"""
from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from ..atomic import storage_guard
from ..errors import ProxyError
from ..safe_fs import NO_FOLLOW, READ_FLAGS, UnsafeFileError, open_own, read_regular
from .layout import LOCK, READ_LIMITS, RunDir, RunDirError

# A lock file is ours: never a symlink, and opening it never blocks (a FIFO there is refused).
LOCK_FLAGS = os.O_RDWR | os.O_CREAT | NO_FOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class LockBusy(Exception):
    """Another process holds the lock; `pid` is the one it wrote (None if unreadable)."""

    def __init__(self, pid: int | None):
        super().__init__(f"held by pid {pid}")
        self.pid = pid


def read_pid(path: Path) -> int | None:
    try:
        text = read_regular(path, READ_LIMITS[LOCK]).decode("ascii").strip()
        return int(text) if text else None
    except (OSError, ValueError):  # UnsafeFileError and UnicodeDecodeError are ValueErrors
        return None


class PidLock:
    """An exclusive, non-blocking flock on `path`, which holds our pid while we hold it."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def acquire(self) -> "PidLock":
        with storage_guard(self.path, "open"):
            fd = open_own(self.path, LOCK_FLAGS, "a lock file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise LockBusy(read_pid(self.path)) from None
            raise
        try:
            with storage_guard(self.path):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.ftruncate(self.fd, 0)
            except OSError:
                pass
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def __enter__(self) -> "PidLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class RunLock(PidLock):
    """One proxy per run directory: RUN/.lock."""

    def __init__(self, run: RunDir):
        super().__init__(run.lock_file)
        self.run = run

    def acquire(self) -> "RunLock":
        try:
            super().acquire()
        except LockBusy as busy:
            who = f"proxy pid {busy.pid}" if busy.pid else "another proxy"
            raise RunDirError(f"run directory {self.run.root} is in use by {who} "
                              f"(one proxy per run; `proxy stop --run-dir {self.run.root}` stops it)") from None
        except UnsafeFileError as exc:
            raise RunDirError(str(exc)) from None
        except OSError as exc:
            raise RunDirError(f"cannot open {self.path}: {exc.strerror}") from None
        return self


def lock_owner(run: RunDir) -> int | None:
    """The pid of the proxy holding the run's lock (-1 if it wrote none), or None when no proxy holds it."""
    try:
        fd = open_own(run.lock_file, READ_FLAGS | NO_FOLLOW, "a lock file")
    except (OSError, UnsafeFileError):  # no lock file, or not one: no proxy can hold it
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return read_pid(run.lock_file) or -1  # held
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def signal_proxy(run: RunDir, signum: int) -> int:
    """Send signum to the proxy holding run's lock; return its pid."""
    pid = lock_owner(run)
    if pid is None:
        raise ProxyError(f"no proxy is running for {run.root}")
    if pid <= 0:
        raise ProxyError(f"{run.lock_file} is locked but holds no pid")
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        raise ProxyError(f"proxy pid {pid} for {run.root} is gone") from None
    return pid
