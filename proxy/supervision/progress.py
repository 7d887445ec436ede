"""Smoothed loss, throughput and ETA: the figures `proxy run` prints and `proxy status` shows."""
from __future__ import annotations

import math
from collections import deque

WINDOW = 50  # steps the throughput is measured over


class Progress:
    """Fed (wall time, cumulative tokens, step, loss) once per step, in step order."""

    def __init__(self, window: int = WINDOW):
        self.window: deque = deque(maxlen=window)  # (wall time, tokens, step)
        self.last_loss: float | None = None
        self.smoothed: float | None = None

    def observe(self, time: float, tokens: int, step: int, loss: float) -> None:
        self.last_loss = loss
        # an exponential moving average, 0.9 of the old value
        self.smoothed = loss if self.smoothed is None else 0.9 * self.smoothed + 0.1 * loss
        self.window.append((time, tokens, step))

    def restart(self, last_loss: float | None) -> None:
        """A new engine: the throughput starts over; the loss it resumes from is the last one."""
        self.window.clear()
        if last_loss is not None:
            self.last_loss = last_loss

    def rates(self, max_steps: int) -> tuple[float | None, float | None]:
        """(tokens per second, seconds to max_steps) over the window, or Nones before two steps."""
        if len(self.window) < 2:
            return None, None
        (t0, k0, s0), (t1, k1, s1) = self.window[0], self.window[-1]
        if t1 <= t0 or s1 <= s0:
            return None, None
        return (k1 - k0) / (t1 - t0), max(0, max_steps - s1) * (t1 - t0) / (s1 - s0)


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
