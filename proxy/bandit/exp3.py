"""EXP3, the smoothed variant of Online Data Mixing (Albalak et al., 2023).

The reward of an arm is its training loss (more loss: more left to learn),
importance-weighted by the probability the arm had in the mixture, and kept
as a smoothed estimate (docs/EXPERIMENTS.md):
    R_k <- s * R_k + (1 - s) * loss_k / p_k                  (s = smoothing, for each observed arm)
    eps_t = min(1/K, sqrt(ln K / (K t)))                     (t = observations + 1; eps_0 = 1/K)
    pi_k = (1 - K eps_t) * softmax(eps_{t-1} * R)_k + eps_t
then projected onto the capped simplex. p_k is the weight the arm had when
the step was drawn: the `mixture` passed to observe() (the supervisor logs it
in `.loss.json`), else the bandit's current weights.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from .base import Bandit

MIN_P = 1e-6


def exploration(t: int, k: int) -> float:
    if t <= 0 or k <= 1:
        return 1.0 / k
    return min(1.0 / k, math.sqrt(math.log(k) / (k * t)))


class EXP3(Bandit):
    policy = "exp3"

    def __init__(
        self,
        arm_names: Sequence[str],
        caps: Mapping[str, float],
        floors: Mapping[str, float],
        smoothing: float = 0.9,
        ema_alpha: float = 0.1,
    ):
        super().__init__(arm_names, caps, floors, ema_alpha)
        self.smoothing = float(smoothing)
        self.estimate = np.zeros(self.k)

    def observe(self, step: int, arm_losses: Mapping[str, float], mixture: Mapping[str, float] | None = None) -> None:
        parsed = self._parse(step, arm_losses)
        if mixture is not None:
            p = np.array([float(mixture.get(n, 0.0)) for n in self.arm_names])
        else:
            p = self.weights()
        for k, loss in parsed:
            self._update_ema(k, loss)
            r = loss / max(float(p[k]), MIN_P)
            self.estimate[k] = self.smoothing * self.estimate[k] + (1.0 - self.smoothing) * r
            self.pulls[k] += 1
        self.observations += 1
        self.last_step = int(step)
        self._weights = None

    def _target(self) -> np.ndarray:
        t = self.observations + 1
        eps_t, eps_prev = exploration(t, self.k), exploration(t - 1, self.k)
        z = eps_prev * self.estimate
        e = np.exp(z - z.max())
        return (1.0 - self.k * eps_t) * e / e.sum() + eps_t

    def _reward(self) -> np.ndarray:
        return self.estimate.copy()
