"""Smoothed loss, throughput and ETA: the figures `proxy run` prints and `proxy status` shows."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

WINDOW_S = 300.0  # the throughput is measured over the steps of the last five minutes...
WINDOW_STEPS = 5000  # ...but at most this many steps
# The wall clock can jump (NTP, a suspended machine, a hand-set date, a forged log): an interval between two
# steps that is negative, or longer than JUMP_FACTOR times the engine's own compute time of the step
# (its `ms`, measured on the engine's monotonic clock) and than JUMP_MIN_S, is taken as a jump and counted
# as that compute time instead. Audits (evals, checkpoints) between steps stay well inside the bound.
JUMP_FACTOR = 1000.0
JUMP_MIN_S = 600.0
# the smoothed loss: an exponential moving average, 0.9 of its old value and 0.1 of the new loss (two
# constants, as 1.0 - 0.9 is not the double 0.1)
SMOOTHING_OLD, SMOOTHING_NEW = 0.9, 0.1
# a smoothed loss rebuilt from the last SMOOTHING_MEMORY logged steps equals, in doubles, one fed since step 1:
# the weight left on anything older, 0.9 ** 400 (5e-19), is below a double's resolution
SMOOTHING_MEMORY = 400


class Rates(NamedTuple):
    """Tokens per second of wall-clock time (what the run gets: audits and waits included), of the
    engine's step compute alone (the step events' `ms`), and the seconds to max_steps at the first."""

    tokens_per_s: float | None
    engine_tokens_per_s: float | None
    eta_s: float | None


class ThroughputMeter:
    """Fed (wall time, cumulative tokens, step, loss, step ms, mixture) once per step, in step order.

    The window spans the steps of the last WINDOW_S seconds, so it holds many
    audit intervals (evals, samples, checkpoints every N steps) and the
    wall-clock rate counts them at their true share, not 0% or 100% of it.
    """

    def __init__(self, window_s: float = WINDOW_S, window_steps: int = WINDOW_STEPS):
        self.window_s = window_s
        self.window: deque = deque(maxlen=window_steps)  # (sane clock, tokens, step, ms)
        self.clock = 0.0  # seconds of the wall clock with its jumps taken out (sane_interval)
        self.last_wall: float | None = None
        self.window_ms = 0.0  # the ms of every entry but the oldest (whose tokens are the baseline)
        self.last_loss: float | None = None
        self.smoothed: float | None = None
        self.mixture: dict[str, float] = {}  # the one the last step was drawn from

    def observe(
        self,
        time: float,
        tokens: int,
        step: int,
        loss: float,
        ms: float = 0.0,
        mixture: dict[str, float] | None = None,
        new_launch: bool = False,
    ) -> None:
        """`time` is the wall-clock time of the step; the window keeps the sane clock instead. `new_launch`: the
        step is the first of another engine launch than the one before it, so the wall time between them (the
        run stopped, data prepared, an engine started) is no running time: only the step's compute counts."""
        if self.last_wall is not None:
            self.clock += compute_seconds(ms) if new_launch else sane_interval(time - self.last_wall, ms)
        self.last_wall = time
        time = self.clock
        self.last_loss = loss
        if mixture is not None:
            self.mixture = dict(mixture)
        self.smoothed = smooth(self.smoothed, loss)
        if len(self.window) == self.window.maxlen:
            self._drop_oldest()
        self.window.append((time, tokens, step, ms))
        if len(self.window) > 1:
            self.window_ms += ms
        while len(self.window) > 2 and self.window[1][0] <= time - self.window_s:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        self.window.popleft()
        self.window_ms -= self.window[0][3]  # the new oldest becomes the baseline

    def restart(self, last_loss: float | None, smoothed: float | None) -> None:
        """A new engine: the throughput starts over; the loss it resumes from is the last one, and the smoothed
        loss the one rebuilt from the log up to that step (`smoothed_over`), as `proxy status` rebuilds it."""
        self.window.clear()
        self.window_ms = 0.0
        if last_loss is not None:
            self.last_loss = last_loss
        self.smoothed = smoothed

    def start(self, time: float, tokens: int, step: int) -> None:
        """The engine is ready at `step`: the baseline of the window, so the first step has a rate (its
        wall time counted from the engine being ready)."""
        if not self.window:
            self.last_wall = time
            self.window.append((self.clock, tokens, step, 0.0))

    def rates(self, max_steps: int) -> Rates:
        """The rates over the window and the ETA at the wall-clock rate; Nones before two points (a
        baseline and a step, or two steps)."""
        if len(self.window) < 2:
            return Rates(None, None, None)
        (t0, k0, s0, _), (t1, k1, s1, _) = self.window[0], self.window[-1]
        if t1 <= t0 or s1 <= s0:
            return Rates(None, None, None)
        engine = (k1 - k0) / (self.window_ms / 1000.0) if self.window_ms > 0 else None
        return Rates((k1 - k0) / (t1 - t0), engine, max(0, max_steps - s1) * (t1 - t0) / (s1 - s0))


def smooth(smoothed: float | None, loss: float) -> float:
    """The smoothed loss after one more step's `loss` (the first loss sets it)."""
    return loss if smoothed is None else SMOOTHING_OLD * smoothed + SMOOTHING_NEW * loss


def smoothed_over(losses: Iterable[float]) -> float | None:
    """The smoothed loss after these steps' losses, in step order (None: none)."""
    smoothed = None
    for loss in losses:
        smoothed = smooth(smoothed, loss)
    return smoothed


def compute_seconds(ms: float) -> float:
    """A step's engine compute time in seconds (0 for a value no step has: negative or not finite)."""
    return max(0.0, ms / 1000.0) if math.isfinite(ms) else 0.0


def sane_interval(seconds: float, ms: float) -> float:
    """The wall-clock interval before a step whose engine compute took `ms`, or that compute time when the
    interval is a clock jump (negative, not finite, or past JUMP_FACTOR x the compute and JUMP_MIN_S)."""
    compute = compute_seconds(ms)
    if math.isfinite(seconds) and 0.0 <= seconds <= max(JUMP_FACTOR * compute, JUMP_MIN_S):
        return seconds
    return compute


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    if seconds >= 86400:
        return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def fmt_rate(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"
