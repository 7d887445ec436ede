"""`proxy pivot --caps NEW.json [--run-dir DIR] [--at STEP]` (docs/OPERATIONS.md, "Pivot").

A pivot ends the current phase at a checkpoint and starts a new one with new
caps and floors (and optionally another bandit policy); rundir/apply_pivot.py
applies it. The caps file is validated completely before anything is
written, then, under RUN/.pivot.lock (one `proxy pivot` at a time):

- **stopped run** (no proxy holds RUN/.lock): this process takes the lock,
  picks the newest valid checkpoint the log covers (rundir/resume.py; with
  `--at STEP`, the newest such one at or before STEP) and applies the pivot
  there. Steps after it already in `.loss.json` belong to the old phase; the
  next `proxy run` trains them again under the new phase.
- **live run**: it leaves a request for the running proxy
  (rundir/pivot_request.py), sends SIGUSR2, and waits for the answer; the
  proxy's side is supervision/pivot_desk.py.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from ..bandit import bandit_for_phase
from ..config.caps import load_pivot_caps
from ..config.experiment import Experiment
from ..errors import EXIT_OK, ProxyError, add_note
from ..formats.loss_log import LossLogIndex
from ..formats.state import ArmStatus, RunState, load_state, write_state
from ..processes import send
from ..rundir.apply_pivot import PivotResult, apply_pivot
from ..rundir.history import check_history
from ..rundir.identity import load_identity, save_identity
from ..rundir.layout import RunDir, relative_checkpoint
from ..rundir.lock import PivotLock, RunLock, run_lock_holder, running_proxy
from ..rundir.lock_holder import RunningProxy
from ..rundir.phases import read_phases
from ..rundir.pivot_request import read_response, withdraw_request, write_request
from ..rundir.resume import choose_resume
from ..stop_signals import held
from ..supervision.engine_record import reap_orphan
from .which_run import resolve_run, started_run


def main(args: argparse.Namespace) -> int:
    run = resolve_run(args.run_dir)
    try:
        return pivot(run, Path(args.caps), at=args.at, timeout=args.timeout)
    except ProxyError as exc:  # each refusal says whether anything changed
        add_note(exc, f"cannot pivot {run.root}")
        raise


def pivot(
    run: RunDir, caps_path: Path, at: int | None = None, timeout: float = 600.0, out: TextIO | None = None
) -> int:
    """`proxy pivot`: validate everything first, then pivot the live or the stopped run."""
    out = out or sys.stdout
    experiment, phases = started_run(run, "no phases yet (the run was never started); nothing to pivot")
    caps, floors, policy = load_pivot_caps(caps_path, experiment, phases[-1])
    lock = PivotLock(run).acquire()
    try:
        owner = run_lock_holder(run)
        if owner is None:
            return _offline(run, experiment, caps, floors, policy, caps_path, at, out)
        # proven ours, else one line: `flock -x RUN sleep`, or a process the kernel does not name, is never signalled
        proxy = running_proxy(run, "nothing changed")
        if at is not None:
            raise ProxyError(
                f"--at applies to a stopped run only; {run.root} is running ({proxy.describe()}); "
                "a live pivot lands at the step the run has reached"
            )
        return _live(run, proxy, caps, floors, policy, caps_path, timeout, out)
    finally:
        lock.release()


def _live(
    run: RunDir,
    proxy: RunningProxy,
    caps: dict,
    floors: dict,
    policy: str,
    caps_path: Path,
    timeout: float,
    out: TextIO,
) -> int:
    """Ask the running proxy (the holder of the run's lock, as the kernel names it) to pivot at the step it
    has reached; wait for its answer."""
    pid = proxy.pid
    phases_before = len(read_phases(run))
    request_id = write_request(run, caps, floors, policy, str(caps_path))
    if not send(proxy.process, signal.SIGUSR2):
        withdraw_request(run)
        raise ProxyError(f"proxy pid {pid} for {run.root} is gone; nothing changed")
    print(f"asked proxy pid {pid} to pivot {run.root}: waiting for the checkpoint...", file=out, flush=True)
    end = time.monotonic() + timeout
    while True:
        answer = read_response(run, request_id)
        if answer is not None:
            break
        if run_lock_holder(run) is None:  # the proxy ended; did it answer on its way out?
            answer = read_response(run, request_id)
            if answer is not None:
                break
            withdrawn = withdraw_request(run)
            phases = read_phases(run)
            if len(phases) > phases_before:
                p = phases[-1]
                print(
                    f"proxy pid {pid} exited, but the pivot was applied: phase {p.phase} from step "
                    f"{p.start_step}; relaunch the run command to continue",
                    file=out,
                    flush=True,
                )
                return EXIT_OK
            raise ProxyError(
                f"proxy pid {pid} exited before the pivot landed; nothing changed"
                + ("" if withdrawn else " (it had taken the request)")
                + f"; `proxy pivot --run-dir {run.root}` again pivots the stopped run"
            )
        if time.monotonic() >= end:
            if withdraw_request(run):
                raise ProxyError(
                    f"proxy pid {pid} did not take the pivot request within {timeout:.0f}s; "
                    "request withdrawn, nothing changed"
                )
            raise ProxyError(
                f"proxy pid {pid} took the pivot request but did not answer within {timeout:.0f}s; "
                f"it may still apply it: see `proxy status --run-dir {run.root}`"
            )
        time.sleep(0.05)
    if not answer.get("ok"):
        raise ProxyError(f"refused by proxy pid {pid}: {answer.get('message')}")
    print(answer.get("message"), file=out, flush=True)
    return EXIT_OK


def _offline(
    run: RunDir,
    experiment: Experiment,
    caps: dict,
    floors: dict,
    policy: str,
    caps_path: Path,
    at: int | None,
    out: TextIO,
) -> int:
    """Pivot a stopped run: under its lock, at the newest valid checkpoint the log covers."""
    run_lock = RunLock(run).acquire()  # RunInUse when a proxy took it since we looked: the user tries again
    # `proxy checkpoint` (SIGUSR1) and a pivot request (SIGUSR2) mean nothing to this process
    old_handlers = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGUSR1, signal.SIGUSR2)}
    try:

        def warn(line: str) -> None:
            print(f"proxy: {line}", file=sys.stderr, flush=True)

        run.remove_leftovers()  # temp files of a proxy killed here before
        identity, unsaved = load_identity(run, warn)
        reaped = reap_orphan(run, identity, run_lock, 60.0, warn)
        if reaped:
            warn(reaped)
        index = LossLogIndex.load(run.loss_log)
        phases = read_phases(run)
        check_history(run, phases, index)
        resume = choose_resume(run.checkpoints, index, phases, set(), vocab=int(experiment.model.vocab), at_most=at)
        step = resume.step
        max_steps = int(experiment.train.max_steps)
        if step >= max_steps:
            raise ProxyError(
                f"the run finished at step {step} (max_steps {max_steps}); a pivot there would "
                "train nothing" + ("" if at is not None else " (--at STEP pivots from an earlier checkpoint)")
            )
        for reason in resume.skipped:
            print(f"proxy: not pivoting at {reason}", file=sys.stderr, flush=True)
        checkpoint = relative_checkpoint(step) if resume.path is not None else None
        # `proxy stop` finds us holding the run's lock: a stop request waits until the pivot is whole
        with held():
            if unsaved:
                save_identity(run, identity)
            result = apply_pivot(run, step, caps, floors, policy, checkpoint)  # RunDirError: nothing changed
            _offline_state(run, experiment, result, caps_path)
        logged = index.max_step()
        print(result.message(run), file=out, flush=True)
        if logged > step:
            print(
                f"steps {step + 1}..{logged} in .loss.json belong to phase {result.phase.phase - 1}; the next "
                f"`proxy run` resumes from step {step} and trains them again under phase {result.phase.phase}",
                file=out,
                flush=True,
            )
        print(f"continue with: proxy run --run-dir {run.root}", file=out, flush=True)
        return EXIT_OK
    finally:
        run_lock.release()
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)


def _offline_state(run: RunDir, experiment: Experiment, result: PivotResult, caps_path: Path) -> None:
    """.state.json for the new phase (the old one is in the archive): shown by `proxy status`."""
    old = load_state(run.state) or RunState()
    p = result.phase
    names = experiment.arm_names
    try:
        bandit, caps, floors = bandit_for_phase(experiment, p)
        weights = [float(w) for w in bandit.weights()]
        bandit_state = bandit.state()
    except (ValueError, TypeError):
        caps, floors, weights, bandit_state = p.caps, p.floors, [0.0] * len(names), {}
    arms = {n: ArmStatus(pulls=0, weight=weights[i], cap=caps[n], floor=floors[n]) for i, n in enumerate(names)}
    write_state(
        run.state,
        replace(
            old,
            experiment=old.experiment or experiment.name,
            max_steps=old.max_steps or int(experiment.train.max_steps),
            step=p.start_step,
            phase=p.phase,
            policy=p.policy,
            status="stopped",
            arms=arms,
            last_checkpoint=str(run.root / p.checkpoint) if p.checkpoint else None,
            message=f"pivoted to phase {p.phase} at step {p.start_step} ({caps_path}); relaunch the run to continue",
            bandit=bandit_state,
            eta_s=None,
            engine=replace(old.engine, alive=False),
        ),
    )
