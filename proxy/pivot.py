"""The polish pivot: `proxy pivot --caps NEW.json [--run-dir DIR] [--at STEP]` (docs/OPERATIONS.md, "Pivot").

A pivot ends the current phase at a checkpoint and starts a new one with new
caps and floors (and optionally another bandit policy): the run's
`.samples.json` and `.state.json` are archived to `RUN/archive/pivot_<step>/`,
the new phase is appended to `phases.json`, and training goes on from that
checkpoint with a fresh bandit. `.loss.json` is never touched.

Two ways in, one way to apply (`apply_pivot`):

- **Stopped run** (no proxy holds `RUN/.lock`): this process takes the lock,
  picks the newest valid checkpoint the log covers (the supervisor's own
  `choose_resume`; `--at STEP`: the newest such one at or before STEP) and
  applies the pivot there. Steps after that checkpoint already in `.loss.json`
  belong to the old phase; the next `proxy run` resumes from the pivot
  checkpoint and trains them again under the new phase (new entries, last one
  per step wins).
- **Live run**: the request/acknowledgement protocol with the running proxy:

  1. the CLI validates the caps file completely (nothing is written before);
  2. it takes `RUN/.pivot.lock` (flock; a second `proxy pivot` is refused
     while one holds it), writes `RUN/.pivot_request.json` atomically
     (`id`, `caps`, `floors`, `policy`, `caps_file`, `pid`, `time`) and
     sends SIGUSR2 to the proxy (its pid is in `RUN/.lock`);
  3. the proxy claims the request by renaming it to `RUN/.pivot_claimed.json`
     (so a CLI that gives up can still withdraw an unclaimed request), checks
     it again, stops feeding and sends STOP: the engine trains the frames in
     flight, checkpoints at the last step k and exits; the proxy then applies
     the pivot at k (`apply_pivot`) and starts a new engine from that
     checkpoint with a fresh bandit for the new phase;
  4. the proxy answers in `RUN/.pivot_response.json` (`id`, `ok`, `message`,
     and on success `phase`, `start_step`, `checkpoint`, `archive`); the CLI
     waits for the answer with its id and prints the message.

  The proxy refuses (an answer with `ok: false`, nothing changed) a request
  while it is restarting a failed engine, while another pivot is being
  applied, or while the run is stopping or finishing.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from .atomic import atomic_write_json, fsync_dir
from .checkpoint_file import checkpoint_step, list_checkpoints
from .run_dir import Phase, RunDir, RunDirError, append_phase, read_phases

REQUEST = ".pivot_request.json"
CLAIMED = ".pivot_claimed.json"
RESPONSE = ".pivot_response.json"
PIVOT_LOCK = ".pivot.lock"
POLICIES = ("ucb1", "exp3", "uniform", "progress")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class PivotError(Exception):
    """One line for the user and an exit code; nothing was changed."""

    def __init__(self, message: str, code: int = EXIT_FAILURE):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------- caps files

def phase_bounds(experiment, phase: Phase | None) -> tuple[dict[str, float], dict[str, float]]:
    """The full caps and floors in force in `phase` (arms it does not name keep the experiment's)."""
    caps, floors = dict(experiment.caps), dict(experiment.floors)
    if phase is not None:
        caps.update({k: float(v) for k, v in phase.caps.items() if k in caps})
        floors.update({k: float(v) for k, v in phase.floors.items() if k in floors})
    return caps, floors


def load_pivot_caps(path: str | os.PathLike, experiment, phase: Phase | None
                    ) -> tuple[dict[str, float], dict[str, float], str]:
    """A caps file (docs/EXPERIMENTS.md, "Caps files") over the bounds of `phase`.

    Returns (caps, floors, policy) for every arm. Besides `caps` and `floors`
    a pivot's caps file may name `"policy"`, one of POLICIES (default: the
    current phase's). Raises ExperimentError (one line naming the file).
    """
    from .experiment import CapsFile, _fail, _read_json, apply_caps, format_validation_error
    from pydantic import ValidationError

    path = Path(path)
    data = _read_json(path)
    if not isinstance(data, dict):
        raise _fail(path, [f"expected a JSON object, got {type(data).__name__}"])
    data = dict(data)
    current = phase.policy if phase is not None else experiment.bandit.policy
    policy = data.pop("policy", current)
    if policy not in POLICIES:
        raise _fail(path, [f"policy: expected one of {', '.join(map(repr, POLICIES))}, got {policy!r}"])
    try:
        cf = CapsFile.model_validate(data)
    except ValidationError as e:
        raise _fail(path, format_validation_error(e)) from None
    caps, floors = apply_caps(cf, experiment, path, phase_bounds(experiment, phase))
    return caps, floors, str(policy)


def check_request(req: dict, experiment) -> tuple[dict, dict, str]:
    """The caps, floors and policy of a pivot request, checked again (a request file is input too)."""
    from .experiment import check_caps_floors

    names = experiment.arm_names
    try:
        caps = {str(k): float(v) for k, v in dict(req["caps"]).items()}
        floors = {str(k): float(v) for k, v in dict(req["floors"]).items()}
        policy = str(req.get("policy") or experiment.bandit.policy)
    except (KeyError, TypeError, ValueError) as exc:
        raise PivotError(f"malformed pivot request ({exc})", EXIT_USAGE) from None
    if set(caps) != set(names) or set(floors) != set(names):
        raise PivotError(f"pivot request names arms {sorted(set(caps) | set(floors))}, the experiment "
                         f"{sorted(names)}", EXIT_USAGE)
    problems = [f"{kind}.{a}: {v:g} is outside [0, 1]" for kind, m in (("caps", caps), ("floors", floors))
                for a, v in m.items() if not 0.0 <= v <= 1.0]
    problems += check_caps_floors(caps, floors)
    if policy not in POLICIES:
        problems.append(f"unknown policy {policy!r}")
    if problems:
        raise PivotError("bad pivot request: " + "; ".join(problems), EXIT_USAGE)
    return caps, floors, policy


# ---------------------------------------------------------------- applying a pivot

def relative_checkpoint(step: int) -> str:
    """How phases.json names a pivot checkpoint: relative to the run directory."""
    return f"checkpoints/step_{step:06d}.bin"


def archive_name(phases: list[Phase], step: int, phase_number: int) -> str:
    """`pivot_<step>`; a second pivot at the same step gets `pivot_<step>_phase<N>`."""
    same = [p for p in phases if p.phase > 0 and p.phase < phase_number and p.start_step == step]
    return f"pivot_{step}" if not same else f"pivot_{step}_phase{phase_number}"


def archive_dir_for(run: RunDir, phases: list[Phase], phase_number: int) -> Path:
    """Where the pivot that started `phase_number` (>= 1) archived the previous phase's sidecars."""
    p = phases[phase_number]
    return run.archive / archive_name(phases, p.start_step, phase_number)


@dataclass
class PivotResult:
    phase: Phase
    archive: Path
    moved: list[str]  # checkpoints newer than the pivot step, moved into the archive

    def response(self, run: RunDir, request_id: str | None) -> dict:
        return {"id": request_id, "ok": True, "phase": self.phase.phase, "start_step": self.phase.start_step,
                "policy": self.phase.policy, "caps": self.phase.caps, "floors": self.phase.floors,
                "checkpoint": self.phase.checkpoint, "archive": str(self.archive.relative_to(run.root)),
                "moved": self.moved, "message": self.message(run)}

    def message(self, run: RunDir) -> str:
        p = self.phase
        moved = (f"; {len(self.moved)} newer checkpoint(s) of the old phase moved there" if self.moved else "")
        return (f"pivoted {run.root} at step {p.start_step}: phase {p.phase} ({p.policy}; caps "
                + ", ".join(f"{k} {v:g}" for k, v in p.caps.items()) + "; floors "
                + ", ".join(f"{k} {v:g}" for k, v in p.floors.items())
                + f") starts at step {p.start_step + 1} from {p.checkpoint or 'scratch'}; "
                f".samples.json and .state.json archived in {self.archive.relative_to(run.root)}{moved}")


def apply_pivot(run: RunDir, step: int, caps: dict, floors: dict, policy: str,
                checkpoint: str | None) -> PivotResult:
    """Archive the sidecars, set aside newer checkpoints, append the phase. The caller holds the run
    (the live proxy, or the lock) and has made sure `checkpoint` (at `step`) is valid and covered.

    Order, for crash safety: the archive is built in a temp directory and renamed into place; the
    checkpoints after `step` (an old-phase trajectory the new phase must never resume from) are
    moved into it; then phases.json is replaced (the commit point); then `.samples.json` starts
    empty for the new phase. A crash before the commit leaves the old phase in force.
    """
    phases = read_phases(run)
    number = len(phases)
    name = archive_name(phases, step, number)
    run.archive.mkdir(parents=True, exist_ok=True)
    final = run.archive / name
    tmp = run.archive / f".{name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for src in (run.samples, run.state):
        if src.exists():
            shutil.copyfile(src, tmp / src.name)
            with open(tmp / src.name, "rb") as f:
                os.fsync(f.fileno())
    fsync_dir(tmp)
    if final.exists():  # left by a pivot that was interrupted before its commit: keep it, aside
        final.rename(run.archive / f"{name}.interrupted-{int(time.time())}")
    os.rename(tmp, final)
    fsync_dir(run.archive)
    moved = []
    newer = [p for p in list_checkpoints(run.checkpoints) if (checkpoint_step(p) or 0) > step]
    if newer:
        aside = final / "checkpoints"
        aside.mkdir(exist_ok=True)
        for p in sorted(newer):
            os.rename(p, aside / p.name)
            moved.append(p.name)
        fsync_dir(aside)
        fsync_dir(run.checkpoints)
    phase = append_phase(run, step, policy, caps, floors, checkpoint)
    atomic_write_json(run.samples, [])
    return PivotResult(phase, final, moved)


# ---------------------------------------------------------------- the pivot lock and the request files

class PivotLock:
    """`RUN/.pivot.lock`: one `proxy pivot` at a time per run directory (flock; holds the pid)."""

    def __init__(self, run: RunDir):
        self.path = run.root / PIVOT_LOCK
        self.fd: int | None = None

    def acquire(self) -> "PivotLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                try:
                    who = f"pid {int(self.path.read_text().strip())}"
                except (OSError, ValueError):
                    who = "another process"
                raise PivotError(f"another pivot of {self.path.parent} is in flight ({who}); "
                                 "wait for it to finish, then try again") from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def claim_request(run: RunDir) -> dict | None:
    """The proxy's side: take RUN/.pivot_request.json (rename to .pivot_claimed.json) and read it."""
    src, dst = run.root / REQUEST, run.root / CLAIMED
    try:
        os.rename(src, dst)
    except FileNotFoundError:
        return None
    try:
        obj = json.loads(dst.read_text())
    except (OSError, ValueError):
        obj = None
    return obj if isinstance(obj, dict) else {"id": None, "malformed": True}


def answer_request(run: RunDir, request: dict | None, ok: bool, message: str, **fields) -> None:
    """The proxy's side: write RUN/.pivot_response.json and drop the claimed request."""
    obj = {"id": (request or {}).get("id"), "ok": ok, "message": message, **fields}
    atomic_write_json(run.root / RESPONSE, obj)
    try:
        (run.root / CLAIMED).unlink()
    except FileNotFoundError:
        pass


def _read_response(run: RunDir, request_id: str) -> dict | None:
    try:
        obj = json.loads((run.root / RESPONSE).read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) and obj.get("id") == request_id else None


# ---------------------------------------------------------------- the command

def _load_frozen_experiment(run: RunDir):
    from .experiment import ExperimentError, load_experiment

    try:
        return load_experiment(run.experiment, check_sources=False)
    except ExperimentError as exc:
        raise PivotError(str(exc), EXIT_USAGE) from None


def pivot(run: RunDir, caps_path: Path, at: int | None = None, timeout: float = 600.0, out=None) -> int:
    """`proxy pivot`: validate everything first, then pivot the live or the stopped run."""
    from .experiment import ExperimentError
    from .run_dir import lock_owner

    out = out or sys.stdout
    experiment = _load_frozen_experiment(run)
    try:
        phases = read_phases(run)
    except RunDirError as exc:
        raise PivotError(str(exc), EXIT_USAGE) from None
    if not phases:
        raise PivotError(f"{run.phases}: no phases yet (the run was never started); nothing to pivot", EXIT_USAGE)
    try:
        caps, floors, policy = load_pivot_caps(caps_path, experiment, phases[-1])
    except ExperimentError as exc:
        raise PivotError(str(exc), EXIT_USAGE) from None
    if at is not None and at < 0:
        raise PivotError("--at must be a step >= 0", EXIT_USAGE)

    lock = PivotLock(run).acquire()
    try:
        owner = lock_owner(run)
        if owner is None:
            return _offline(run, experiment, caps, floors, policy, caps_path, at, out)
        if at is not None:
            raise PivotError(f"--at applies to a stopped run only; {run.root} is running (proxy pid {owner}); "
                             "a live pivot lands at the step the run has reached")
        return _live(run, owner, caps, floors, policy, caps_path, timeout, out)
    finally:
        lock.release()


def _live(run: RunDir, pid: int, caps: dict, floors: dict, policy: str, caps_path: Path,
          timeout: float, out) -> int:
    from .run_dir import lock_owner

    if pid <= 0:
        raise PivotError(f"{run.lock_file} is locked but holds no pid")
    request_id = uuid.uuid4().hex
    phases_before = len(read_phases(run))
    atomic_write_json(run.root / REQUEST, {"id": request_id, "caps": caps, "floors": floors, "policy": policy,
                                           "caps_file": str(caps_path), "pid": os.getpid(), "time": time.time()})
    try:
        os.kill(pid, signal.SIGUSR2)
    except ProcessLookupError:
        _withdraw(run)
        raise PivotError(f"proxy pid {pid} for {run.root} is gone; nothing changed") from None
    print(f"asked proxy pid {pid} to pivot {run.root}: waiting for the checkpoint...", file=out, flush=True)
    end = time.monotonic() + timeout
    while True:
        answer = _read_response(run, request_id)
        if answer is not None:
            break
        if lock_owner(run) is None:  # the proxy ended; did it answer on its way out?
            answer = _read_response(run, request_id)
            if answer is not None:
                break
            withdrawn = _withdraw(run)
            phases = read_phases(run)
            if len(phases) > phases_before:
                p = phases[-1]
                print(f"proxy pid {pid} exited, but the pivot was applied: phase {p.phase} from step "
                      f"{p.start_step}; relaunch the run command to continue", file=out, flush=True)
                return EXIT_OK
            raise PivotError(f"proxy pid {pid} exited before the pivot landed; nothing changed"
                             + ("" if withdrawn else " (it had taken the request)")
                             + f"; `proxy pivot --run-dir {run.root}` again pivots the stopped run")
        if time.monotonic() >= end:
            if _withdraw(run):
                raise PivotError(f"proxy pid {pid} did not take the pivot request within {timeout:.0f}s; "
                                 "request withdrawn, nothing changed")
            raise PivotError(f"proxy pid {pid} took the pivot request but did not answer within {timeout:.0f}s; "
                             f"it may still apply it: see `proxy status --run-dir {run.root}`")
        time.sleep(0.05)
    if not answer.get("ok"):
        raise PivotError(f"pivot refused by proxy pid {pid}: {answer.get('message')}")
    print(answer.get("message"), file=out, flush=True)
    return EXIT_OK


def _withdraw(run: RunDir) -> bool:
    """Withdraw our unclaimed request; False when the proxy has already claimed it."""
    try:
        (run.root / REQUEST).unlink()
        return True
    except FileNotFoundError:
        return False


def _offline(run: RunDir, experiment, caps: dict, floors: dict, policy: str, caps_path: Path,
             at: int | None, out) -> int:
    """Pivot a stopped run: under its lock, at the newest valid checkpoint the log covers."""
    from .engine_process import reap_orphan
    from .loss_log import LossLogIndex
    from .run_dir import RunLock
    from .supervisor import SupervisorError, choose_resume, current_phase

    try:
        run_lock = RunLock(run).acquire()
    except RunDirError as exc:
        raise PivotError(f"{exc}; try again") from None
    # `proxy checkpoint` (SIGUSR1) and a pivot request (SIGUSR2) mean nothing to this process
    old_handlers = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGUSR1, signal.SIGUSR2)}
    try:
        reaped = reap_orphan(run.engine_record, 60.0)
        if reaped:
            print(f"proxy: {reaped}", file=sys.stderr, flush=True)
        phases = read_phases(run)
        phase = current_phase(phases)
        index = LossLogIndex.load(run.loss_log)
        try:
            resume = choose_resume(run.checkpoints, index, phase, set(), at_most=at)
        except SupervisorError as exc:
            raise PivotError(f"cannot pivot {run.root}: {exc}") from None
        step = resume.step
        max_steps = int(experiment.train.max_steps)
        if step >= max_steps:
            raise PivotError(f"{run.root} finished at step {step} (max_steps {max_steps}); a pivot there would "
                             "train nothing" + ("" if at is not None else " (--at STEP pivots from an earlier "
                                                "checkpoint)"))
        for reason in resume.skipped:
            print(f"proxy: not pivoting at {reason}", file=sys.stderr, flush=True)
        checkpoint = relative_checkpoint(step) if resume.path is not None else None
        # `proxy stop` finds our pid in .lock: a stop request waits until the pivot is whole
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            result = apply_pivot(run, step, caps, floors, policy, checkpoint)
            _offline_state(run, experiment, result, caps_path)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        logged = index.max_step()
        print(result.message(run), file=out, flush=True)
        if logged > step:
            print(f"steps {step + 1}..{logged} in .loss.json belong to phase {result.phase.phase - 1}; the next "
                  f"`proxy run` resumes from step {step} and trains them again under phase {result.phase.phase}",
                  file=out, flush=True)
        print(f"continue with: proxy run --run-dir {run.root}", file=out, flush=True)
        return EXIT_OK
    finally:
        run_lock.release()
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)


