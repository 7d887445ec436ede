"""The one error of data preparation (exit 2): which arm or source, and why, on one line."""

from __future__ import annotations

from ..errors import EXIT_USAGE, ProxyError


class DataError(ProxyError, ValueError):
    """Data preparation failed; the message is one line saying which arm/source and why."""

    code = EXIT_USAGE


def unreadable(exc: OSError) -> str:
    """A source read that failed (permission denied, a directory, a /proc file that refuses reads): the
    file and the reason, for a one-line DataError."""
    where = f" {exc.filename}" if exc.filename else ""
    return f"cannot read{where}: {exc.strerror or exc}"
