"""UCB1 over learning progress (ANDREA's policy).

Per arm k, over that arm's observed losses (docs/EXPERIMENTS.md):
    reward_k = max(0, EMA_k - loss_k) * reward_scale      (EMA before this loss; 0 on the first)
    EMA_k   <- alpha * loss_k + (1 - alpha) * EMA_k       (alpha = ema_alpha, 0.1)
    score_k  = mean(reward_k) + c * sqrt(2 ln N / n_k)    (n_k = pulls of k, N = sum of pulls)
Mixture: softmax(score / temperature) over the arms whose cap is above zero,
projected onto the capped simplex; temperature 0 puts all mass on the best
score (ties: first arm) before the projection. Arms never observed score
+infinity: while any exists, the target is uniform over them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from .base import Bandit


class UCB1(Bandit):
    policy = "ucb1"

    def __init__(
        self,
        arm_names: Sequence[str],
        caps: Mapping[str, float],
        floors: Mapping[str, float],
        c: float = 1.0,
        ema_alpha: float = 0.1,
        reward_scale: float = 1000.0,
        temperature: float = 10.0,
    ):
        super().__init__(arm_names, caps, floors, ema_alpha)
        self.c = float(c)
        self.reward_scale = float(reward_scale)
        self.temperature = float(temperature)
        self.reward_sum = np.zeros(self.k)
        self.last_reward = np.zeros(self.k)

    def observe(self, step: int, arm_losses: Mapping[str, float], mixture: Mapping[str, float] | None = None) -> None:
        for k, loss in self._parse(step, arm_losses):
            prev = self._update_ema(k, loss)
            r = 0.0 if math.isnan(prev) else max(0.0, prev - loss) * self.reward_scale
            self.reward_sum[k] += r
            self.last_reward[k] = r
            self.pulls[k] += 1
        self.observations += 1
        self.last_step = int(step)
        self._weights = None

    def mean_reward(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.pulls > 0, self.reward_sum / np.maximum(self.pulls, 1), 0.0)

    def scores(self) -> np.ndarray:
        n_total = int(self.pulls.sum())
        out = np.full(self.k, np.inf)
        seen = self.pulls > 0
        if seen.any():
            bonus = self.c * np.sqrt(2.0 * math.log(max(n_total, 1)) / self.pulls[seen])
            out[seen] = self.mean_reward()[seen] + bonus
        return out

    def _target(self) -> np.ndarray:
        active = self.caps > 0
        s = self.scores()
        target = np.zeros(self.k)
        unseen = active & ~np.isfinite(s)
        if unseen.any():
            target[unseen] = 1.0 / unseen.sum()
            return target
        if self.temperature == 0:
            best = int(np.argmax(np.where(active, s, -np.inf)))
            target[best] = 1.0
            return target
        z = np.where(active, (s - s[active].max()) / self.temperature, -np.inf)
        e = np.exp(z)
        return e / e.sum()

    def _reward(self) -> np.ndarray:
        return self.mean_reward()
