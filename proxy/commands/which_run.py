"""Which run directory a command acts on: `--run-dir DIR`, or the most recently active run under runs/."""
from __future__ import annotations

from pathlib import Path

from ..errors import EXIT_USAGE, ProxyError
from ..rundir.layout import RunDir, RunDirError, most_recent_run


def resolve_run(run_dir: str | None) -> RunDir:
    if run_dir:
        run = RunDir(Path(run_dir))
        if not run.root.is_dir():
            raise ProxyError(f"{run.root}: no such run directory", EXIT_USAGE)
        if not run.exists():
            raise ProxyError(f"{run.root}: not a run directory (no experiment.json)", EXIT_USAGE)
        return run
    try:
        return RunDir(most_recent_run())
    except RunDirError as exc:
        raise ProxyError(str(exc), EXIT_USAGE) from None
