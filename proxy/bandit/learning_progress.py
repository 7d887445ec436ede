"""Learning progress: the mixture follows how fast each arm's loss still reaches new lows.

An arm's reward is its learning speed: how fast its record low falls. Per
pull of arm k (docs/DATA-MIXING.md):

    smooth_k <- a * loss_k + (1 - a) * smooth_k     a = record_alpha; the first loss sets it
    record_k <- min(record_k, smooth_k)              the lowest smoothed loss so far
    speed_k   = -(least-squares slope of record_k against the step over arm k's last `window`
                pulls; 0 with fewer than 3)

Fitted over many pulls, not max(0, EMA - loss) per pull, so noise on a flat
loss earns nothing (a smoothed loss that only wobbles sets no new lows), and
only new ground counts: an unlearnable arm whose loss rises while the model
sharpens on other data and then falls back (random tokens do this) earns
nothing for coming back, and an arm already learned (duplicates, once
memorised) falls to 0 once its learning leaves the window.

Mixture: every arm its floor, then `explore` of the remaining mass evenly,
then the rest in proportion to speed_k, all within the caps (`allocate`;
evenly where no arm below its cap shows progress), smoothed over steps:

    mix <- smoothing * mix + (1 - smoothing) * allocate(...)   (unchanged while no arm shows progress)

It starts uniform (within the caps and floors), and is a pure function of
the observe() calls, so a replay of .loss.json rebuilds it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

import numpy as np

from .base import Bandit

MIN_POINTS = 3


def fill(base: np.ndarray, scores: np.ndarray, caps: np.ndarray, mass: float) -> np.ndarray:
    """`base` plus `mass` handed out in proportion to `scores` (evenly among the arms below
    their caps where none of those scores), never past a cap: a capped arm's excess goes to
    the others the same way (water filling)."""
    w = base.astype(np.float64).copy()
    goal = w.sum() + mass
    free = caps > w
    while free.any() and goal - w.sum() > 0:
        rest = goal - w.sum()
        s = np.where(free, scores, 0.0)
        add = s / s.sum() * rest if s.sum() > 0 else free / free.sum() * rest
        over = free & (w + add >= caps)
        if not over.any():
            return w + add
        w[over] = caps[over]
        free &= ~over
    return w


def allocate(speed: np.ndarray, floors: np.ndarray, caps: np.ndarray, explore: float) -> np.ndarray:
    """Every arm its floor, then `explore` of the spare mass evenly, then the rest in
    proportion to max(0, speed), all within the caps. (The Euclidean projection would hand
    a capped arm's excess out evenly, so an arm that shows no progress would get some; here
    it keeps its floor and its part of `explore` while another arm can take the mass.)"""
    w = fill(floors, np.ones_like(floors), caps, explore * (1.0 - floors.sum()))
    return fill(w, np.maximum(speed, 0.0), caps, 1.0 - w.sum())


def fitted_slope(points: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of value against step through (step, value) points (0: too few)."""
    if len(points) < MIN_POINTS:
        return 0.0
    t, value = np.array(points, dtype=np.float64).T
    dt = t - t.mean()
    return float(dt @ (value - value.mean())) / float(dt @ dt)


class LearningProgress(Bandit):
    policy = "progress"

    def __init__(
        self,
        arm_names: Sequence[str],
        caps: Mapping[str, float],
        floors: Mapping[str, float],
        ema_alpha: float = 0.1,
        window: int = 100,
        explore: float = 0.05,
        smoothing: float = 0.9,
        record_alpha: float = 0.05,
    ):
        super().__init__(arm_names, caps, floors, ema_alpha)  # ema_alpha: the EMA .state.json shows
        self.record_alpha = float(record_alpha)
        self.smooth = np.full(self.k, np.nan)
        self.explore = float(explore)
        self.smoothing = float(smoothing)
        self.record = np.full(self.k, np.inf)
        # (step, record) of the last pulls
        self.points: list[deque[tuple[float, float]]] = [deque(maxlen=int(window)) for _ in range(self.k)]
        self.mix = allocate(np.zeros(self.k), self.floors, self.caps, self.explore)

    def observe(self, step: int, arm_losses: Mapping[str, float], mixture: Mapping[str, float] | None = None) -> None:
        for k, loss in self._parse(step, arm_losses):
            self._update_ema(k, loss)
            prev = self.smooth[k]
            self.smooth[k] = loss if np.isnan(prev) else self.record_alpha * loss + (1.0 - self.record_alpha) * prev
            self.record[k] = min(self.record[k], self.smooth[k])
            self.points[k].append((float(step), float(self.record[k])))
            self.pulls[k] += 1
        self.observations += 1
        self.last_step = int(step)
        speed = self.speed()
        if speed.any():  # no arm setting new lows is no evidence to move on
            target = allocate(speed, self.floors, self.caps, self.explore)
            self.mix = self.smoothing * self.mix + (1.0 - self.smoothing) * target
        self._weights = None

    def speed(self) -> np.ndarray:
        """Each arm's record-low drop per step over its window (>= 0: records never rise)."""
        return np.array([max(0.0, -fitted_slope(p)) for p in self.points])

    def _target(self) -> np.ndarray:
        return self.mix

    def _reward(self) -> np.ndarray:
        return self.speed()
