"""The run's report: what `proxy run` writes to `.state.json` and prints, besides the bandit's own figures.

Counts carried over from an earlier launch (restarts, replay mismatches) are
read back from the old `.state.json`, the only thing ever read from it: the
snapshot is never trusted, so anything malformed there is ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from ..formats.state import EngineStatus
from ..rundir.phases import Phase
from .goodput import GoodputMeter
from .throughput import ThroughputMeter

MISMATCHES_KEPT = 50  # replay mismatches kept in .state.json, newest last


@dataclass
class RunReport:
    engine: EngineStatus
    status: str = "running"  # formats/state.py STATUSES
    message: str | None = None  # why the run stopped
    write_failure: dict | None = None  # {"path", "errno", "error"} when a failed write stopped the run
    dashboard: dict | None = None  # {"url", "host"} of the dashboard this proxy started
    tokens: int = 0  # cumulative, as logged
    progress: ThroughputMeter = field(default_factory=ThroughputMeter)
    goodput: GoodputMeter = field(default_factory=GoodputMeter)
    last_ckpt_step: int | None = None
    last_ckpt_path: str | None = None
    last_sane_ckpt_step: int | None = None  # the newest checkpoint of a sane step (proxy/divergence.py)
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

    # Every field changes only through these methods, each named for what happened: the setup, the launch
    # (launcher.py), the event handlers, the loop, the live status and the pivot desk call them
    # (tests/repository/test_attribute_owners.py checks that no other code assigns them).

    def carry_forward(self, prev: dict, arm_names: list[str], phase: Phase, warn: Callable[[str], None]) -> None:
        """Take the counts of an earlier launch from its `.state.json` (`prev`), and note arms the run
        directory names that the experiment does not define."""
        mismatches = prev.get("replay_mismatches")
        if isinstance(mismatches, list):
            self.mismatches = [m for m in mismatches if isinstance(m, dict)][-MISMATCHES_KEPT:]
        self.mismatch_count = _count(prev, "replay_mismatch_count", len(self.mismatches))
        self.restarts = _count(prev, "restarts", 0)
        arms = prev.get("arms")
        if isinstance(arms, dict):
            unknown = sorted(set(arms) - set(arm_names))
            if unknown:
                warn(f".state.json names arm(s) {', '.join(unknown)} that the experiment does not define; dropped")
                self.drop_arms(unknown)
        unknown_caps = sorted((set(phase.caps) | set(phase.floors)) - set(arm_names))
        if unknown_caps:
            warn(
                f"phases.json phase {phase.phase} names arm(s) {', '.join(unknown_caps)} that the "
                "experiment does not define; dropped"
            )
            self.drop_arms(unknown_caps)

    def drop_arms(self, names: Iterable[str]) -> None:
        """Arm names met in the run directory that the experiment does not define (each is warned of once)."""
        self.dropped_arms |= set(names)

    def dashboard_started(self, where: dict | None) -> None:
        """The dashboard this proxy started: {"url", "host"}, or None."""
        self.dashboard = where

    def resumed(
        self, step: int, path: str | None, tokens: int, loss: float | None, smoothed: float | None = None
    ) -> None:
        """A launch resumes at `step` from the checkpoint `path` (None: from scratch, as no checkpoint on disk
        is known to be valid and covered by the log), with `tokens` trained so far, `loss` the step's as
        logged (None: not logged) and `smoothed` the smoothed loss rebuilt from the log up to it."""
        self.tokens = tokens
        self.progress.restart(loss, smoothed)
        if path is not None:
            self.checkpointed(step, path)
        else:
            self.last_ckpt_step = self.last_ckpt_path = None

    def engine_started(self, engine: EngineStatus) -> None:
        self.engine = engine

    def engine_ready(
        self,
        kind: str | None,
        device: str | None,
        threads: int | None,
        precision: str | None,
        mem_bytes: int | None,
        version: str | None = None,
        source: str | None = None,
        n_params: int | None = None,
        ranks: int = 1,
    ) -> None:
        """What the engine's `ready` event says of it."""
        self.engine = replace(
            self.engine,
            kind=kind,
            device=device,
            threads=threads,
            precision=precision,
            mem_bytes=mem_bytes,
            version=version,
            source=source,
            n_params=n_params,
            ranks=ranks,
        )

    def engine_usage(self, alive: bool, rss_bytes: int | None, cpu_percent: float | None) -> None:
        """The engine process as the proxy last measured it."""
        self.engine = replace(self.engine, alive=alive, rss_bytes=rss_bytes, cpu_percent=cpu_percent)

    def engine_exited(self) -> None:
        self.engine = replace(self.engine, alive=False)

    def record_step(self, step: int, tokens: int, ms: float, loss: float, mixture: dict[str, float], now: float) -> int:
        """A step's event, read at wall-clock time `now`: `tokens` more trained in the engine's `ms` of step
        compute, its `loss`, the `mixture` it was drawn from. Returns the run's cumulative token count, as
        logged."""
        self.tokens += tokens
        self.goodput.step(ms, tokens)
        self.progress.observe(now, self.tokens, step, loss, ms, mixture=mixture)
        return self.tokens

    def checkpoint_took(self, write_ms: float) -> None:
        """A checkpoint's write time: the slowest seen is kept (the watchdog allows for it)."""
        self.ckpt_ms = max(self.ckpt_ms, write_ms)

    def checkpointed(self, step: int, path: str) -> None:
        """The engine announced (or the run resumed from) the checkpoint of `step`. It is sane unless the run
        diverged at or before `step`: every step logged before the divergence was sane."""
        self.last_ckpt_step, self.last_ckpt_path = step, path
        if self.diverged_step is None or step < self.diverged_step:
            self.last_sane_ckpt_step = step

    def new_best(self, step: int | None, loss: float | None) -> None:
        """best.bin holds the checkpoint of `step`, whose validation loss is `loss`."""
        self.best_step, self.best_loss = step, loss

    def diverged(self, step: int, why: str) -> None:
        """The first step found not sane, and why: the run ends (loop.py)."""
        self.diverged_step, self.diverged_why = step, why

    def add_mismatch(self, mismatch: dict) -> None:
        self.mismatch_count += 1
        self.mismatches = (self.mismatches + [mismatch])[-MISMATCHES_KEPT:]

    def restarted(self) -> None:
        """The engine failed and is started again."""
        self.restarts += 1

    def set_status(self, status: str, message: str | None = None) -> None:
        """The run's status (formats/state.py STATUSES) and, when given, why it ended."""
        self.status = status
        if message is not None:
            self.message = message

    def failed(self, message: str, write_failure: dict | None = None) -> None:
        """An error ends the run: its line is the message, and a run still running counts as stopped (a status
        set before, crashloop or diverged, stays). `write_failure`: {"path", "errno", "error"} of the write
        whose failure stopped it."""
        self.set_status("stopped" if self.status == "running" else self.status, message)
        if write_failure is not None:
            self.write_failure = write_failure

    def pivoted(self) -> None:
        """A new phase started: no message of the old one describes it."""
        self.message = None

    def progress_said_at(self, now: float) -> None:
        """A progress line was printed at monotonic time `now`."""
        self.progress_said = now

    def state_written_at(self, now: float) -> None:
        """`.state.json` was rewritten (or tried) at monotonic time `now`."""
        self.last_state_write = now


def _count(snapshot: dict, key: str, default: int) -> int:
    """A non-negative count from an old .state.json; anything else (a hand-edited or corrupt value) is ignored."""
    value = snapshot.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return default