def _offline_state(run: RunDir, experiment, result: PivotResult, caps_path: Path) -> None:
    """.state.json for the new phase (the old one is in the archive): shown by `proxy status`."""
    from .sidecars import read_state
    from .supervisor import fresh_bandit

    state = read_state(run.state) or {}
    p = result.phase
    names = experiment.arm_names
    try:
        bandit, caps, floors = fresh_bandit(experiment, p, names)
        weights = [float(w) for w in bandit.weights()]
        bandit_state = bandit.state()
    except (ValueError, TypeError):
        caps, floors, weights, bandit_state = p.caps, p.floors, [0.0] * len(names), {}
    state.update({
        "step": p.start_step, "phase": p.phase, "policy": p.policy, "status": "stopped",
        "arms": {n: {"pulls": 0, "ema": None, "reward": None, "weight": weights[i], "cap": caps[n],
                     "floor": floors[n]} for i, n in enumerate(names)},
        "last_checkpoint": str(run.root / p.checkpoint) if p.checkpoint else None,
        "message": f"pivoted to phase {p.phase} at step {p.start_step} ({caps_path}); relaunch the run to continue",
        "bandit": bandit_state, "eta_s": None, "updated": time.time(),
    })
    state.setdefault("experiment", experiment.name)
    state.setdefault("max_steps", int(experiment.train.max_steps))
    if isinstance(state.get("engine"), dict):
        state["engine"]["alive"] = False
    atomic_write_json(run.state, state)
