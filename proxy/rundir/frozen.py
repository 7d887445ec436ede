"""The frozen experiment: RUN/experiment.json, written on the first launch and compared on every later one.

Until the run's first trained step the frozen copy is provisional: a launch
that failed before training (a bad source, a data preparation stopped) froze
nothing binding, and the next launch replaces the copy without a flag
(`started_training` says when it becomes binding). The same holds for
phase 0 and the data definition (rundir/data.py).

A launch with a changed experiment stops with the changed fields named,
unless --allow-experiment-change: then the old frozen copy is kept as
RUN/archive/experiment_<time>.json (an audit trail, and the mark that the
run's older checkpoints carry other optimizer settings) and replaced.

The frozen copy is sealed: RUN/.experiment.seal.json holds the SHA-256 of the
bytes the proxy froze and their content as the schema reads it. A frozen copy
edited by hand (its bytes no longer match the seal) would resume the run under
settings it was not trained with, and every replayed step would then differ;
it is refused with one line naming the edited fields, unless
--allow-experiment-change, which archives the sealed version as above. A run
frozen before seals existed is sealed as it is found.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path

from ..atomic import atomic_write_bytes, json_bytes, make_dirs, write_unique
from ..config.config_file import CONFIG_FILE_LIMIT
from ..config.experiment import Experiment, load_experiment
from ..errors import EXIT_USAGE, ProxyError
from ..formats import bounded_json
from ..formats.checkpoint import checkpoint_step, list_checkpoints
from ..formats.loss_log import LossLogIndex
from ..safe_fs import UnsafeFileError, read_regular
from .layout import RunDir, RunDirError
from .lr_change import lr_change_note

REPLACED_PATTERN = "experiment_*.json"  # in RUN/archive/
REPLACED_NAME = re.compile(r"^experiment_(\d+)(?:_(\d+))?\.json$")
SHOWN_FIELDS = 6  # changed fields named in a message; the rest are counted


def _diff(a: object, b: object, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            out += _diff(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if a == b else [prefix or "(whole file)"]


def _shown(fields: list[str]) -> str:
    more = len(fields) - SHOWN_FIELDS
    return ", ".join(fields[:SHOWN_FIELDS]) + (f" and {more} more" if more > 0 else "")


def _normalized(obj: object) -> object:
    """The frozen JSON as the schema reads it (defaults filled in), or as it is when it no longer validates."""
    try:
        return Experiment.model_validate(obj).model_dump(mode="json")
    except Exception:
        return obj


def _parse(raw: bytes, path: Path) -> object:
    try:
        return bounded_json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise RunDirError(f"{path}: frozen experiment unreadable ({exc}); fix or delete it to start again") from None


def _read_frozen(run: RunDir) -> bytes:
    try:
        return run.read_small(run.experiment)
    except UnsafeFileError as exc:
        raise RunDirError(str(exc)) from None
    except OSError as exc:
        raise RunDirError(f"{run.experiment}: frozen experiment unreadable ({exc.strerror})") from None


def _write_seal(run: RunDir, raw: bytes) -> None:
    seal = {"sha256": hashlib.sha256(raw).hexdigest(), "experiment": _normalized(_parse(raw, run.experiment))}
    atomic_write_bytes(run.experiment_seal, json_bytes(seal))


def _read_seal(run: RunDir) -> dict | None:
    """The seal, or None when there is none (a run frozen before seals) or it is damaged (resealed)."""
    try:
        seal = bounded_json.loads(run.read_small(run.experiment_seal))
    except FileNotFoundError:
        return None
    except UnsafeFileError as exc:
        raise RunDirError(str(exc)) from None
    except (OSError, ValueError, RecursionError):
        return None
    ok = isinstance(seal, dict) and isinstance(seal.get("sha256"), str) and "experiment" in seal
    return seal if ok else None


def edited_fields(run: RunDir, frozen_raw: bytes) -> tuple[list[str], dict | None]:
    """(the fields of the frozen experiment edited since the proxy sealed it, the seal). The fields are
    [] when the bytes match the seal or there is no usable seal (None)."""
    seal = _read_seal(run)
    if seal is None or seal["sha256"] == hashlib.sha256(frozen_raw).hexdigest():
        return [], seal
    return _diff(seal["experiment"], _normalized(_parse(frozen_raw, run.experiment))), seal


def check_seal(run: RunDir, allow_change: bool) -> None:
    """Refuse (RunDirError, one line naming the fields) a frozen experiment edited since it was sealed;
    with `allow_change`, archive the sealed version and seal the edited one. A formatting-only edit is
    resealed; a missing or damaged seal is written from the frozen copy."""
    raw = _read_frozen(run)
    fields, seal = edited_fields(run, raw)
    if seal is not None and seal["sha256"] == hashlib.sha256(raw).hexdigest():
        return
    if fields and not allow_change:
        raise RunDirError(
            f"{run.experiment} was edited after the run froze it ({_shown(fields)}); restore it "
            f"(the frozen values are in {run.experiment_seal}), or pass --allow-experiment-change "
            "to continue with the edited one"
        )
    if fields and seal is not None:  # (fields come only from a seal)
        _archive(run, json_bytes(seal["experiment"]))
    _write_seal(run, raw)


def _archive(run: RunDir, frozen_raw: bytes) -> None:
    """The replaced frozen experiment, as archive/experiment_<seconds>.json (a second one in the same
    second gets _2, _3, ...), never replacing an earlier one."""
    make_dirs(run.archive)
    write_unique(run.archive, f"experiment_{time.time():.0f}", ".json", frozen_raw)


def started_training(run: RunDir, index: LossLogIndex, phases: list) -> bool:
    """Whether the run ever trained a step: a step in its log, a checkpoint past step 0, or a pivot. Until
    then what a launch froze is provisional."""
    return (
        bool(index.steps)
        or len(phases) > 1
        or any((checkpoint_step(p) or 0) > 0 for p in list_checkpoints(run.checkpoints))
    )


@dataclass(frozen=True)
class Freeze:
    changed: list[str]  # the dotted names of the fields that changed (empty when none)
    lr_note: str | None = None  # what the change does to the next step's learning rate (rundir/lr_change.py)


def freeze_experiment(
    run: RunDir,
    source: Path,
    experiment: Experiment,
    allow_change: bool,
    provisional: bool = False,
    effective: bytes | None = None,
    next_step: int = 1,
) -> Freeze:
    """Write the frozen copy (and its seal) on the first run, or over a provisional one (no step trained
    yet); on later runs check the seal and compare.

    A changed experiment without `allow_change` raises RunDirError; with it, the
    frozen copy is replaced by the new experiment. Either way a change to the learning-rate schedule
    says what it does to the rate of `next_step` (the step after the newest trained). `effective`: the
    bytes to freeze instead of the file's, the experiment with its `--set` overrides applied
    (config/overrides.py).
    """
    try:
        raw = effective if effective is not None else read_regular(source, CONFIG_FILE_LIMIT)
    except (OSError, UnsafeFileError) as exc:  # it was just read and validated; it changed meanwhile
        raise RunDirError(f"{source}: cannot read it again ({exc})") from None
    if provisional or not run.experiment.exists():
        atomic_write_bytes(run.experiment, raw)
        _write_seal(run, raw)
        return Freeze([])
    check_seal(run, allow_change)
    frozen_raw = _read_frozen(run)
    frozen = _normalized(_parse(frozen_raw, run.experiment))
    changed = _diff(frozen, experiment.model_dump(mode="json"))
    note = lr_change_note(frozen, experiment.train, next_step) if changed and isinstance(frozen, dict) else None
    if changed and not allow_change:
        raise RunDirError(
            f"{source} differs from the experiment frozen in {run.experiment} ({_shown(changed)}); "
            + (f"{note}; " if note else "")
            + "pass --allow-experiment-change to continue with the new one"
        )
    if changed:  # keep the old frozen copy: an audit trail, and the mark that the run changed
        _archive(run, frozen_raw)
        atomic_write_bytes(run.experiment, raw)
        _write_seal(run, raw)
    return Freeze(changed, note)


def _replaced_order(path: Path) -> tuple[int, int, str]:
    """experiment_<seconds>[_<n>].json in the order written: by the second, then the counter."""
    match = REPLACED_NAME.match(path.name)
    return (int(match.group(1)), int(match.group(2) or 1), path.name) if match else (0, 0, path.name)


def replaced_experiments(run: RunDir) -> list[Path]:
    """The frozen experiments --allow-experiment-change replaced, oldest first."""
    return sorted(run.archive.glob(REPLACED_PATTERN), key=_replaced_order) if run.archive.is_dir() else []


def experiment_changed(run: RunDir) -> bool:
    """Whether the run ever continued under a changed experiment (--allow-experiment-change)."""
    return bool(replaced_experiments(run))


def load_frozen_experiment(run: RunDir) -> Experiment:
    """The experiment frozen in the run (its sources are not checked: a stopped run may have moved).
    A frozen copy edited since it was sealed is refused (nothing is written: the run may be live)."""
    fields, _seal = edited_fields(run, _read_frozen(run))
    if fields:
        raise ProxyError(
            f"{run.experiment} was edited after the run froze it ({_shown(fields)}); restore it "
            f"(the frozen values are in {run.experiment_seal})",
            EXIT_USAGE,
        )
    return load_experiment(run.experiment, check_sources=False)
