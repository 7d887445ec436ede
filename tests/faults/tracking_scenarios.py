"""The tracker's fault scenarios (tests/faults/test_tracking.py): the proxy and its tracker killed with SIGKILL
together at seeded random moments while it writes TensorBoard event files, and the same command relaunched.
Every step ends in the event file exactly once, with the loss `.loss.json` holds for it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from harness.gate import KILL_SLACK, Gate
from harness.tracking_readers import tensorboard_scalars

from .proxy_harness import (
    ProxyEnv,
    engine_alive,
    engine_record,
    finish_last_launch,
    kill_engine,
    no_traceback,
    read_log,
    wait_engine_gone,
)
from .scenarios import ENGINE, Outcome, rng_for, tail_lines

TRACKING = ("--set", "log.tensorboard=true")


def tracker_of(proxy_pid: int) -> int | None:
    """The proxy's child running `proxy.tracking` (our own child: read from /proc before anything is sent)."""
    for task in Path(f"/proc/{proxy_pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            try:
                if b"proxy.tracking" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return int(child)
            except OSError:
                continue
    return None


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def tracker_kill_storm(
    env: ProxyEnv,
    workdir: Path,
    n_kills: int,
    name: str = "tracker-kill",
    fault_class: str = "kill -9 of the proxy and its tracker (TensorBoard)",
) -> Outcome:
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    run = workdir / "run"
    gate = Gate(workdir / "gate", ENGINE.path)
    targets = sorted(rng.sample(range(5, env.max_steps - 10), n_kills))
    p = None
    for k, target in enumerate(targets, 1):
        gate.hold_after(target + KILL_SLACK)
        p = p or env.start(run, *TRACKING, engine=gate.engine_flag)
        if not _wait(lambda: read_log(run / ".loss.json").max_step >= target or not p.alive(), 240):
            out.fail(f"step {target} never came: {tail_lines(p.stderr)}")
        if not p.alive():
            out.fail(f"the proxy exited {p.wait()} before step {target}: {tail_lines(p.stderr)}")
        time.sleep(rng.uniform(0.0, 2.5))  # anywhere in the tracker's 2 s poll: idle, or writing
        tracker = tracker_of(p.pid)
        if tracker is None:
            out.fail(f"kill {k}: no tracker under the proxy: {tail_lines(p.stderr)}")
        rec = engine_record(run)
        out.begin_fault()
        os.kill(tracker, signal.SIGKILL)
        p.killpg()
        p.wait()
        if rec is not None and engine_alive(rec):
            kill_engine(rec)
            wait_engine_gone(rec)
        no_traceback(p, out, f"killed proxy {k}")
        out.end_fault()
        p = None
    gate.open()
    p = env.start(run, *TRACKING, engine=gate.engine_flag)
    finish_last_launch(p, out)
    log = read_log(run / ".loss.json")
    scalars = tensorboard_scalars(run / "tensorboard")
    written = [s for s, _ in scalars.get("train/loss", [])]
    twice = len(written) - len(set(written))
    missing = sorted(set(range(1, env.max_steps + 1)) - set(written))
    if twice or missing or written != sorted(written):
        out.fail(
            f"train/loss in the event file: {twice} step(s) written twice, {len(missing)} missing "
            f"(first {missing[:5]})",
            data_lost=len(missing),
        )
    wrong = [s for s, v in scalars["train/loss"] if abs(v - log.steps[s]["loss"]) > 1e-6 * abs(log.steps[s]["loss"])]
    if wrong:
        out.fail(f"train/loss differs from .loss.json at steps {wrong[:5]}")
    evals = [s for s, _ in scalars.get("val/loss", [])]
    if evals != sorted(log.evals):
        out.fail(f"val/loss at steps {evals}; .loss.json evaluates at {sorted(log.evals)}")
    out.note("event file points", len(written))
    return out.close()
