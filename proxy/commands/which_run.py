"""Which run directory a command acts on (`--run-dir DIR`, or the most recently active run under runs/),
and what a command on a started run reads first."""

from __future__ import annotations

from pathlib import Path

from ..config.experiment import Experiment
from ..errors import EXIT_USAGE, ProxyError
from ..rundir.frozen import load_frozen_experiment
from ..rundir.layout import RunDir, most_recent_run
from ..rundir.phases import Phase, read_phases


def resolve_run(run_dir: str | None) -> RunDir:
    if run_dir:
        run = RunDir(Path(run_dir))
        if not run.root.is_dir():
            raise ProxyError(f"{run.root}: no such run directory", EXIT_USAGE)
        if not run.exists():
            raise ProxyError(f"{run.root}: not a run directory (no experiment.json)", EXIT_USAGE)
        return run
    return RunDir(most_recent_run())


def started_run(run: RunDir, no_phases: str) -> tuple[Experiment, list[Phase]]:
    """The run's frozen experiment and phases; ProxyError (`<phases.json>: <no_phases>`) when it never started."""
    experiment = load_frozen_experiment(run)
    phases = read_phases(run)
    if not phases:
        raise ProxyError(f"{run.phases}: {no_phases}", EXIT_USAGE)
    return experiment, phases
