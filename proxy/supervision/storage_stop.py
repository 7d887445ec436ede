"""A run stopped by a failed write: the engine's failure taken as the disk's, and the checkpoint a relaunch uses.

The engine reports a failed checkpoint write with exit 5 and a line ending in
the C library's strerror text ("checkpoint at step 200 failed (write
RUN/checkpoints/.step_000200.bin.tmp: No space left on device); previous
checkpoints are intact"). When that text is a full disk's (errors.FULL_DISK),
restarting the engine cannot help until space is freed: every restart fails
the same way and the run would end as a crash loop (exit 3) after
--max-failures tries. So it ends at once, as the proxy's own full-disk
writes do (exit 5, errors.StorageError). Other engine write failures (EFBIG,
EIO) keep the restart policy.

The last line names the checkpoint a relaunch resumes from as the resume
rule itself chooses it (rundir/resume.py: verified, covered by the log), not
the step the run reached, which may be past the newest checkpoint intact.
"""

from __future__ import annotations

import os
import re

from ..errors import FULL_DISK, ProxyError, StorageError
from ..formats.engine_cli import EXIT_IO
from ..formats.loss_log import LossLogIndex
from ..rundir.resume import choose_resume
from ..safe_fs import UnsafeFileError
from .context import RunContext


class EngineStorageError(StorageError):
    """The engine's checkpoint write found the disk full (the engine's own line is in engine.log)."""


def engine_full_disk(ctx: RunContext, code: int | None, last_error: str | None) -> EngineStorageError | None:
    """The error that ends the run when the engine exited 5 because a write found the disk full (its error
    text holds ENOSPC's or EDQUOT's strerror); None for any other exit."""
    if code != EXIT_IO or not last_error:
        return None
    for number in FULL_DISK:
        if os.strerror(number) in last_error:
            step = re.search(r"checkpoint at step (\d+)", last_error)
            what = f"the engine's checkpoint of step {step.group(1)}" if step else "the engine's checkpoint"
            return EngineStorageError(
                ctx.run.checkpoints, OSError(number, os.strerror(number)), action=f"write {what} into"
            )
    return None


def resume_line(ctx: RunContext) -> str:
    """Where a relaunch goes on from: the newest intact checkpoint the resume rule takes, or a fresh start."""
    try:
        point = choose_resume(
            ctx.run.checkpoints,
            LossLogIndex.load(ctx.run.loss_log),
            ctx.phases,
            ctx.rejected,
            vocab=int(ctx.experiment.model.vocab),
        )
    except (ProxyError, OSError, UnsafeFileError, ValueError) as exc:
        return f"no checkpoint to resume from was found ({str(exc)[:200]})"
    if point.path is None:
        return "no intact checkpoint: a relaunch starts from scratch"
    return f"a relaunch resumes from {point.path} (step {point.step}), the newest intact checkpoint the log covers"
