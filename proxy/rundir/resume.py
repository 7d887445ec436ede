"""Which checkpoint a run continues from: the newest that verifies and whose steps the log covers.

The rule behind bit-exact resumption (docs/ARCHITECTURE.md, "Determinism of
the whole run"): the bandit is rebuilt from `.loss.json`, so a checkpoint is
usable only when every step it holds that the rebuild needs has its last
entry in the log, logged under the phase that owns the step. A proxy killed
between the engine's checkpoint and the log append thus falls back to an
older checkpoint rather than guessing. `proxy run`, `proxy pivot` on a
stopped run and `proxy fork` all choose by this rule.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

from ..divergence import insanity, sane_loss
from ..errors import EXIT_FAILURE, ProxyError
from ..formats.checkpoint import checkpoint_step, list_checkpoints, misnamed, verify_checkpoint
from ..formats.loss_log import LossLogIndex
from .phases import Phase, owned_steps


@dataclass
class ResumePoint:
    path: Path | None  # None: start fresh
    step: int
    skipped: list[str] = field(default_factory=list)  # why newer checkpoints were passed over


def uncovered(index: LossLogIndex, phases: list[Phase], through: int, after: int = 0) -> tuple[int, int | None]:
    """(how many steps in (after, through] have no last log entry under the phase that owns them, the first
    of them or None); bounded by the log's entries, not by `through` (LossLogIndex.gap)."""
    count, first = 0, None
    for phase, lo, hi in owned_steps(phases, through):
        n, f = index.gap(phase.phase, max(lo - 1, after), hi)
        if n:
            count += n
            if f is not None:
                first = f if first is None else min(first, f)
    return count, first


def newest_covered(
    checkpoint_dir: Path,
    index: LossLogIndex,
    phases: list[Phase],
    *,
    vocab: int,
    since: Phase | None = None,
    at_most: int | None = None,
    rejected: AbstractSet[str] = frozenset(),
) -> ResumePoint:
    """The newest checkpoint (at or before `at_most`) that verifies, whose steps the log covers, and that is
    sane (proxy/divergence.py: the loss logged for its step; `vocab` is the model's).

    With `since` (a phase): only checkpoints from its start step on count, and only its own steps must be
    in the log (the earlier phases' steps are history). Without: every step from 1. `rejected` names
    checkpoints the engine refused. ResumePoint(None, 0, skipped) when none qualifies.
    """
    after = since.start_step if since is not None else 0
    skipped: list[str] = []
    for path in list_checkpoints(checkpoint_dir):
        step = checkpoint_step(path)
        if step is None:  # not a step_NNNNNN.bin name (list_checkpoints yields none such)
            continue
        if at_most is not None and step > at_most:
            continue
        if str(path) in rejected:
            skipped.append(f"{path.name}: rejected by the engine earlier")
            continue
        if since is not None and step < since.start_step:
            skipped.append(f"{path.name}: before the start of phase {since.phase} (step {since.start_step})")
            continue
        reason = verify_checkpoint(path)
        if reason is None and misnamed(path):
            reason = f"{path.name}: {misnamed(path)}"
        if reason is None:
            missing, first = uncovered(index, phases, step, after)
            if missing:
                reason = f"{path.name}: .loss.json lacks {missing} of its steps (first {first})"
        if reason is None and step > 0:
            entry = index.step(step)
            if entry is not None and not sane_loss(entry.loss, vocab):
                reason = f"{path.name}: the run had diverged at its step ({insanity(entry.loss, vocab)})"
            elif entry is not None:  # trained after a diverged step of its phase: descends from diverged weights
                first = index.first_diverged(entry.phase, after, step, lambda loss: sane_loss(loss, vocab))
                if first is not None:
                    reason = (
                        f"{path.name}: the run had diverged at step {first}, before it "
                        f"({insanity(index.high_losses[first], vocab)})"
                    )
        if reason is None:
            return ResumePoint(path, step, skipped)
        skipped.append(reason)
    return ResumePoint(None, 0, skipped)


def choose_resume(
    checkpoint_dir: Path,
    index: LossLogIndex,
    phases: list[Phase],
    rejected: set[str],
    *,
    vocab: int,
    at_most: int | None = None,
) -> ResumePoint:
    """Where the current (last) phase continues: its newest covered, sane checkpoint (with `at_most`: at or
    before that step; `proxy pivot --at`), or a fresh start in phase 0. ProxyError when there is none to use."""
    phase = phases[-1]
    point = newest_covered(checkpoint_dir, index, phases, vocab=vocab, since=phase, at_most=at_most, rejected=rejected)
    if point.path is not None:
        return point
    skipped = point.skipped
    if rejected:
        raise ProxyError(
            f"the engine rejected every checkpoint it was offered ({'; '.join(skipped)}); "
            f"see the engine's reason in its log",
            EXIT_FAILURE,
        )
    if phase.start_step > 0:
        upto = f" and at or before step {at_most}" if at_most is not None else ""
        raise ProxyError(
            f"no valid checkpoint at or after step {phase.start_step}, where phase "
            f"{phase.phase} starts{upto} ({'; '.join(skipped) or 'none found'})"
        )
    return point
