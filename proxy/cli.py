"""`proxy` / `python -m proxy`: run, status, checkpoint, stop, pivot, fork, export, sample, eval, verify,
dashboard (docs/CLI.md).

The dispatch of every subcommand (its arguments: proxy/arguments.py) to the
one module that carries it out (proxy/commands/). Every bad input ends with one line on
stderr and a non-zero exit (proxy/errors.py), never a traceback.
"""

from __future__ import annotations

import importlib
import os
import sys

from .arguments import UsageError, build_parser
from .errors import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    STORAGE_ERRNOS,
    ProxyError,
    StorageError,
    add_note,
    one_line,
)
from .safe_fs import UnsafeFileError
from .supervision.signals import install_interrupt

# The module that carries out each command (its `main(args)`). Only that one is imported, so that
# `proxy status`, `checkpoint` and `stop` start at once instead of loading what training needs
# (numpy, pydantic, the tokenizer, the dashboard).
COMMANDS = {
    "run": "proxy.commands.run",
    "status": "proxy.commands.status",
    "checkpoint": "proxy.commands.checkpoint_now",
    "stop": "proxy.commands.stop",
    "pivot": "proxy.commands.pivot",
    "fork": "proxy.commands.fork",
    "export": "proxy.commands.export",
    "sample": "proxy.commands.sample",
    "eval": "proxy.commands.evaluate",
    "verify": "proxy.commands.verify",
}


# `proxy dashboard ...` becomes `python -m dashboard ...` in the same process (exec): the proxy imports
# nothing of the dashboard, which reads the run directory through the proxy's own modules.
DASHBOARD_MODULE = "dashboard"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "dashboard":  # the dashboard is the layer above the proxy: its own program
        os.execv(sys.executable, [sys.executable, "-m", DASHBOARD_MODULE, *argv[1:]])
    parser = build_parser()
    command = "proxy"
    try:
        args = parser.parse_args(argv)
        if args.version:
            return importlib.import_module("proxy.commands.version").main()
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        command = args.command
        if command == "run":  # from here a stop signal ends the setup with one line (supervision/signals.py)
            install_interrupt()
        return importlib.import_module(COMMANDS[command]).main(args)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except (ProxyError, UnsafeFileError) as exc:  # every error that carries its exit code: one line, that code
        print(f"proxy: {one_line(exc)}", file=sys.stderr, flush=True)
        return exc.code
    except KeyboardInterrupt:
        print("proxy: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `proxy status | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:  # one that no module made an error of its own: the file and why, exit 1 (5: storage)
        if exc.errno in STORAGE_ERRNOS and exc.filename:
            storage = StorageError(exc.filename, exc, "access")
            print(f"proxy: {one_line(storage)}", file=sys.stderr, flush=True)
            return storage.code
        if not getattr(exc, "__notes__", None):
            add_note(exc, command)
        print(f"proxy: {one_line(exc)}", file=sys.stderr, flush=True)
        return EXIT_FAILURE
