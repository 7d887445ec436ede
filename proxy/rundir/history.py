"""The run's phase history (phases.json) checked against the other records of it.

phases.json is the commit point of a pivot, but not its only trace:

- every `.loss.json` step entry names the phase it was trained in, and a
  phase owns only the steps after its start step;
- every committed pivot leaves a receipt, `archive/<pivot dir>/phase.json`,
  a copy of the phase it appended (written right after the commit, so an
  interrupted pivot leaves none);
- every checkpoint's metadata names the phase that wrote it, and a pivot at
  step k sets aside the older phases' checkpoints newer than k.

A phases.json deleted, restored from an old copy or edited would let a
relaunch resume under the old policy and overwrite or delete what was made
after a pivot. So `proxy run`, `proxy pivot` and `proxy fork` check the history
first; a contradiction is one line (RunDirError) and nothing is changed.
docs/OPERATIONS.md, "Pivot".
"""

from __future__ import annotations

from pathlib import Path

from ..atomic import json_bytes, write_new
from ..formats import bounded_json
from ..formats.checkpoint import checkpoint_files, checkpoint_step, read_trailer
from ..formats.loss_log import LossLogIndex
from .layout import PIVOT_RECEIPT, RunDir, RunDirError
from .phases import Phase

PIVOT_DIRS = "pivot_*"  # the archive directories pivots make (rundir/apply_pivot.py archive_name)
SHOWN = 3  # contradictions named in the message; the rest are counted


def write_receipt(archive_dir: Path, phase: Phase) -> None:
    """The pivot's receipt in its archive directory (after phases.json committed the phase): written whole,
    never over an existing receipt."""
    write_new(archive_dir / PIVOT_RECEIPT, json_bytes(phase.to_dict()))


def _read_receipt(run: RunDir, path: Path) -> dict | None:
    try:
        obj = run.read_json(path)
    except FileNotFoundError:
        return None
    if not isinstance(obj, dict):
        raise RunDirError(f"{path}: not a pivot receipt (not a JSON object)")
    return obj


def _same_phase(receipt: dict, phase: Phase) -> list[str]:
    """The fields in which a receipt and phases.json's entry differ (time excepted)."""
    ours = phase.to_dict()
    return [k for k in ("phase", "start_step", "policy", "caps", "floors", "checkpoint") if receipt.get(k) != ours[k]]


def _phases_json(phases: list[Phase]) -> list[str]:
    problems = []
    for i, p in enumerate(phases):
        if i == 0 and p.start_step != 0:
            problems.append(f"phase 0 starts at step {p.start_step}, not 0")
        if i > 0 and p.start_step < phases[i - 1].start_step:
            problems.append(
                f"phase {i} starts at step {p.start_step}, before phase {i - 1} (step {phases[i - 1].start_step})"
            )
        if p.checkpoint is not None and checkpoint_step(p.checkpoint) != p.start_step:
            problems.append(f"phase {i} starts at step {p.start_step} from {p.checkpoint!r}")
    return problems


def _log(phases: list[Phase], index: LossLogIndex) -> list[str]:
    problems = []
    for number, first in sorted(index.phase_first.items()):
        if not 0 <= number < len(phases):
            problems.append(
                f".loss.json logs entries of phase {number} (from step {first}), phases.json has "
                f"phases 0..{len(phases) - 1}"
            )
        elif index.phase_first_step.get(number, first + 1) <= phases[number].start_step:
            problems.append(
                f".loss.json logs step {index.phase_first_step[number]} in phase {number}, which "
                f"starts after step {phases[number].start_step}"
            )
    return problems


def _receipts(run: RunDir, phases: list[Phase]) -> list[str]:
    problems: list[str] = []
    if not run.archive.is_dir():
        return problems
    for directory in sorted(run.archive.glob(PIVOT_DIRS)):
        if not directory.is_dir() or directory.is_symlink():
            continue
        receipt = _read_receipt(run, directory / PIVOT_RECEIPT)
        if receipt is None:  # a pivot interrupted before its commit, or one made before receipts
            continue
        number = receipt.get("phase")
        where = f"archive/{directory.name}/{PIVOT_RECEIPT}"
        if not isinstance(number, int) or number < 1:
            problems.append(f"{where} names no phase >= 1")
        elif number >= len(phases):
            problems.append(
                f"{where} records the pivot to phase {number} at step {receipt.get('start_step')}, "
                f"phases.json has phases 0..{len(phases) - 1}"
            )
        else:
            differ = _same_phase(receipt, phases[number])
            if differ:
                problems.append(f"{where} and phases.json differ on phase {number} ({', '.join(differ)})")
    return problems


def _checkpoint_phase(path: Path) -> int | None:
    """The phase in a checkpoint's metadata (the proxy's --meta), or None when it names none."""
    trailer = read_trailer(path)
    try:
        meta = bounded_json.loads(trailer.meta)["meta"] if trailer is not None else None
    except (ValueError, TypeError, KeyError, RecursionError):
        return None
    number = meta.get("phase") if isinstance(meta, dict) else None
    return number if isinstance(number, int) and not isinstance(number, bool) else None


def _checkpoints(run: RunDir, phases: list[Phase]) -> list[str]:
    problems = []
    for path in checkpoint_files(run.checkpoints):
        number, step = _checkpoint_phase(path), checkpoint_step(path)
        if number is None or step is None:
            continue
        if not 0 <= number < len(phases):
            problems.append(
                f"checkpoints/{path.name} was written in phase {number}, phases.json has phases 0..{len(phases) - 1}"
            )
            continue
        later = [p for p in phases[number + 1 :] if step > p.start_step]
        if later:
            problems.append(
                f"checkpoints/{path.name} (phase {number}) is newer than step {later[0].start_step}, "
                f"where phase {later[0].phase} starts (a pivot sets such checkpoints aside)"
            )
    return problems


def check_history(run: RunDir, phases: list[Phase], index: LossLogIndex) -> None:
    """RunDirError, one line, when phases.json contradicts itself, the log, a pivot receipt or a
    checkpoint's phase. `phases` is the history to check (phase 0 alone for a run about to be created)."""
    problems = _phases_json(phases) + _log(phases, index) + _receipts(run, phases) + _checkpoints(run, phases)
    if problems:
        more = f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
        raise RunDirError(
            f"{run.phases} contradicts the run's own records: {'; '.join(problems[:SHOWN])}{more}; "
            "nothing was changed: restore the phases.json this run wrote (docs/OPERATIONS.md, "
            '"Phase history")'
        )
