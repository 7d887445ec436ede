"""`proxy stop`: SIGTERM to the running proxy, then wait until it has checkpointed and released the run.

The proxy is the process holding the run directory's lock, as the kernel names it (rundir/lock.py).
"""

from __future__ import annotations

import argparse
import signal
import time

from ..errors import EXIT_OK, ProxyError
from ..formats.checkpoint import checkpoint_files
from ..rundir.lock import run_lock_holder, signal_proxy
from .which_run import resolve_run

POLL_S = 0.2


def main(args: argparse.Namespace) -> int:
    run = resolve_run(args.run_dir)
    pid = signal_proxy(run, signal.SIGTERM)
    if args.no_wait:
        print(f"asked proxy pid {pid} to stop {run.root}; it checkpoints and exits")
        return EXIT_OK
    print(f"stopping {run.root} (proxy pid {pid}): waiting for the checkpoint...", flush=True)
    end = time.monotonic() + args.timeout
    while time.monotonic() < end:
        if run_lock_holder(run) is None:
            newest = checkpoint_files(run.checkpoints)
            print(f"stopped; newest checkpoint {newest[0] if newest else 'none'}")
            return EXIT_OK
        time.sleep(POLL_S)
    raise ProxyError(f"proxy pid {pid} did not exit within {args.timeout:.0f}s (it may still be checkpointing)")
