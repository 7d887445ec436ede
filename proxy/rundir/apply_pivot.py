"""Applying a pivot to a run directory: archive the phase's sidecars, set aside newer checkpoints, append the phase.

Both ways in use this: the running proxy (supervision/pivot_desk.py) and
`proxy pivot` on a stopped run (commands/pivot.py); `proxy fork --caps` names
its archive the same way. docs/OPERATIONS.md, "Pivot".
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from .. import temp_names
from ..atomic import atomic_write_json, copy_synced, fsync_dir, make_dirs, storage_guard
from ..formats.checkpoint import checkpoint_step, list_checkpoints
from .history import write_receipt
from .layout import CHECKPOINTS, RunDir
from .phases import Phase, encode_phases, next_phase, read_phases, write_phases


def archive_name(phases: list[Phase], step: int, phase_number: int) -> str:
    """`pivot_<step>`; a second pivot at the same step gets `pivot_<step>_phase<N>`."""
    same = [p for p in phases if p.phase > 0 and p.phase < phase_number and p.start_step == step]
    return f"pivot_{step}" if not same else f"pivot_{step}_phase{phase_number}"


def archive_dir_for(run: RunDir, phases: list[Phase], phase_number: int) -> Path:
    """Where the pivot that started `phase_number` (>= 1) archived the previous phase's sidecars."""
    p = phases[phase_number]
    return run.archive / archive_name(phases, p.start_step, phase_number)


def _free_name(directory: Path, stem: str) -> Path:
    """`stem`, or `stem_2`, `stem_3`, ...: the first name not taken in `directory` (a rename there never
    replaces an earlier one; the caller holds the run)."""
    n = 1
    while True:
        path = directory / (stem if n == 1 else f"{stem}_{n}")
        if not path.exists() and not path.is_symlink():
            return path
        n += 1


@dataclass
class PivotResult:
    phase: Phase
    archive: Path
    moved: list[str]  # checkpoints newer than the pivot step, moved into the archive
    archived: list[str]  # the sidecars copied into the archive (only those that existed)

    def response(self, run: RunDir, request_id: str | None) -> dict:
        return {
            "id": request_id,
            "ok": True,
            "phase": self.phase.phase,
            "start_step": self.phase.start_step,
            "policy": self.phase.policy,
            "caps": self.phase.caps,
            "floors": self.phase.floors,
            "checkpoint": self.phase.checkpoint,
            "archive": str(self.archive.relative_to(run.root)),
            "moved": self.moved,
            "archived": self.archived,
            "message": self.message(run),
        }

    def message(self, run: RunDir) -> str:
        p = self.phase
        where = self.archive.relative_to(run.root)
        moved = f"; {len(self.moved)} newer checkpoint(s) of the old phase moved there" if self.moved else ""
        archived = (
            f"{' and '.join(self.archived)} archived in {where}"
            if self.archived
            else f"no sidecars to archive (its receipt is in {where})"
        )
        return (
            f"pivoted {run.root} at step {p.start_step}: phase {p.phase} ({p.policy}; caps "
            + ", ".join(f"{k} {v:g}" for k, v in p.caps.items())
            + "; floors "
            + ", ".join(f"{k} {v:g}" for k, v in p.floors.items())
            + f") starts at step {p.start_step + 1} from {p.checkpoint or 'scratch'}; {archived}{moved}"
        )


def apply_pivot(run: RunDir, step: int, caps: dict, floors: dict, policy: str, checkpoint: str | None) -> PivotResult:
    """Archive the sidecars, set aside newer checkpoints, append the phase. The caller holds the run
    (the live proxy, or the lock) and has made sure `checkpoint` (at `step`) is valid and covered.

    Order, for crash safety: the archive is built in a temp directory and renamed into place; the
    checkpoints after `step` (an old-phase trajectory the new phase must never resume from) are
    moved into it; then phases.json is replaced (the commit point); then `.samples.json` starts
    empty for the new phase. A crash before the commit leaves the old phase in force.
    """
    run.check_paths()  # checkpoints/ and archive/ are the run's own: nothing moves through a symlink
    phases = read_phases(run)
    number = len(phases)
    phase = next_phase(phases, step, policy, caps, floors, checkpoint)
    encode_phases(run, phases + [phase])  # a phases.json too large is refused before anything moves
    name = archive_name(phases, step, number)
    make_dirs(run.archive)
    final = run.archive / name
    temp_names.remove_leftovers(run.archive)  # of a pivot killed before its rename
    with storage_guard(run.archive, "create a temp directory in"):
        tmp = temp_names.make_dir(run.archive, name, temp_names.ARCHIVE_TMP)
    archived = []
    try:
        for src in (run.samples, run.state):
            if src.exists():
                copy_synced(src, tmp / src.name)
                archived.append(src.name)
        fsync_dir(tmp)
    except BaseException:  # a full disk, a sidecar that is not a regular file: nothing is left half-made
        temp_names.remove_entry(tmp)
        raise
    with storage_guard(final, "rename into"):  # a rename may need a directory block: a full disk is one line
        if final.exists() or final.is_symlink():  # left by a pivot interrupted before its commit: kept, aside
            final.rename(_free_name(run.archive, f"{name}.interrupted-{int(time.time())}"))
        os.rename(tmp, final)
    fsync_dir(run.archive)
    moved = []
    newer = [p for p in list_checkpoints(run.checkpoints) if (checkpoint_step(p) or 0) > step]
    if newer:
        aside = final / CHECKPOINTS
        make_dirs(aside)
        with storage_guard(aside, "move checkpoints into"):
            for p in sorted(newer):
                os.rename(p, aside / p.name)
                moved.append(p.name)
        fsync_dir(aside)
        fsync_dir(run.checkpoints)
    write_phases(run, phases + [phase])
    write_receipt(final, phase)
    fsync_dir(final)
    atomic_write_json(run.samples, [])
    return PivotResult(phase, final, moved, archived)
