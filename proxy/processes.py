"""Signals to other processes, only once the kernel has shown they are the ones meant.

A run directory is not trusted (docs/ARCHITECTURE.md, "The run directory"): a
pid written in a file may be forged, stale, or copied along with the
directory, and `kill(-1, ...)` or `killpg(1, ...)` would reach every process
the user owns. So the proxy signals a process only through this module:

- `signal_group` and `signal_process` refuse any pid <= 1, whatever the caller
  proved;
- a lock's holder is read from the kernel (`/proc/locks`, then the holder's
  own `/proc/PID/fdinfo`, which names the open file that holds the lock),
  never from a file of the run;
- `send` signals a psutil.Process, which checks that the pid still belongs to
  the process started at the time it was looked up (a pid reused meanwhile
  raises NoSuchProcess instead of being signalled).
"""

from __future__ import annotations

import os
import select
from typing import NamedTuple

import psutil

PROC = "/proc"


class FileIdentity(NamedTuple):
    """A file or directory as the kernel knows it: its device and inode."""

    dev: int
    ino: int

    @classmethod
    def of(cls, path: str | os.PathLike, follow: bool = True) -> FileIdentity:
        st = os.stat(path, follow_symlinks=follow)
        return cls(st.st_dev, st.st_ino)

    @classmethod
    def of_fd(cls, fd: int) -> FileIdentity:
        st = os.fstat(fd)
        return cls(st.st_dev, st.st_ino)

    def __str__(self) -> str:
        return f"{os.major(self.dev)}:{os.minor(self.dev)}:{self.ino}"


class RefusedSignal(Exception):
    """A signal this module will not send (a pid <= 1); the message is one line."""


def _checked_pid(pid: object) -> int:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        raise RefusedSignal(f"refusing to signal pid {pid!r}: only a process id > 1 is ever signalled")
    return pid


def signal_group(pid: int, sig: int) -> bool:
    """Send `sig` to the process group `pid` leads (the caller proved it is ours). False if it is gone."""
    try:
        os.killpg(_checked_pid(pid), sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def send(process: psutil.Process, sig: int) -> bool:
    """Send `sig` to a process looked up earlier, unless its pid now belongs to another (psutil compares
    the start time). False if it is gone."""
    _checked_pid(process.pid)
    try:
        process.send_signal(sig)
        return True
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False


def lock_candidates(target: FileIdentity) -> list[int]:
    """Pids /proc/locks lists with an exclusive flock on `target` (pids outside our pid namespace show as
    0 or -1 and are left out). An unreadable /proc/locks gives none."""
    major, minor = os.major(target.dev), os.minor(target.dev)
    pids = []
    try:
        with open(f"{PROC}/locks", encoding="ascii", errors="replace") as f:
            lines = f.read(1 << 22).splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split()
        if len(parts) < 6 or parts[1] == "->" or parts[1] != "FLOCK" or parts[3] != "WRITE":
            continue
        try:
            pid = int(parts[4])
            maj, mnr, ino = parts[5].split(":")
            if (int(maj, 16), int(mnr, 16), int(ino)) == (major, minor, target.ino) and pid > 1:
                pids.append(pid)
        except ValueError:
            continue
    return pids


def holds_flock(pid: int, target: FileIdentity) -> bool:
    """Whether process `pid` has a descriptor open on `target` whose open file holds an exclusive flock
    (its /proc/PID/fdinfo says so: the kernel's word, not a file's)."""
    try:
        fds = os.listdir(f"{PROC}/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if FileIdentity.of(f"{PROC}/{pid}/fd/{fd}") != target:
                continue
            with open(f"{PROC}/{pid}/fdinfo/{fd}", encoding="ascii", errors="replace") as f:
                info = f.read(1 << 16)
        except OSError:
            continue
        for line in info.splitlines():
            words = line.split()
            if words[:1] == ["lock:"] and "FLOCK" in words and "WRITE" in words:
                return True
    return False


def flock_holder(target: FileIdentity) -> psutil.Process | None:
    """The process holding an exclusive flock on `target`, found through the kernel and checked there
    (None when no process this user can see holds one)."""
    for pid in lock_candidates(target):
        try:
            process = psutil.Process(pid)
            process.create_time()  # fixed now: a later send() refuses a pid reused since
        except psutil.Error:
            continue
        if holds_flock(pid, target):
            return process
    return None


def same_command(cmdline: list[str], argv: list[str]) -> bool:
    """Whether a live process's command line is `argv` as launched. A script's interpreter comes first
    (the kernel puts it before the script's path for a `#!` line), so the command line ends with argv."""
    return bool(argv) and len(cmdline) >= len(argv) and cmdline[len(cmdline) - len(argv) :] == argv


def group_leader(pid: int) -> bool:
    """Whether `pid` leads its own process group (the engine is started in a session of its own)."""
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def identity_seen_by(pid: int, path: str) -> FileIdentity | None:
    """The file `path` names for process `pid`, as that process would open it: a relative path from its
    working directory, an absolute one from its root (the kernel's /proc/PID/cwd and /proc/PID/root, never
    our own). None when it names nothing or the process cannot be inspected."""
    base = f"{PROC}/{pid}/cwd" if not os.path.isabs(path) else f"{PROC}/{pid}/root"
    try:
        return FileIdentity.of(base + "/" + path.lstrip("/"))
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return None


def cpu_seconds(process: psutil.Process) -> float | None:
    """User plus system CPU time of `process` (all its threads) and of its live descendants; None when it
    is gone or cannot be inspected. A descendant that exits meanwhile is left out, so the sum can step
    back: callers compare it with a margin."""
    try:
        family = [process, *process.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for member in family:
        try:
            times = member.cpu_times()
        except psutil.Error:
            if member is process:
                return None
            continue
        total += times.user + times.system
    return total


def open_pidfd(pid: int) -> int | None:
    """A pidfd for `pid` (Linux 5.3+): it keeps naming that very process, never one that reuses the pid
    later. None where the kernel or Python has none, or the process is gone."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return opener(_checked_pid(pid))
    except OSError:
        return None


def pidfd_exited(pidfd: int) -> bool:
    """Whether the process a pidfd names has exited (the pidfd polls readable once it has)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))
