"""The proxy's checkpoint bookkeeping: retention after every checkpoint, and best.bin by validation loss.

Both act only on durable checkpoints: those the engine announced (its ckpt
event comes once the file and its directory entry are fsynced), or older.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import add_note
from ..formats.checkpoint import checkpoint_path, header_step
from ..formats.loss_log import LossLogIndex
from ..rundir.layout import RunDirError
from ..rundir.retention import apply_retention, best_is_better, protected_by_phases
from .context import RunContext
from .launch import EngineLaunch
from .report import RunReport


def durable(report: RunReport, step: int) -> bool:
    """Whether the checkpoint of `step` is known to be complete and durable: the engine announced it (its
    ckpt event comes once the write's directory fsync is done, possibly steps later) or an older one, or
    the run resumed from it. A file on disk past that may still be being written."""
    return report.last_ckpt_step is not None and step <= report.last_ckpt_step


def retain(ctx: RunContext, launch: EngineLaunch | None) -> None:
    """Apply the retention policy to the durable checkpoints, never deleting what a resume or a pivot
    needs: the checkpoints phases.json names, the newest one announced, the newest sane one
    (proxy/divergence.py), the one this launch resumed from."""
    report = ctx.report
    if report.last_ckpt_step is None:
        return  # nothing announced yet: no file is known to be complete
    protected = protected_by_phases(ctx.phases) | {report.last_ckpt_step}
    if report.last_sane_ckpt_step is not None:  # never the newest sane one, whatever diverged after it
        protected.add(report.last_sane_ckpt_step)
    if launch is not None and launch.resume.path is not None:
        protected.add(launch.resume.step)
    if ctx.best_copier.busy_step is not None:
        protected.add(ctx.best_copier.busy_step)
    _own_checkpoints(ctx, "retention")
    try:
        apply_retention(ctx.run, ctx.retention, protected, report.last_ckpt_step)
    except RunDirError as exc:  # swapped in between: as below
        add_note(exc, "retention")
        raise
    except OSError as exc:
        ctx.warn(f"retention: {exc}")


def _own_checkpoints(ctx: RunContext, what: str) -> None:
    """Before anything is deleted or written in checkpoints/: the run directory is still the one locked, and
    its checkpoints/ a real directory of it. Otherwise the run stops (one line, exit 2): checkpoints/ made a
    symlink to another run while this one trained would have this run delete or overwrite that run's files."""
    ctx.lock.check()
    try:
        ctx.run.check_paths()
    except RunDirError as exc:
        add_note(exc, what)
        raise


def maybe_best(ctx: RunContext, step: int) -> None:
    """best.bin := the checkpoint at `step` once its eval is in, the engine announced the file (it is
    durable) and the loss is the best so far (the copy in flight counts); called at both events, whichever
    comes last acts. The copy runs in the background (BestCopier); one still in flight is waited for."""
    report, copier = ctx.report, ctx.best_copier
    loss = ctx.eval_loss.get(step)
    path = checkpoint_path(ctx.run.checkpoints, step)
    best_loss = copier.job[1] if copier.job is not None else report.best_loss
    if loss is None or not durable(report, step) or not path.exists() or not best_is_better(loss, best_loss):
        return
    if report.best_step == step and report.best_loss == loss:
        return
    _own_checkpoints(ctx, "best.bin")  # the copy reads and writes through checkpoints/: it must be the run's
    copier.wait(report, ctx.warn)
    copier.start(step, loss, path, ctx.run.best)


def load_best(report: RunReport, best: Path, loss_log: Path) -> None:
    """The step and eval loss of an existing best.bin (its step is in its header, not its name)."""
    if not best.exists():
        return
    step = header_step(best)
    if step is not None:
        entry = LossLogIndex.load(loss_log).eval(step)
        report.new_best(step, entry.loss if entry else None)
