"""`proxy run` starts the tracker as a child process when the experiment's `log` block asks for any, and
stops it when training ends by closing the tracker's stdin: it writes what is left and exits (follow.py).

A pipe, not a signal: its end comes however the proxy ends (the kernel closes it when the proxy is
killed), and it cannot arrive before the tracker is ready to hear it (a SIGTERM in its first second, a
short relaunch, would end it before it wrote anything).
"""

from __future__ import annotations

import os
import subprocess
import sys

from ..atomic import open_append
from ..errors import ProxyError, one_line
from ..rundir.frozen import load_frozen_experiment
from ..rundir.layout import RunDir
from ..safe_fs import UnsafeFileError

FINISH_S = 60.0  # how long `proxy run` waits for the tracker's last sweep before killing it


def start_tracker(run: RunDir) -> subprocess.Popen | None:
    """The tracker for the run's frozen (effective) experiment, or None when its `log` block asks for nothing.
    A tracker that cannot start is one line on stderr; training goes on without it."""
    try:
        experiment = load_frozen_experiment(run)
        if not experiment.log.enabled:
            return None
        proc = _spawn(run)
    except (OSError, ProxyError, UnsafeFileError) as exc:
        print(f"proxy: tracking not started: {one_line(exc)}; training goes on", file=sys.stderr, flush=True)
        return None
    where = [
        w
        for w, on in (
            ("TensorBoard " + str(run.tensorboard), experiment.log.tensorboard),
            ("W&B", experiment.log.wandb is not None),
        )
        if on
    ]
    print(f"tracking: {', '.join(where)} (log {run.tracker_log})", flush=True)
    return proc


def _spawn(run: RunDir) -> subprocess.Popen:
    log = open_append(run.tracker_log)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "proxy.tracking", "--run-dir", str(run.root)],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )  # a Ctrl-C goes to the proxy; the tracker is told after
    finally:
        os.close(log)


def stop_tracker(proc: subprocess.Popen) -> None:
    """Let the tracker write the run's last steps, then make sure it is gone (it is our own child)."""
    if proc.stdin is not None:  # start_tracker gives it a pipe
        proc.stdin.close()
    try:
        proc.wait(FINISH_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
