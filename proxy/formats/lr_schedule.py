"""The engine's learning-rate schedules (microgpt/model.h, mg_lr_at; docs/ENGINE.md), mirrored.

SCHEDULES lists the names in the order of their code in a checkpoint's
trailer (microgpt/config.h, MG_SCHEDULES). `lr_at` is the rate the engine
uses for the update producing step s (1-based): the same arithmetic on the
same float32 settings, so it agrees with the engine's `lr` in a step event
to float32 rounding. The qualification's checks, the warning a changed
schedule or max_steps prints, and the tests read it from here.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

Schedule = Literal["cosine", "wsd", "constant", "linear"]
SCHEDULES: tuple[Schedule, ...] = ("cosine", "wsd", "constant", "linear")  # trailer code = index
DEFAULT_SCHEDULE: Schedule = "cosine"
DEFAULT_DECAY_FRACTION = 0.2


def _progress(s: int, start: int, end: int) -> float:
    """The fraction of [start, end] that step s has covered, clamped to [0, 1]."""
    if end <= start:
        return 1.0
    return min(1.0, max(0.0, (s - start) / (end - start)))


def wsd_decay_start(steps: int, warmup: int, decay_fraction: float) -> int:
    """The last step of wsd's stable phase: its decay covers the final decay_fraction of `steps`
    (rounded to whole steps, at least one), never starting inside the warmup."""
    exact = float(np.float32(decay_fraction)) * steps
    decay = math.floor(exact)
    decay += exact - decay >= 0.5  # halves away from zero, as C's lround
    decay = max(1, decay)
    return max(steps - decay, warmup)


def lr_at(
    s: int,
    *,
    lr: float,
    min_lr: float,
    warmup: int,
    steps: int,
    schedule: str = DEFAULT_SCHEDULE,
    decay_fraction: float = DEFAULT_DECAY_FRACTION,
) -> float:
    """The learning rate of the update producing step s (1-based)."""
    peak, floor = np.float32(lr), np.float32(min_lr)
    if warmup > 0 and s <= warmup:
        return float(np.float32(float(peak) * s / warmup))
    drop = float(peak - floor)  # a float32 difference, as the engine computes it
    if schedule == "constant":
        return float(peak)
    if schedule == "linear":
        return float(np.float32(float(floor) + drop * (1.0 - _progress(s, warmup, steps))))
    if schedule == "wsd":
        start = wsd_decay_start(steps, warmup, decay_fraction)
        if s <= start:
            return float(peak)
        return float(np.float32(float(floor) + drop * (1.0 - _progress(s, start, steps))))
    if schedule != "cosine":
        raise ValueError(f"unknown learning-rate schedule {schedule!r}")
    cosine = 0.5 * (1.0 + math.cos(math.pi * _progress(s, warmup, steps)))
    return float(np.float32(float(floor) + drop * cosine))
