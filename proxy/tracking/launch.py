"""`proxy run` starts the tracker as a child process when the experiment's `log` block asks for any, and
stops it when training ends: SIGTERM, then it writes what is left and exits (follow.py)."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

from ..atomic import open_append
from ..config.experiment import Experiment
from ..rundir.layout import RunDir

FINISH_S = 60.0  # how long `proxy run` waits for the tracker's last sweep before killing it


def _die_with_parent() -> None:
    """In the tracker: SIGTERM when the proxy dies, however it dies (Linux): it finishes its sweep and exits."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_tracker(run: RunDir, experiment: Experiment) -> subprocess.Popen | None:
    if not experiment.log.enabled:
        return None
    log = open_append(run.tracker_log)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "proxy.tracking", "--run-dir", str(run.root)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=_die_with_parent,
                                start_new_session=True)  # a Ctrl-C goes to the proxy; the tracker is told after
    finally:
        os.close(log)
    where = [w for w, on in (("TensorBoard " + str(run.tensorboard), experiment.log.tensorboard),
                             ("W&B", experiment.log.wandb is not None)) if on]
    print(f"tracking: {', '.join(where)} (log {run.tracker_log})", flush=True)
    return proc


def stop_tracker(proc: subprocess.Popen) -> None:
    """Let the tracker write the run's last steps, then make sure it is gone (it is our own child)."""
    proc.terminate()
    try:
        proc.wait(FINISH_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
