"""The run directory's layout: every file name in it, written once (docs/FORMATS.md, docs/OPERATIONS.md).

    RUN/                       the directory itself is flock'ed by the running proxy (rundir/lock.py)
    RUN/experiment.json        frozen copy of the experiment (rundir/frozen.py)
    RUN/.experiment.seal.json  its SHA-256 and content as the proxy froze it, to catch edits (rundir/frozen.py)
    RUN/checkpoints/           step_NNNNNN.bin (formats/checkpoint.py), best.bin (rundir/retention.py)
    RUN/.loss.json             JSON Lines, append-only (formats/loss_log.py)
    RUN/.samples.json          sample audits (formats/samples.py)
    RUN/.state.json            snapshot for people and the dashboard (formats/state.py)
    RUN/phases.json            append-only list of phases (rundir/phases.py)
    RUN/data/                  the frozen data definition: data.json, tokenizer.json, <arm>.val.tok (rundir/data.py)
    RUN/archive/               pivot archives, replaced experiments (rundir/apply_pivot.py, rundir/frozen.py)
    RUN/engine.log             the engine's stderr
    RUN/dashboard.log          the dashboard's output when `proxy run` started it
    RUN/.run.json              the run id and the directory it was minted in (rundir/identity.py)
    RUN/.engine.json           the engine the proxy launched last, to verify before any signal
                               (supervision/engine_record.py)
    RUN/.qualification.json    the CUDA engine's fast paths this run uses, and their checks (qualification.py)
    RUN/archive/pivot_<k>/phase.json   a committed pivot's receipt (rundir/history.py)
    RUN/.overrides.json        the `--set` overrides of the last launch (formats/overrides_record.py)
    RUN/tensorboard/           TensorBoard event files and the tracker's marks (tracking/)
    RUN/wandb/                 the W&B run (offline files, its id) the tracker writes (tracking/)
    RUN/tracker.log            the tracker's output when `proxy run` started it
    RUN/.pivot.lock            one `proxy pivot` at a time (rundir/lock.py)
    RUN/.pivot_request.json    a live pivot's request, .pivot_claimed.json once taken, and the answer in
    RUN/.pivot_response.json   (formats/pivot_request.py)

The proxy and the dashboard both name files through this module.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..atomic import make_dirs
from ..errors import EXIT_USAGE, ProxyError
from ..formats.checkpoint import checkpoint_name
from ..safe_fs import UnsafeFileError, file_kind, read_regular

RUNS_ROOT = Path("runs")

EXPERIMENT = "experiment.json"
EXPERIMENT_SEAL = ".experiment.seal.json"
CHECKPOINTS = "checkpoints"
BEST = "best.bin"
LOSS_LOG = ".loss.json"
SAMPLES = ".samples.json"
STATE = ".state.json"
PHASES = "phases.json"
DATA = "data"  # the frozen data definition (rundir/data.py): these three names, inside it
DATA_DEFINITION = "data.json"
TOKENIZER = "tokenizer.json"
VAL_SHARD_SUFFIX = ".val.tok"  # <arm>.val.tok
ARCHIVE = "archive"
ENGINE_LOG = "engine.log"
DASHBOARD_LOG = "dashboard.log"
IDENTITY = ".run.json"
ENGINE_RECORD = ".engine.json"
QUALIFICATION = ".qualification.json"
OVERRIDES = ".overrides.json"
TENSORBOARD = "tensorboard"
WANDB = "wandb"
TRACKER_LOG = "tracker.log"
TRACKER_MARKS = ".marks.json"  # in tensorboard/ and in wandb/: the last step each sink wrote (tracking/marks.py)
WANDB_RUN_ID = ".run_id.json"  # in wandb/: the W&B run id a resumed run appends to
PIVOT_LOCK = ".pivot.lock"
PIVOT_REQUEST = ".pivot_request.json"
PIVOT_CLAIMED = ".pivot_claimed.json"
PIVOT_RESPONSE = ".pivot_response.json"
PIVOT_RECEIPT = "phase.json"  # in a pivot's archive directory: the phase it committed (rundir/history.py)

# The directories inside a run that the proxy and the engine write and delete in: each must be a real
# directory of the run, never a symlink (a `checkpoints` linked to another run would have this run's
# retention delete that run's checkpoints).
OWN_DIRS = (CHECKPOINTS, ARCHIVE)

# Files whose modification time says when a run was last active.
ACTIVITY_FILES = (LOSS_LOG, STATE, EXPERIMENT)

# The most bytes a reader takes from each small file of a run directory (proxy/safe_fs.py refuses a
# larger one, with one line). The writers stay far below: samples.py trims `.samples.json` to its cap.
READ_LIMITS = {EXPERIMENT: 1 << 20, EXPERIMENT_SEAL: 4 << 20, PHASES: 4 << 20, STATE: 4 << 20, SAMPLES: 32 << 20,
               ENGINE_RECORD: 64 << 10, OVERRIDES: 64 << 10, TRACKER_MARKS: 64 << 10,
               WANDB_RUN_ID: 4 << 10, IDENTITY: 4 << 10, QUALIFICATION: 64 << 10,
               PIVOT_REQUEST: 1 << 20, PIVOT_CLAIMED: 1 << 20,
               PIVOT_RESPONSE: 1 << 20, PIVOT_RECEIPT: 1 << 20, DATA_DEFINITION: 4 << 20, TOKENIZER: 64 << 20}
# A validation shard in data/ may be as large as data.json says (its size and SHA-256 are checked there).
LOSS_LINE_LIMIT = 1 << 20  # the longest `.loss.json` line read; a longer one is skipped like a torn one
ENGINE_LOG_TAIL = 4096  # bytes of engine.log read back for a crash's reason


class RunDirError(ProxyError):
    """A problem with a run directory; the message is one line for the user."""

    code = EXIT_USAGE


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def experiment(self) -> Path:
        return self.root / EXPERIMENT

    @property
    def experiment_seal(self) -> Path:
        return self.root / EXPERIMENT_SEAL

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def best(self) -> Path:
        return self.checkpoints / BEST

    @property
    def overrides(self) -> Path:
        return self.root / OVERRIDES

    @property
    def tensorboard(self) -> Path:
        return self.root / TENSORBOARD

    @property
    def wandb(self) -> Path:
        return self.root / WANDB

    @property
    def tracker_log(self) -> Path:
        return self.root / TRACKER_LOG

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
    def data_dir(self) -> Path:
        return self.root / DATA

    @property
    def data_definition(self) -> Path:
        return self.root / DATA / DATA_DEFINITION

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
    def identity(self) -> Path:
        return self.root / IDENTITY

    @property
    def engine_record(self) -> Path:
        return self.root / ENGINE_RECORD

    @property
    def qualification(self) -> Path:
        return self.root / QUALIFICATION

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
        """The run directory and its checkpoints/, made if absent (RunDirError: check_paths refuses them)."""
        self.check_paths()
        try:
            make_dirs(self.checkpoints)  # a full or read-only disk: StorageError
        except OSError as exc:
            raise RunDirError(f"cannot create run directory {self.root}: {exc.strerror}") from None

    def exists(self) -> bool:
        return self.experiment.is_file()

    def check_paths(self) -> None:
        """RunDirError (one line) unless each of OWN_DIRS that exists is a real directory inside the run:
        no symlink, nothing else under its name. Checked at every launch and pivot, and before retention
        deletes anything."""
        for name in OWN_DIRS:
            path = self.root / name
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise RunDirError(f"{path}: {exc.strerror}") from None
            if stat.S_ISLNK(mode):
                try:
                    target = f" to {os.readlink(path)}"
                except OSError:
                    target = ""
                raise RunDirError(f"{path} is a symlink{target}; a run writes and deletes only inside its own "
                                  f"directory: make {name}/ a real directory of the run (nothing was changed)")
            if not stat.S_ISDIR(mode):
                kind = "a regular file" if stat.S_ISREG(mode) else file_kind(mode)
                raise RunDirError(f"{path} is {kind}, not a directory (nothing was changed)")

    def read_small(self, path: Path) -> bytes:
        """One of this run's small files (`path.name` in READ_LIMITS), by safe_fs's rules: FileNotFoundError
        when absent; UnsafeFileError (one line) for anything but a regular file within its cap, reached
        through no symlink out of the run directory."""
        return read_regular(path, READ_LIMITS[path.name], within=self.root)

    def read_json(self, path: Path):
        """One of this run's small JSON files, parsed: FileNotFoundError when absent; RunDirError (one line)
        when it is not a regular file within its cap (read_small), or not JSON."""
        try:
            return json.loads(self.read_small(path))
        except FileNotFoundError:
            raise
        except UnsafeFileError as exc:
            raise RunDirError(str(exc)) from None
        except (OSError, ValueError, RecursionError) as exc:
            raise RunDirError(f"{path}: unreadable ({exc})") from None


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
