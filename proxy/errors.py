"""Exit codes of the `proxy` command, and the one error that carries one (docs/CLI.md, "Exit status")."""
from __future__ import annotations

EXIT_OK = 0  # finished, stopped on request, already finished
EXIT_FAILURE = 1  # runtime failure: run in use, no proxy to signal, engine cannot run, pivot refused, ...
EXIT_USAGE = 2  # bad input: arguments, experiment or caps file, run directory, engine binary
EXIT_CRASHLOOP = 3  # the engine failed --max-failures times in a row without progress
EXIT_INTERRUPTED = 130  # Ctrl-C before training started


class ProxyError(Exception):
    """Ends a `proxy` command with one line for the user (the message) and an exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILURE):
        super().__init__(message)
        self.code = code
