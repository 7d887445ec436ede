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
    RUN/.overrides.json        the `--set` overrides of the last launch (rundir/overrides_record.py)
    RUN/tensorboard/           TensorBoard event files and the tracker's marks (tracking/)
    RUN/wandb/                 the W&B run (offline files, its id) the tracker writes (tracking/)
    RUN/tracker.log            the tracker's output when `proxy run` started it
    RUN/.pivot.lock            one `proxy pivot` at a time (rundir/lock.py)
    RUN/.pivot_request.json    a live pivot's request, .pivot_claimed.json once taken, and the answer in
    RUN/.pivot_response.json   (rundir/pivot_request.py)

The proxy and the dashboard both name files through this module.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import temp_names
from ..atomic import make_dirs
from ..errors import EXIT_USAGE, ProxyError
from ..formats import bounded_json

# The names themselves live in the leaf proxy/run_names.py (formats/ reads them there too); every other
# module takes them from here, with the directory they name.
from ..run_names import (
    ACTIVITY_FILES,
    ARCHIVE,
    BEST,
    CHECKPOINTS,
    DASHBOARD_LOG,
    DATA,
    DATA_DEFINITION,
    ENGINE_LOG,
    ENGINE_LOG_TAIL,
    ENGINE_RECORD,
    EXPERIMENT,
    EXPERIMENT_SEAL,
    IDENTITY,
    LOSS_LINE_LIMIT,
    LOSS_LOG,
    OVERRIDES,
    OWN_DIRS,
    PHASES,
    PIVOT_CLAIMED,
    PIVOT_LOCK,
    PIVOT_RECEIPT,
    PIVOT_REQUEST,
    PIVOT_RESPONSE,
    QUALIFICATION,
    READ_LIMITS,
    RUNS_ROOT,
    SAMPLES,
    STATE,
    TENSORBOARD,
    TOKENIZER,
    TRACKER_LOG,
    TRACKER_MARKS,
    VAL_SHARD_SUFFIX,
    WANDB,
    WANDB_RUN_ID,
    checkpoint_name,
)
from ..safe_fs import UnsafeFileError, file_kind, read_regular


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
                raise RunDirError(
                    f"{path} is a symlink{target}; a run writes and deletes only inside its own "
                    f"directory: make {name}/ a real directory of the run (nothing was changed)"
                )
            if not stat.S_ISDIR(mode):
                kind = "a regular file" if stat.S_ISREG(mode) else file_kind(mode)
                raise RunDirError(f"{path} is {kind}, not a directory (nothing was changed)")

    def remove_leftovers(self) -> list[str]:
        """Remove the temp files and directories (temp_names.py) that killed processes left in the run:
        in its root, in OWN_DIRS and in archive/'s subdirectories (a pivot's). For a holder of the run's
        lock, before it writes; the paths removed, relative to the run."""
        dirs = [self.root] + [self.root / name for name in OWN_DIRS]
        try:
            dirs += [self.archive / e.name for e in os.scandir(self.archive) if e.is_dir(follow_symlinks=False)]
        except OSError:  # no archive/, or not a directory (check_paths says so)
            pass
        return [str((d / name).relative_to(self.root)) for d in dirs for name in temp_names.remove_leftovers(d)]

    def read_small(self, path: Path) -> bytes:
        """One of this run's small files (`path.name` in READ_LIMITS), by safe_fs's rules: FileNotFoundError
        when absent; UnsafeFileError (one line) for anything but a regular file within its cap, reached
        through no symlink out of the run directory."""
        return read_regular(path, READ_LIMITS[path.name], within=self.root)

    def read_json(self, path: Path) -> Any:  # parsed JSON, which each caller checks
        """One of this run's small JSON files, parsed: FileNotFoundError when absent; RunDirError (one line)
        when it is not a regular file within its cap (read_small), or not JSON."""
        try:
            return bounded_json.loads(self.read_small(path))
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
