"""Locks on a run directory: the run itself (one proxy per run) and RUN/.pivot.lock (one `proxy pivot`).

Both are an exclusive flock(2) the kernel holds on an open descriptor and
drops when the process dies. The run's lock is taken on the run directory's
own descriptor, not on a file in it: deleting, replacing or rewriting any
file of the run cannot release it or admit a second proxy. The descriptors
are close-on-exec and never passed to a child, so an orphaned engine never
keeps a run locked.

Who holds a lock is asked of the kernel (proxy/processes.py: /proc/locks, then
the holder's own fdinfo), never read from a file of the run; whether that
holder is the proxy of this run is proven from the kernel's view of it too
(rundir/lock_holder.py), so `proxy checkpoint`, `stop` and `pivot` signal only
a proxy of this very directory, and `status` shows no other holder as one.

The running proxy also checks that the path it was given still leads to the
directory it locked (`RunLock.check`): a run directory moved away or
replaced under it stops the run, since a file written by path from then on
would land in whatever now has that name. The run's own files (`.state.json`
and the others directly in it) are replaced relative to the locked
directory's descriptor meanwhile (atomic.py's anchor), so one written in the
instant of the move still lands in the run.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time

import psutil

from ..atomic import anchor, storage_guard, unanchor
from ..errors import EXIT_FAILURE, ProxyError
from ..processes import FileIdentity, flock_holder, send
from ..safe_fs import NO_FOLLOW, UnsafeFileError, open_own
from .layout import RunDir, RunDirError
from .lock_holder import Holder, RunningProxy, holder_of

# A lock file is ours: never a symlink, and opening it never blocks (a FIFO there is refused).
LOCK_FLAGS = os.O_RDWR | os.O_CREAT | NO_FOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
BUSY_TRIES, BUSY_WAIT_S = 5, 0.05  # a lock held by no exclusive holder (a look by `proxy status`) is retried


class LockBusy(Exception):
    """Another process holds the lock; `holder` is it, as the kernel names it (None: not identified)."""

    def __init__(self, holder: psutil.Process | None):
        super().__init__(f"held by pid {holder.pid}" if holder else "held")
        self.holder = holder


class RunInUse(RunDirError):
    """The run directory cannot be locked: another proxy holds it, or the lock itself failed (exit 1, a
    runtime failure, not bad input)."""

    code = EXIT_FAILURE


class PivotInFlight(ProxyError):
    """Another `proxy pivot` of the run holds RUN/.pivot.lock (exit 1: the user waits and tries again)."""


class RunDirReplaced(ProxyError):
    """The run directory's path no longer leads to the directory this proxy locked."""


