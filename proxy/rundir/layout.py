"""The run directory: layout, the one-proxy lock, the frozen experiment, phases.json.

Layout (DESIGN.md, "Run directory"):

    RUN/experiment.json   frozen copy of the experiment
    RUN/checkpoints/      step_NNNNNN.bin, best.bin
    RUN/.loss.json        JSON Lines (loss_log.py)
    RUN/.samples.json     sample audits (sidecars.py)
    RUN/.state.json       snapshot for people and the dashboard (sidecars.py)
    RUN/phases.json       append-only list of phases
    RUN/archive/          pivot archives
    RUN/engine.log        the engine's stderr
    RUN/.lock             flock'ed by the running proxy; holds its pid
    RUN/.engine.json      pid of the engine the proxy launched last
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..atomic import atomic_write_bytes, atomic_write_json

RUNS_ROOT = Path("runs")


class RunDirError(Exception):
    """A problem with a run directory; the message is one line for the user."""


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def experiment(self) -> Path:
        return self.root / "experiment.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def best(self) -> Path:
        return self.checkpoints / "best.bin"

    @property
    def loss_log(self) -> Path:
        return self.root / ".loss.json"

    @property
    def samples(self) -> Path:
        return self.root / ".samples.json"

    @property
    def state(self) -> Path:
        return self.root / ".state.json"

    @property
    def phases(self) -> Path:
        return self.root / "phases.json"

    @property
    def archive(self) -> Path:
        return self.root / "archive"

    @property
    def engine_log(self) -> Path:
        return self.root / "engine.log"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    @property
    def engine_record(self) -> Path:
        return self.root / ".engine.json"

    @property
    def dashboard_log(self) -> Path:
        return self.root / "dashboard.log"

    def create(self) -> None:
        try:
            self.checkpoints.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirError(f"cannot create run directory {self.root}: {exc.strerror}") from None

    def exists(self) -> bool:
        return self.experiment.is_file()


def default_run_dir(experiment_name: str, runs_root: Path = RUNS_ROOT) -> Path:
    return runs_root / experiment_name


def _activity_time(run: Path) -> float | None:
    times = []
    for name in (".loss.json", ".state.json", ".lock", "experiment.json"):
        try:
            times.append((run / name).stat().st_mtime)
        except OSError:
            pass
    return max(times) if times else None


def most_recent_run(runs_root: Path = RUNS_ROOT) -> Path:
    """The run directory under `runs_root` that was active most recently."""
    candidates = []
    if runs_root.is_dir():
        for child in runs_root.iterdir():
            if child.is_dir() and (child / "experiment.json").is_file():
                t = _activity_time(child)
                if t is not None:
                    candidates.append((t, str(child), child))
    if not candidates:
        raise RunDirError(f"no run directory found under {runs_root}/ (pass --run-dir DIR)")
    return max(candidates)[2]


# ---------------------------------------------------------------- the lock

class RunLock:
    """One proxy per run directory: an exclusive flock on RUN/.lock holding the pid.

    The descriptor is not inherited by children (Python's default), so an
    orphaned engine never keeps a run locked.
    """

    def __init__(self, run: RunDir):
        self.run = run
        self.fd: int | None = None

    def acquire(self) -> "RunLock":
        try:
            fd = os.open(self.run.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RunDirError(f"cannot open {self.run.lock_file}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                pid = _read_pid(self.run.lock_file)
                who = f"proxy pid {pid}" if pid else "another proxy"
                raise RunDirError(f"run directory {self.run.root} is in use by {who} "
                                  f"(one proxy per run; `proxy stop --run-dir {self.run.root}` stops it)") from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.fsync(fd)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.ftruncate(self.fd, 0)
            except OSError:
                pass
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def lock_owner(run: RunDir) -> int | None:
    """The pid of the proxy holding the run's lock, or None when no proxy holds it."""
    try:
        fd = os.open(run.lock_file, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _read_pid(run.lock_file) or -1  # held
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


# ---------------------------------------------------------- frozen experiment

def _diff(a, b, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            out += _diff(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if a == b else [prefix or "(whole file)"]


def _normalized(experiment_cls, obj: dict) -> dict:
    try:
        return experiment_cls.model_validate(obj).model_dump(mode="json")
    except Exception:
        return obj


def freeze_experiment(run: RunDir, source: Path, experiment, allow_change: bool) -> list[str]:
    """Write the frozen copy on the first run; on later runs compare with it.

    Returns the dotted names of the fields that changed (empty when none).
    A changed experiment without `allow_change` raises RunDirError; with it, the
    frozen copy is replaced by the new experiment.
    """
    raw = source.read_bytes()
    if not run.experiment.exists():
        atomic_write_bytes(run.experiment, raw)
        return []
    try:
        frozen = json.loads(run.experiment.read_text())
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{run.experiment}: frozen experiment unreadable ({exc}); "
                          "fix or delete it to start again") from None
    cls = type(experiment)
    new = experiment.model_dump(mode="json") if hasattr(experiment, "model_dump") else json.loads(raw)
    old = _normalized(cls, frozen) if hasattr(cls, "model_validate") else frozen
    changed = _diff(old, new)
    if changed and not allow_change:
        shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
        raise RunDirError(f"{source} differs from the experiment frozen in {run.experiment} ({shown}); "
                          "pass --allow-experiment-change to continue with the new one")
    if changed:  # keep the old frozen copy: an audit trail, and the mark that the run changed
        run.archive.mkdir(exist_ok=True)
        atomic_write_bytes(run.archive / f"experiment_{time.time():.0f}.json", run.experiment.read_bytes())
        atomic_write_bytes(run.experiment, raw)
    return changed


def experiment_changed(run: RunDir) -> bool:
    """Whether the run ever continued under a changed experiment (--allow-experiment-change)."""
    return run.archive.is_dir() and any(run.archive.glob("experiment_*.json"))


# ---------------------------------------------------------------- phases.json

@dataclass
class Phase:
    """One entry of phases.json (docs/FORMATS.md)."""
    phase: int
    start_step: int
    policy: str
    caps: dict[str, float]
    floors: dict[str, float]
    time: float = field(default_factory=time.time)
    checkpoint: str | None = None

    @classmethod
    def from_dict(cls, obj: dict) -> "Phase":
        try:
            return cls(phase=int(obj["phase"]), start_step=int(obj["start_step"]), policy=str(obj["policy"]),
                       caps={str(k): float(v) for k, v in dict(obj.get("caps") or {}).items()},
                       floors={str(k): float(v) for k, v in dict(obj.get("floors") or {}).items()},
                       time=float(obj.get("time") or 0.0), checkpoint=obj.get("checkpoint"))
        except (KeyError, TypeError, ValueError) as exc:
            raise RunDirError(f"phases.json: malformed phase entry ({exc})") from None

    def to_dict(self) -> dict:
        return asdict(self)

    def contains(self, step: int) -> bool:
        """Steps after the phase's start belong to it (the start step is the previous phase's last)."""
        return step > self.start_step


def read_phases(run: RunDir) -> list[Phase]:
    try:
        obj = json.loads(run.phases.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{run.phases}: unreadable ({exc})") from None
    if not isinstance(obj, list):
        raise RunDirError(f"{run.phases}: not a JSON list")
    phases = [Phase.from_dict(p) for p in obj]
    for i, p in enumerate(phases):
        if p.phase != i:
            raise RunDirError(f"{run.phases}: phase {i} is numbered {p.phase}")
    return phases


def write_phases(run: RunDir, phases: list[Phase]) -> None:
    atomic_write_json(run.phases, [p.to_dict() for p in phases])


def first_phase(experiment) -> Phase:
    """Phase 0 from the experiment's arms and bandit policy."""
    return Phase(phase=0, start_step=0, policy=experiment.bandit.policy,
                 caps={a.name: float(a.cap) for a in experiment.arms},
                 floors={a.name: float(a.floor) for a in experiment.arms})


def ensure_phases(run: RunDir, experiment) -> list[Phase]:
    """phases.json with phase 0 written at run creation; returns the list."""
    phases = read_phases(run)
    if not phases:
        phases = [first_phase(experiment)]
        write_phases(run, phases)
    return phases


def append_phase(run: RunDir, start_step: int, policy: str, caps: dict, floors: dict,
                 checkpoint: str | None) -> Phase:
    """The seam for `proxy pivot`: append a new phase (the list is only ever appended to)."""
    phases = read_phases(run)
    phase = Phase(phase=len(phases), start_step=start_step, policy=policy, caps=dict(caps),
                  floors=dict(floors), checkpoint=checkpoint)
    write_phases(run, phases + [phase])
    return phase
