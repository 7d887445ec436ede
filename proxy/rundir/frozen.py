"""The frozen experiment: RUN/experiment.json, written on the first launch and compared on every later one.

A launch with a changed experiment stops with the changed fields named,
unless --allow-experiment-change: then the old frozen copy is kept as
RUN/archive/experiment_<time>.json (an audit trail, and the mark that the
run's older checkpoints carry other optimizer settings) and replaced.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from ..atomic import atomic_write_bytes
from ..config.errors import ExperimentError
from ..config.experiment import Experiment, load_experiment
from ..errors import EXIT_USAGE, ProxyError
from .layout import RunDir, RunDirError

REPLACED_PATTERN = "experiment_*.json"  # in RUN/archive/


def _diff(a, b, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            out += _diff(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if a == b else [prefix or "(whole file)"]


def _normalized(obj: dict) -> dict:
    """The frozen JSON as the schema reads it (defaults filled in), or as it is when it no longer validates."""
    try:
        return Experiment.model_validate(obj).model_dump(mode="json")
    except Exception:
        return obj


def freeze_experiment(run: RunDir, source: Path, experiment: Experiment, allow_change: bool) -> list[str]:
    """Write the frozen copy on the first run; on later runs compare with it.

    Returns the dotted names of the fields that changed (empty when none).
    A changed experiment without `allow_change` raises RunDirError; with it, the
    frozen copy is replaced by the new experiment.
    """
    raw = source.read_bytes()
    if not run.experiment.exists():
        atomic_write_bytes(run.experiment, raw)
        return []
    try:
        frozen = json.loads(run.experiment.read_text())
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{run.experiment}: frozen experiment unreadable ({exc}); "
                          "fix or delete it to start again") from None
    changed = _diff(_normalized(frozen), experiment.model_dump(mode="json"))
    if changed and not allow_change:
        shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
        raise RunDirError(f"{source} differs from the experiment frozen in {run.experiment} ({shown}); "
                          "pass --allow-experiment-change to continue with the new one")
    if changed:  # keep the old frozen copy: an audit trail, and the mark that the run changed
        run.archive.mkdir(exist_ok=True)
        atomic_write_bytes(run.archive / f"experiment_{time.time():.0f}.json", run.experiment.read_bytes())
        atomic_write_bytes(run.experiment, raw)
    return changed


def replaced_experiments(run: RunDir) -> list[Path]:
    """The frozen experiments --allow-experiment-change replaced, oldest first."""
    return sorted(run.archive.glob(REPLACED_PATTERN)) if run.archive.is_dir() else []


def experiment_changed(run: RunDir) -> bool:
    """Whether the run ever continued under a changed experiment (--allow-experiment-change)."""
    return bool(replaced_experiments(run))


def load_frozen_experiment(run: RunDir) -> Experiment:
    """The experiment frozen in the run (its sources are not checked: a stopped run may have moved)."""
    try:
        return load_experiment(run.experiment, check_sources=False)
    except ExperimentError as exc:
        raise ProxyError(str(exc), EXIT_USAGE) from None
