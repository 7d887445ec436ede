"""`proxy checkpoint`: ask the running proxy for a checkpoint now (SIGUSR1); training continues."""

from __future__ import annotations

import argparse
import signal

from ..errors import EXIT_OK
from ..rundir.lock import signal_proxy
from .which_run import resolve_run


def main(args: argparse.Namespace) -> int:
    run = resolve_run(args.run_dir)
    pid = signal_proxy(run, signal.SIGUSR1)
    print(f"asked proxy pid {pid} for a checkpoint of {run.root}; training continues")
    return EXIT_OK
