"""The hang watchdog: how long the engine may stay silent while the proxy waits for an event (docs/CLI.md),
measured only over time the proxy itself ran, and confirmed by the engine's own CPU time before a kill.

Allowance. Default: max(30 s, 20 x the median wall time per step) once three
steps were timed (300 s before), times the relative cost of the oldest request
in flight, plus max(60 s, 10 x the slowest checkpoint) while a checkpoint is
due, and at least 600 s while the engine loads and takes its first step. With
--hang-timeout S: S throughout (2S around checkpoints, 3S at first).

The proxy's own pauses (docs/OPERATIONS.md, "When the engine hangs"). The
loop looks at the watchdog every iteration, which waits at most POLL_S for an
event; a gap of more than PAUSE_S between two looks means the proxy itself
did not run (it was SIGSTOPped, or starved of CPU), and the engine's events,
if any, sat unread in the pipe meanwhile. That gap, less the one POLL_S the
loop would have waited anyway, is not counted as the engine's silence. A
suspended machine needs no such rule: CLOCK_MONOTONIC, the clock used, stops
while it sleeps, for the engine's silence and the proxy's alike. Events
already read but not yet handled (the queue) are the engine speaking: never a
hang.

Confirmation by the engine's own progress. Halfway through the allowance the
engine's CPU time (its threads and live descendants) is read; when the
allowance runs out it is read again. An engine that used no CPU meanwhile
(stopped, blocked, deadlocked) is hung: killed then. One that did compute (at
least CPU_SHARE of the wall time) is given one more allowance, since a step
slower than the estimate also computes; silent at twice the allowance it is
killed whatever its CPU does, since an engine spinning in a loop that never
ends a step computes too.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from .launch import EngineLaunch

GOODBYE_S = 60.0  # an engine that said `exit` but keeps its stdout open
PAUSE_S = 2.0  # a look at the watchdog this long after the last one: the proxy itself did not run between
CPU_SHARE = 0.1  # an engine busy for this share of the wall time is computing (a real step uses ~1 core or more)
BUSY_FACTOR = 2.0  # a computing engine's silence may last this many allowances
MIN_WINDOW_S = 1.0  # the CPU time is compared over at least this much wall time (it counts in clock ticks)


@dataclass(frozen=True)
class _Sample:
    """The engine's CPU time, read halfway through one silence."""

    launch: int  # the EngineLaunch's number
    silence_from: float  # the launch's last_activity when read: a new event starts a new silence
    at: float
    cpu_s: float | None


class Watchdog:
    def __init__(self, hang_timeout: float | None, poll_s: float):
        self.hang_timeout = hang_timeout
        self.poll_s = poll_s
        self.last_look: float | None = None
        self.paused_s = 0.0  # the proxy's own pauses, all told (not counted as the engine's silence)
        self.sample: _Sample | None = None
        self.verdict = ""  # why the last hung() said so, for the line that reports the kill

    def _base(self, launch: EngineLaunch) -> float:
        if self.hang_timeout:
            return float(self.hang_timeout)
        if len(launch.step_walls) < 3:
            return 300.0
        return max(30.0, 20.0 * statistics.median(launch.step_walls))

    def allowance(self, launch: EngineLaunch, ckpt_ms: float) -> float:
        """Seconds of silence allowed now, given what is in flight and the slowest checkpoint seen."""
        base = self._base(launch)
        head = launch.outstanding[0] if launch.outstanding else None
        allowance = base * (head.work if head else 1.0)
        if launch.ckpt_pending or (head is not None and head.kind == "stop"):
            allowance += base if self.hang_timeout else max(60.0, 10.0 * ckpt_ms / 1000.0)
        if launch.ready is None or launch.last_step_wall is None:  # loading, first step
            allowance = max(allowance, 3 * base if self.hang_timeout else 600.0)
        return allowance

    def begin(self) -> None:
        """A new launch: the loop looks from now on (the time between launches is no launch's)."""
        self.last_look, self.sample = None, None

    def look(self, launch: EngineLaunch, now: float) -> float:
        """Called once per loop iteration: a gap since the last look longer than PAUSE_S is the proxy's own
        pause. The part of it the engine's silence spans, less the POLL_S the loop waits anyway, is taken off
        that silence. Returns the pause's length (0.0: none), whether or not the engine spoke meanwhile: an
        event read the moment the proxy runs again already ended the silence, yet the proxy did not run."""
        last, self.last_look = self.last_look, now
        if last is None or now - last <= PAUSE_S:
            return 0.0
        credit = now - max(last, launch.last_activity) - self.poll_s
        if credit > 0:
            launch.excuse_silence(credit)
            if self.sample is not None:  # the same silence, moved with it
                self.sample = replace(self.sample, silence_from=self.sample.silence_from + credit)
            self.paused_s += credit
        return now - last - self.poll_s

    def quiet(self, launch: EngineLaunch, now: float) -> float:
        """The engine's silence, in the proxy's own running time."""
        return now - launch.last_activity

    def hung(self, launch: EngineLaunch, ckpt_ms: float, pending: bool, cpu: Callable[[], float | None]) -> bool:
        """Whether the engine is hung now: silent too long (not counting the proxy's pauses), no event
        waiting to be handled (`pending`), and, within twice the allowance, no CPU progress (`cpu` reads its
        CPU seconds)."""
        if launch.hung or launch.killed or pending:
            return False
        now = time.monotonic()
        quiet = self.quiet(launch, now)
        if launch.exit_reason is not None:  # said goodbye but its stdout stays open
            self.verdict = "after saying goodbye"
            return quiet > GOODBYE_S
        if not launch.outstanding:
            return False
        allowance = self.allowance(launch, ckpt_ms)
        sample = self.sample
        if sample is not None and (sample.launch, sample.silence_from) != (launch.number, launch.last_activity):
            sample = self.sample = None  # an event came since: a new silence
        if quiet < allowance / 2:
            return False
        if sample is None:
            self.sample = _Sample(launch.number, launch.last_activity, now, cpu())
            return False
        if quiet <= allowance or now - sample.at < MIN_WINDOW_S:
            return False
        now_cpu = cpu()
        busy = (
            sample.cpu_s is not None and now_cpu is not None and now_cpu - sample.cpu_s >= CPU_SHARE * (now - sample.at)
        )
        if busy and quiet <= BUSY_FACTOR * allowance:
            return False
        self.verdict = "computing all the while (a loop that never ends a step)" if busy else "using no CPU meanwhile"
        return True
