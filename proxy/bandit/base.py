"""What every bandit shares: arms, caps and floors, state bookkeeping."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from .simplex import check_bounds, project_capped_simplex


class Bandit:
    """A mixture policy over arms. A pure function of the sequence of observe()
    calls: no clock, no global RNG, so replaying `.loss.json` rebuilds it."""

    policy = "base"

    def __init__(
        self, arm_names: Sequence[str], caps: Mapping[str, float], floors: Mapping[str, float], ema_alpha: float = 0.1
    ):
        self.arm_names = list(arm_names)
        if not self.arm_names:
            raise ValueError("a bandit needs at least one arm")
        if len(set(self.arm_names)) != len(self.arm_names):
            raise ValueError("arm names must be unique")
        self.index = {n: i for i, n in enumerate(self.arm_names)}
        self.caps = np.array([float(caps.get(n, 1.0)) for n in self.arm_names])
        self.floors = np.array([float(floors.get(n, 0.0)) for n in self.arm_names])
        check_bounds(self.floors, self.caps)
        self.ema_alpha = float(ema_alpha)
        k = len(self.arm_names)
        self.pulls = np.zeros(k, dtype=np.int64)
        self.ema = np.full(k, np.nan)
        self.observations = 0  # observe() calls
        self.last_step: int | None = None
        self._weights: np.ndarray | None = None

    @property
    def k(self) -> int:
        return len(self.arm_names)

    def _parse(self, step: int, arm_losses: Mapping[str, float]) -> list[tuple[int, float]]:
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(f"observe(step={step}) after step {self.last_step}: steps must increase")
        out = []
        for name, loss in arm_losses.items():
            if name not in self.index:
                raise ValueError(f"unknown arm {name!r} (arms: {', '.join(self.arm_names)})")
            loss = float(loss)
            if math.isfinite(loss):
                out.append((self.index[name], loss))
        out.sort()
        return out

    def _update_ema(self, k: int, loss: float) -> float:
        """Update arm k's loss EMA; return the EMA before this loss (NaN on the first)."""
        prev = self.ema[k]
        self.ema[k] = loss if math.isnan(prev) else self.ema_alpha * loss + (1.0 - self.ema_alpha) * prev
        return prev

    def _observe_losses(self, step: int, arm_losses: Mapping[str, float]) -> None:
        """What every policy records of a step whose losses it takes as they are: each arm's loss EMA and
        pull count, and the step."""
        for k, loss in self._parse(step, arm_losses):
            self._update_ema(k, loss)
            self.pulls[k] += 1
        self.observations += 1
        self.last_step = int(step)

    def observe(self, step: int, arm_losses: Mapping[str, float], mixture: Mapping[str, float] | None = None) -> None:
        raise NotImplementedError

    def observe_eval(self, step: int, arm_losses: Mapping[str, float]) -> None:
        """One evaluation's validation loss per arm, given after observe(step) and before observe(step + 1).
        Only the target policy reads them; the others ignore them."""

    def _target(self) -> np.ndarray:
        """The policy's unconstrained mixture (a point to project)."""
        raise NotImplementedError

    def weights(self) -> np.ndarray:
        """The mixture for the next draw, in arm_names order, within caps and floors, summing to 1."""
        if self._weights is None:
            self._weights = project_capped_simplex(self._target(), self.floors, self.caps)
        return self._weights.copy()

    def mixture(self) -> dict[str, float]:
        return dict(zip(self.arm_names, map(float, self.weights()), strict=False))

    def _reward(self) -> np.ndarray:
        raise NotImplementedError

    def state(self) -> dict:
        w, r = self.weights(), self._reward()

        def num(x: float) -> float | None:
            return None if not math.isfinite(x) else float(x)

        return {
            "policy": self.policy,
            "observations": self.observations,
            "last_step": self.last_step,
            "arms": {
                n: {
                    "pulls": int(self.pulls[i]),
                    "ema": num(self.ema[i]),
                    "reward": num(r[i]),
                    "weight": float(w[i]),
                    "cap": float(self.caps[i]),
                    "floor": float(self.floors[i]),
                }
                for i, n in enumerate(self.arm_names)
            },
        }

    def replay(self, entries: Iterable[tuple[int, Mapping[str, float]]]) -> Bandit:
        """observe() each (step, arm_losses) in order; returns self."""
        for step, losses in entries:
            self.observe(step, losses)
        return self
