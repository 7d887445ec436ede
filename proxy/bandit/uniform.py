"""Uniform: every arm the same weight, whatever the losses (the baseline a curating policy must beat).

The target is 1/K for every arm, projected onto the capped simplex like any
policy's, so caps and floors hold. The batch sampler's systematic sampling
turns equal weights into stratified batches: each arm gets floor(rows / K) or
ceil(rows / K) rows of every step, a pure function of (seed, step).
Observations only keep the per-arm pull counts and loss EMAs shown in
.state.json; they never move the mixture.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .base import Bandit


class Uniform(Bandit):
    policy = "uniform"

    def observe(self, step: int, arm_losses: Mapping[str, float], mixture: Mapping[str, float] | None = None) -> None:
        self._observe_losses(step, arm_losses)

    def _target(self) -> np.ndarray:
        return np.full(self.k, 1.0 / self.k)

    def _reward(self) -> np.ndarray:
        return np.zeros(self.k)
