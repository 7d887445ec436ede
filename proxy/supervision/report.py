"""The run's report: what `proxy run` writes to `.state.json` and prints, besides the bandit's own figures.

Counts carried over from an earlier launch (restarts, replay mismatches) are
read back from the old `.state.json`, the only thing ever read from it: the
snapshot is never trusted, so anything malformed there is ignored.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..formats.state import EngineStatus
from ..rundir.phases import Phase
from .goodput import GoodputMeter
from .throughput import Progress

MISMATCHES_KEPT = 50  # replay mismatches kept in .state.json, newest last


@dataclass
class RunReport:
    engine: EngineStatus
    status: str = "running"  # formats/state.py STATUSES
    message: str | None = None  # why the run stopped
    write_failure: dict | None = None  # {"path", "errno", "error"} when a failed write stopped the run
    dashboard: dict | None = None  # {"url", "host"} of the dashboard this proxy started
    tokens: int = 0  # cumulative, as logged
    progress: Progress = field(default_factory=Progress)
    goodput: GoodputMeter = field(default_factory=GoodputMeter)
    last_ckpt_step: int | None = None
    last_ckpt_path: str | None = None
    last_sane_ckpt_step: int | None = None  # the newest checkpoint of a sane step (rundir/divergence.py)
    diverged_step: int | None = None  # the first step this launch found not sane
    diverged_why: str | None = None
    ckpt_ms: float = 0.0  # the slowest checkpoint write seen (the watchdog allows for it)
    best_step: int | None = None
    best_loss: float | None = None
    restarts: int = 0
    mismatches: list[dict] = field(default_factory=list)
    mismatch_count: int = 0
    dropped_arms: set[str] = field(default_factory=set)  # arm names met in the run directory, not defined
    last_state_write: float = 0.0  # monotonic time of the last .state.json write
    progress_said: float | None = None  # monotonic time of the last progress line printed

    def checkpointed(self, step: int, path: str) -> None:
        """The engine announced (or the run resumed from) the checkpoint of `step`. It is sane unless the run
        diverged at or before `step`: every step logged before the divergence was sane."""
        self.last_ckpt_step, self.last_ckpt_path = step, path
        if self.diverged_step is None or step < self.diverged_step:
            self.last_sane_ckpt_step = step

    def add_mismatch(self, mismatch: dict) -> None:
        self.mismatch_count += 1
        self.mismatches = (self.mismatches + [mismatch])[-MISMATCHES_KEPT:]


def _count(snapshot: dict, key: str, default: int) -> int:
    """A non-negative count from an old .state.json; anything else (a hand-edited or corrupt value) is ignored."""
    value = snapshot.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return default


def carry_forward(report: RunReport, prev: dict, arm_names: list[str], phase: Phase,
                  warn: Callable[[str], None]) -> None:
    """Take the counts of an earlier launch from its `.state.json` (`prev`), and note arms the run directory
    names that the experiment does not define."""
    mismatches = prev.get("replay_mismatches")
    if isinstance(mismatches, list):
        report.mismatches = [m for m in mismatches if isinstance(m, dict)][-MISMATCHES_KEPT:]
    report.mismatch_count = _count(prev, "replay_mismatch_count", len(report.mismatches))
    report.restarts = _count(prev, "restarts", 0)
    arms = prev.get("arms")
    if isinstance(arms, dict):
        unknown = sorted(set(arms) - set(arm_names))
        if unknown:
            warn(f".state.json names arm(s) {', '.join(unknown)} that the experiment does not define; dropped")
            report.dropped_arms |= set(unknown)
    unknown_caps = sorted((set(phase.caps) | set(phase.floors)) - set(arm_names))
    if unknown_caps:
        warn(f"phases.json phase {phase.phase} names arm(s) {', '.join(unknown_caps)} that the "
             "experiment does not define; dropped")
        report.dropped_arms |= set(unknown_caps)
