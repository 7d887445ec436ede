"""Which mixture each step is drawn from: the bandit of a phase and the mixtures it has fixed ahead of time.

The determinism contract (docs/ARCHITECTURE.md): step s is drawn from W(s),
the bandit's weights right after it observed step s - lag (and that step's
evaluation, if any, only after it), or the bandit's initial weights when
s - lag is at or before the phase's start step. A MixtureSchedule holds W(s)
from the moment it is known until step s is observed, so the live run (the
engine's step events) and the replay of `.loss.json` at a launch call the
same two methods in the same order and get the same floats.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .base import Bandit


class MixtureSchedule:
    """The bandit of the current phase and W(s) of every step s whose mixture is known and not yet observed."""

    bandit: Bandit
    lag: int
    start_step: int
    mixtures: dict[int, np.ndarray]  # step -> W(step), from when it is known until the step is observed

    def __init__(self, bandit: Bandit, lag: int, start_step: int, first_step: int):
        """A schedule whose next step to draw is `first_step`, for a phase whose first step is start_step + 1.
        `bandit` is fresh: the steps among first_step..first_step+lag-1 that rest on no observation of this
        phase (s - lag <= start_step) get its initial weights now; a launch past the phase's start then
        replays the phase's logged steps through observe() and observe_eval(), as the live run gave them."""
        if lag < 1:
            raise ValueError(f"lag must be at least 1, not {lag}")
        self.bandit = bandit
        self.lag = int(lag)
        self.start_step = int(start_step)
        initial = self._snapshot()
        self.mixtures = {
            s: initial for s in range(first_step, first_step + self.lag) if s - self.lag <= self.start_step
        }

    def _snapshot(self) -> np.ndarray:
        return np.array(self.bandit.weights(), dtype=np.float64, copy=True)

    def mixture_for(self, step: int) -> np.ndarray | None:
        """W(step) in arm order, or None while step - lag is not yet observed (or step is already observed)."""
        return self.mixtures.get(step)

    def named(self, step: int) -> dict[str, float]:
        """W(step) by arm name, as `.loss.json` logs it (the floats observe() is then given back)."""
        weights = self.mixtures.get(step)
        if weights is None:
            raise KeyError(f"the mixture of step {step} is not known")
        return {name: float(w) for name, w in zip(self.bandit.arm_names, weights, strict=False)}

    def observe(self, step: int, arm_losses: Mapping[str, float], mixture: Mapping[str, float]) -> None:
        """Step `step` trained with per-arm losses `arm_losses`, drawn from `mixture` (as logged: the floats the
        replay reads back from `.loss.json`): the bandit observes it, W(step) is no longer kept, and
        W(step + lag) is fixed."""
        self.bandit.observe(step, arm_losses, mixture=mixture)
        self.mixtures.pop(step, None)
        self.mixtures[step + self.lag] = self._snapshot()

    def observe_eval(self, step: int, arm_losses: Mapping[str, float]) -> None:
        """The evaluation of `step` (after observe(step), before observe(step + 1)): it moves W(step + 1 + lag)
        onward, never a mixture already fixed."""
        self.bandit.observe_eval(step, arm_losses)
