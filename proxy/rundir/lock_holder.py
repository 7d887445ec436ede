"""Whether the process holding a run directory's lock is a proxy of that run: the one proof every command uses.

The kernel names the holder of the lock (processes.flock_holder), but any
process can flock a directory it can open: `flock -x RUN sleep 300` holds it
as firmly as a proxy does. Such a holder is the run's proxy only if the
kernel's own view of it says so:

- its command line (/proc/PID/cmdline) is a Python running `-m proxy` or the
  `proxy` console script (the kernel puts the `#!` interpreter first), with a
  subcommand that takes the run's lock: `run`, or `pivot` of a stopped run;
- the run directory that command line names, read with the proxy's own
  argument parser and resolved as that process resolves it (a relative path
  from /proc/PID/cwd), is this very directory, by device and inode. Without
  `--run-dir` the proxy's default places the run under `runs/` of its
  working directory, so this directory's parent must be that `runs/`.

Nothing in the run directory enters the proof: a record there could be
copied from another run or forged, so it could only ever fail a holder, and
a stale one (the previous proxy's, until the new one writes its own) would
fail the real proxy. Any other holder is named in one line and never
signalled.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shlex
from dataclasses import dataclass

import psutil

from ..processes import FileIdentity, identity_seen_by
from .layout import RUNS_ROOT

LOCKING_COMMANDS = frozenset({"run", "pivot"})  # the subcommands that take a run's lock (setup.py, pivot.py)
PROXY_MODULE = "proxy"  # `python -m proxy`
PROXY_SCRIPT = "proxy"  # pyproject.toml's console script
OPTIONS_WITH_VALUE = frozenset({"-X", "-W", "-Q"})  # Python's own options that take the next word
SHOWN_CHARS = 160  # of a foreign holder's command line, in the one line that names it


@dataclass(frozen=True)
class Holder:
    """A held run lock: the process holding it when the kernel names one this user can see, and why it is
    not a proxy of the run (`foreign`; None: it is one)."""

    process: psutil.Process | None
    foreign: str | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def is_proxy(self) -> bool:
        return self.process is not None and self.foreign is None

    def describe(self) -> str:
        if self.process is None:
            return "a process this user cannot identify"
        if self.foreign is None:
            return f"proxy pid {self.pid}"
        return f"pid {self.pid}, which is not a proxy of this run ({self.foreign})"


@dataclass(frozen=True)
class RunningProxy:
    """A lock holder proven to be a proxy of the run (lock.py's running_proxy): the one process that
    commands may signal."""

    process: psutil.Process

    @property
    def pid(self) -> int:
        return self.process.pid

    def describe(self) -> str:
        return f"proxy pid {self.pid}"


def proxy_arguments(cmdline: list[str]) -> list[str] | None:
    """The proxy's own arguments in a process's command line (what follows `-m proxy`, or the `proxy`
    script after its interpreter); None when the command line is no Python running the proxy."""
    if not cmdline or not os.path.basename(cmdline[0]).startswith("python"):
        return None
    i = 1
    while i < len(cmdline):
        word = cmdline[i]
        if word == "-m":
            return cmdline[i + 2 :] if cmdline[i + 1 : i + 2] == [PROXY_MODULE] else None
        if word == f"-m{PROXY_MODULE}":
            return cmdline[i + 1 :]
        if not word.startswith("-"):  # the script Python runs
            return cmdline[i + 1 :] if os.path.basename(word) == PROXY_SCRIPT else None
        if word in ("-c", "-"):  # a program given inline or on stdin: not the proxy
            return None
        i += 2 if word in OPTIONS_WITH_VALUE else 1
    return None


def _parsed(arguments: list[str]) -> argparse.Namespace | None:
    """The proxy's own reading of `arguments` (arguments.build_parser), or None when it refuses them."""
    from ..arguments import build_parser  # the parser loads the policies (pydantic); the proof needs it only here

    quiet = io.StringIO()  # a `--help` there prints: never into this command's own output
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            return build_parser().parse_args(arguments)
    except (Exception, SystemExit):  # a usage error, or --help: no proxy of any run
        return None


def _shown(cmdline: list[str]) -> str:
    text = shlex.join(cmdline) if cmdline else "no command line"
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def why_not_proxy(process: psutil.Process, run_dir: FileIdentity | None, parent: FileIdentity | None) -> str | None:
    """Why `process` (holding the lock of the directory `run_dir`, whose parent directory is `parent`) is
    not a proxy of that run; None when it is one."""
    if run_dir is None:
        return "the run directory itself cannot be examined"
    try:
        cmdline = process.cmdline()
    except psutil.Error:
        return "its command line cannot be read"
    arguments = proxy_arguments(cmdline)
    args = _parsed(arguments) if arguments is not None else None
    if args is None or getattr(args, "command", None) not in LOCKING_COMMANDS:
        return f"its command line is `{_shown(cmdline)}`, not `python -m proxy run`"
    if args.run_dir:
        if identity_seen_by(process.pid, args.run_dir) != run_dir:
            return f"it is `proxy {args.command}` of {args.run_dir}, another directory"
        return None
    if parent is None or identity_seen_by(process.pid, str(RUNS_ROOT)) != parent:
        return f"it is `proxy {args.command}` without --run-dir, whose runs/ is not this directory's parent"
    return None


def holder_of(process: psutil.Process | None, run_dir: FileIdentity | None, parent: FileIdentity | None) -> Holder:
    """The Holder the kernel named, with the proof done."""
    if process is None:
        return Holder(None)
    return Holder(process, why_not_proxy(process, run_dir, parent))
