"""The hang watchdog: how long the engine may stay silent while the proxy waits for an event (docs/CLI.md).

Default: max(30 s, 20 x the median wall time per step) once three steps were
timed (300 s before), times the relative cost of the oldest request in
flight, plus max(60 s, 10 x the slowest checkpoint) while a checkpoint is
due, and at least 600 s while the engine loads and takes its first step.
With --hang-timeout S: S throughout (2S around checkpoints, 3S at first).
"""
from __future__ import annotations

import statistics
import time

from .segment import Segment

GOODBYE_S = 60.0  # an engine that said `exit` but keeps its stdout open


class Watchdog:
    def __init__(self, hang_timeout: float | None):
        self.hang_timeout = hang_timeout

    def _base(self, seg: Segment) -> float:
        if self.hang_timeout:
            return float(self.hang_timeout)
        if len(seg.step_walls) < 3:
            return 300.0
        return max(30.0, 20.0 * statistics.median(seg.step_walls))

    def allowance(self, seg: Segment, ckpt_ms: float) -> float:
        """Seconds of silence allowed now, given what is in flight and the slowest checkpoint seen."""
        base = self._base(seg)
        head = seg.outstanding[0] if seg.outstanding else None
        allowance = base * (head.work if head else 1.0)
        if seg.ckpt_pending or (head is not None and head.kind == "stop"):
            allowance += base if self.hang_timeout else max(60.0, 10.0 * ckpt_ms / 1000.0)
        if seg.ready is None or seg.last_step_wall is None:  # loading, first step
            allowance = max(allowance, 3 * base if self.hang_timeout else 600.0)
        return allowance

    def hung(self, seg: Segment, ckpt_ms: float) -> bool:
        if seg.hung or seg.killed:
            return False
        quiet = time.monotonic() - seg.last_activity
        if seg.exit_reason is not None:  # said goodbye but its stdout stays open
            return quiet > GOODBYE_S
        return bool(seg.outstanding) and quiet > self.allowance(seg, ckpt_ms)
