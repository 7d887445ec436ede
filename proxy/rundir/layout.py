"""The run directory's layout: every file name in it, written once (docs/FORMATS.md, docs/OPERATIONS.md).

    RUN/experiment.json        frozen copy of the experiment (rundir/frozen.py)
    RUN/checkpoints/           step_NNNNNN.bin (formats/checkpoint.py), best.bin (rundir/retention.py)
    RUN/.loss.json             JSON Lines, append-only (formats/loss_log.py)
    RUN/.samples.json          sample audits (formats/samples.py)
    RUN/.state.json            snapshot for people and the dashboard (formats/state.py)
    RUN/phases.json            append-only list of phases (rundir/phases.py)
    RUN/archive/               pivot archives, replaced experiments (rundir/pivot.py, rundir/frozen.py)
    RUN/engine.log             the engine's stderr
    RUN/dashboard.log          the dashboard's output when `proxy run` started it
    RUN/.lock                  flock'ed by the running proxy; holds its pid (rundir/lock.py)
    RUN/.engine.json           pid of the engine the proxy launched last (supervision/engine_process.py)
    RUN/.pivot.lock            one `proxy pivot` at a time (rundir/lock.py)
    RUN/.pivot_request.json    a live pivot's request, .pivot_claimed.json once taken, and the answer in
    RUN/.pivot_response.json   (formats/pivot_request.py)

The proxy and the dashboard both name files through this module.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..formats.checkpoint import checkpoint_name

RUNS_ROOT = Path("runs")

EXPERIMENT = "experiment.json"
CHECKPOINTS = "checkpoints"
BEST = "best.bin"
LOSS_LOG = ".loss.json"
SAMPLES = ".samples.json"
STATE = ".state.json"
PHASES = "phases.json"
ARCHIVE = "archive"
ENGINE_LOG = "engine.log"
DASHBOARD_LOG = "dashboard.log"
LOCK = ".lock"
ENGINE_RECORD = ".engine.json"
PIVOT_LOCK = ".pivot.lock"
PIVOT_REQUEST = ".pivot_request.json"
PIVOT_CLAIMED = ".pivot_claimed.json"
PIVOT_RESPONSE = ".pivot_response.json"

# Files whose modification time says when a run was last active.
ACTIVITY_FILES = (LOSS_LOG, STATE, LOCK, EXPERIMENT)


class RunDirError(Exception):
    """A problem with a run directory; the message is one line for the user."""


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def experiment(self) -> Path:
        return self.root / EXPERIMENT

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def best(self) -> Path:
        return self.checkpoints / BEST

    @property
    def loss_log(self) -> Path:
        return self.root / LOSS_LOG

    @property
    def samples(self) -> Path:
        return self.root / SAMPLES

    @property
    def state(self) -> Path:
        return self.root / STATE

    @property
    def phases(self) -> Path:
        return self.root / PHASES

    @property
    def archive(self) -> Path:
        return self.root / ARCHIVE

    @property
    def engine_log(self) -> Path:
        return self.root / ENGINE_LOG

    @property
    def dashboard_log(self) -> Path:
        return self.root / DASHBOARD_LOG

    @property
    def lock_file(self) -> Path:
        return self.root / LOCK

    @property
    def engine_record(self) -> Path:
        return self.root / ENGINE_RECORD

    @property
    def pivot_lock(self) -> Path:
        return self.root / PIVOT_LOCK

    @property
    def pivot_request(self) -> Path:
        return self.root / PIVOT_REQUEST

    @property
    def pivot_claimed(self) -> Path:
        return self.root / PIVOT_CLAIMED

    @property
    def pivot_response(self) -> Path:
        return self.root / PIVOT_RESPONSE

    def create(self) -> None:
        try:
            self.checkpoints.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirError(f"cannot create run directory {self.root}: {exc.strerror}") from None

    def exists(self) -> bool:
        return self.experiment.is_file()


def relative_checkpoint(step: int) -> str:
    """How phases.json names a checkpoint: relative to the run directory (`checkpoints/step_001100.bin`)."""
    return f"{CHECKPOINTS}/{checkpoint_name(step)}"


def default_run_dir(experiment_name: str, runs_root: Path = RUNS_ROOT) -> Path:
    return runs_root / experiment_name


def activity_time(run: Path) -> float | None:
    """When the run was last active: the newest modification of its ACTIVITY_FILES (None: none exists)."""
    times = []
    for name in ACTIVITY_FILES:
        try:
            times.append((run / name).stat().st_mtime)
        except OSError:
            pass
    return max(times) if times else None


def most_recent_run(runs_root: Path = RUNS_ROOT, markers: tuple[str, ...] = (EXPERIMENT,)) -> Path:
    """The directory under `runs_root` holding one of `markers` that was active most recently."""
    candidates = []
    if runs_root.is_dir():
        for child in runs_root.iterdir():
            if child.is_dir() and any((child / m).is_file() for m in markers):
                t = activity_time(child)
                if t is not None:
                    candidates.append((t, str(child), child))
    if not candidates:
        raise RunDirError(f"no run directory found under {runs_root}/ (pass --run-dir DIR)")
    return max(candidates)[2]