class KernelLock:
    """An exclusive, non-blocking flock on a directory (`directory=True`) or on a lock file."""

    def __init__(self, path: str | os.PathLike, directory: bool = False) -> None:
        self.path = path
        self.directory = directory
        self.fd: int | None = None
        self.identity: FileIdentity | None = None

    def _open(self) -> int:
        if self.directory:
            return os.open(self.path, DIR_FLAGS)
        with storage_guard(self.path, "open"):
            return open_own(self.path, LOCK_FLAGS, "a lock file")

    def acquire(self) -> KernelLock:
        fd = self._open()
        try:
            for attempt in range(BUSY_TRIES):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise
                    holder = flock_holder(FileIdentity.of_fd(fd))
                    if holder is not None or attempt == BUSY_TRIES - 1:
                        raise LockBusy(holder) from None
                    time.sleep(BUSY_WAIT_S)  # a shared lock of `proxy status` looking: it lets go at once
        except BaseException:
            os.close(fd)
            raise
        self.fd, self.identity = fd, FileIdentity.of_fd(fd)
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def __enter__(self) -> KernelLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class RunLock(KernelLock):
    """One proxy per run directory: the flock on RUN itself."""

    def __init__(self, run: RunDir):
        super().__init__(run.root, directory=True)
        self.run = run

    def acquire(self) -> RunLock:
        try:
            super().acquire()
        except LockBusy as busy:
            try:
                here = FileIdentity.of(self.run.root)
            except OSError:
                here = None
            holder = holder_of(busy.holder, here, _parent(self.run))
            how = (
                f"one proxy per run; `proxy stop --run-dir {self.run.root}` stops it"
                if holder.is_proxy
                else "nothing was signalled; the run can start once that process lets go"
            )
            raise RunInUse(f"run directory {self.run.root} is in use by {holder.describe()} ({how})") from None
        except OSError as exc:
            raise RunInUse(f"cannot lock run directory {self.run.root}: {exc.strerror}") from None
        if self.fd is not None:  # (acquired: always) the run's own files are replaced in the directory locked
            anchor(self.run.root, self.fd)
        return self

    def release(self) -> None:
        if self.fd is not None:
            unanchor(self.run.root)
        super().release()

    def check(self) -> None:
        """RunDirReplaced (one line) when the run directory's path no longer leads to the locked directory."""
        try:
            now = FileIdentity.of(self.run.root)
        except OSError:
            now = None
        if now != self.identity:
            where = "is gone" if now is None else f"is now another directory ({now}, locked {self.identity})"
            raise RunDirReplaced(
                f"run directory {self.run.root} {where}: it was moved or replaced while this proxy "
                "ran; stopping without writing there (the engine is killed: its checkpoints "
                "would land in whatever now has that name)"
            )


class PivotLock(KernelLock):
    """One `proxy pivot` at a time: RUN/.pivot.lock."""

    def __init__(self, run: RunDir):
        super().__init__(run.pivot_lock)

    def acquire(self) -> PivotLock:
        try:
            super().acquire()
        except LockBusy as busy:
            who = f"pid {busy.holder.pid}" if busy.holder else "another process"
            raise PivotInFlight(
                f"another pivot of this run is in flight ({who}); wait for it to finish, then try again"
            ) from None
        except UnsafeFileError as exc:
            raise RunDirError(str(exc)) from None
        return self


def _parent(run: RunDir) -> FileIdentity | None:
    try:
        return FileIdentity.of(os.path.join(run.root, os.pardir))
    except OSError:
        return None


def run_lock_holder(run: RunDir) -> Holder | None:
    """Who holds the run's lock: None when no process does; otherwise a Holder, proven the run's proxy or
    not (lock_holder.py; its process None when the kernel names none this user can see). Only looks: the
    lock is never taken here."""
    try:
        fd = os.open(run.root, DIR_FLAGS)
    except OSError:  # no such directory: no proxy can hold it
        return None
    try:
        identity = FileIdentity.of_fd(fd)
        holder = flock_holder(identity)
        if holder is None:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:  # held, by a process the kernel did not name a moment ago
                holder = flock_holder(identity)
                return holder_of(holder, identity, _parent(run))
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        return holder_of(holder, identity, _parent(run))
    finally:
        os.close(fd)


def running_proxy(run: RunDir, nothing_done: str) -> RunningProxy:
    """The proxy of this run holding its lock, proven (lock_holder.py); ProxyError, one line ending in
    `nothing_done`, when no process holds it, the kernel names none, or the holder is no proxy of this run."""
    holder = run_lock_holder(run)
    if holder is None:
        raise ProxyError(f"no proxy is running for {run.root}")
    if holder.process is None:
        raise ProxyError(
            f"{run.root} is locked, but the kernel names no process this user can see holding its lock; {nothing_done}"
        )
    if not holder.is_proxy:
        raise ProxyError(f"{run.root} is locked by {holder.describe()}; {nothing_done}")
    return RunningProxy(holder.process)


def signal_proxy(run: RunDir, signum: int) -> int:
    """Send signum to the proxy holding run's lock, once proven this run's proxy; return its pid."""
    holder = running_proxy(run, "nothing was signalled")
    if not send(holder.process, signum):
        raise ProxyError(f"proxy pid {holder.pid} for {run.root} is gone")
    return holder.pid
