"""Exit codes of the `proxy` command, and the errors that carry one (docs/CLI.md, "Exit status")."""

from __future__ import annotations

import errno
import os

EXIT_OK = 0  # finished, stopped on request, already finished
EXIT_FAILURE = 1  # runtime failure: run in use, no proxy to signal, engine cannot run, pivot refused, ...
EXIT_USAGE = 2  # bad input: arguments, experiment or caps file, run directory, engine binary
EXIT_CRASHLOOP = 3  # the engine failed --max-failures times in a row without progress
EXIT_STORAGE = 5  # a write of the proxy's failed: disk full, file too large, I/O error, read-only (as the engine's 5)
EXIT_DIVERGED = 6  # the run diverged: a loss or a state not finite or not sane (as the engine's 6; proxy/divergence.py)
EXIT_INTERRUPTED = 130  # Ctrl-C before training started


class ProxyError(Exception):
    """Ends a `proxy` command with one line for the user (`one_line`) and an exit code: `code`, the class's
    unless one is given. An error that always means one exit status subclasses this and sets `code`
    (a bad run directory, experiment file, data, engine: EXIT_USAGE), so it reaches cli.py, which prints
    the line and returns the code, without being caught and raised again on the way. A caller that knows
    what was being done when it was raised says so with `add_note(exc, "cannot pivot")` and raises the same
    error again: the code stays the one its raiser chose."""

    code = EXIT_FAILURE

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


def one_line(exc: BaseException) -> str:
    """The line an error ends a command with: the context its callers noted (outermost first), then its
    message: "cannot pivot RUN: <message>". An OSError's message is its file and why."""
    message = str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        message = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return ": ".join([*reversed(getattr(exc, "__notes__", ())), message])


# The write failures that say the storage, not the proxy, is at fault, and what the user can do about
# each; every one stops a command with StorageError. Any other OSError keeps its own handling.
def add_note(exc: BaseException, note: str) -> None:
    """`exc.add_note(note)`, which Python 3.10 lacks; `one_line` reads the notes on every version."""
    # where 3.11's add_note keeps them (the instance's __notes__), so tracebacks there show them too
    exc.__dict__.setdefault("__notes__", []).append(note)


STORAGE_ERRNOS = {
    errno.ENOSPC: "free space",
    errno.EDQUOT: "free space or raise the disk quota",
    errno.EFBIG: "raise the file-size limit (ulimit -f)",
    errno.EIO: "check the disk",
    errno.EROFS: "make the file system writable",
}
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)  # no new block can be had (but the blocks a file holds can be rewritten)


class StorageError(ProxyError):
    """A write the proxy made failed for a reason in STORAGE_ERRNOS: one line naming the file, the errno
    and the remedy."""

    def __init__(self, path: str | os.PathLike, exc: OSError, action: str = "write"):
        self.path = str(path)
        self.errno = exc.errno
        self.errno_name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        self.strerror = exc.strerror or os.strerror(exc.errno or 0)
        remedy = STORAGE_ERRNOS.get(exc.errno or 0, "check the disk")
        super().__init__(f"cannot {action} {path}: {self.strerror} ({self.errno_name}); {remedy}", EXIT_STORAGE)
