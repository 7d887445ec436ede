"""Checkpoint retention: the last K, every Mth as a milestone, the best by validation loss.

Never deleted: any checkpoint a resume or a pivot needs (the caller passes
those steps as `protected`: the newest checkpoint the log covers, the one the
current engine launch resumed from, and every checkpoint named in phases.json).
best.bin is a copy, written atomically; it is never a resume candidate
(loaders consider only step_*.bin).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..atomic import atomic_copy, storage_guard
from ..formats.checkpoint import checkpoint_files, checkpoint_step
from ..safe_fs import NO_FOLLOW
from .layout import RunDir
from .phases import Phase

DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | NO_FOLLOW | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class RetentionPolicy:
    keep_last: int = 3
    milestone_every: int = 1000

    def is_milestone(self, step: int) -> bool:
        return self.milestone_every > 0 and step > 0 and step % self.milestone_every == 0


def plan_retention(steps: list[int], policy: RetentionPolicy, protected: set[int]) -> list[int]:
    """The steps to delete, oldest first. Pure. keep_last 0 keeps every checkpoint
    (docs/EXPERIMENTS.md), as the engine's --keep-last 0 does."""
    if policy.keep_last <= 0:
        return []
    ordered = sorted(set(steps))
    keep = set(ordered[-policy.keep_last :])
    keep |= {s for s in ordered if policy.is_milestone(s)}
    keep |= set(protected)
    return [s for s in ordered if s not in keep]


def apply_retention(run: RunDir, policy: RetentionPolicy, protected: set[int], durable_through: int) -> list[Path]:
    """Delete the checkpoints plan_retention names among the durable ones, those of steps up to
    `durable_through` (the newest the engine announced); return the deleted paths. A newer file is
    being written or was never announced: it is neither counted among the last K nor deleted. Files
    under a checkpoint's name that are not shaped like one (a 0-byte file, a directory) are neither
    counted nor deleted.

    Only inside the run: checkpoints/ must be a real directory of it (RunDir.check_paths, RunDirError
    otherwise), and each name is unlinked relative to that directory's own descriptor, opened without
    following a symlink, so nothing outside the run is ever deleted."""
    run.check_paths()
    checkpoint_dir = run.checkpoints
    by_step = {
        step: p
        for p in checkpoint_files(checkpoint_dir)
        if (step := checkpoint_step(p)) is not None and step <= durable_through
    }
    doomed = plan_retention(list(by_step), policy, protected)
    if not doomed:
        return []
    deleted = []
    fd = os.open(checkpoint_dir, DIR_FLAGS)
    try:
        for step in doomed:
            try:
                os.unlink(by_step[step].name, dir_fd=fd)
                deleted.append(by_step[step])
            except FileNotFoundError:
                pass
        if deleted:
            with storage_guard(checkpoint_dir, "sync"):
                os.fsync(fd)
    finally:
        os.close(fd)
    return deleted


def protected_by_phases(phases: Iterable[Phase]) -> set[int]:
    """Steps of the checkpoints phases.json names (pivot points)."""
    out = set()
    for phase in phases:
        if phase.checkpoint:
            step = checkpoint_step(phase.checkpoint)
            if step is not None:
                out.add(step)
        if phase.phase > 0:
            out.add(phase.start_step)
    return out


def copy_best(checkpoint: str | os.PathLike, best: str | os.PathLike) -> None:
    """Make `best` an atomic copy of `checkpoint`."""
    atomic_copy(checkpoint, best)


def best_is_better(loss: float, best_loss: float | None) -> bool:
    return best_loss is None or loss < best_loss
