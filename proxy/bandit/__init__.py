"""Bandits over data arms: the mixture each batch is drawn from.

`make_bandit(config, arm_names, caps, floors)` builds the configured policy.
Protocol: observe(step, arm_losses) once per step in step order; weights()
gives the mixture (arm_names order, within caps and floors, sum 1); state()
is JSON-able. A bandit is a pure function of its observe() calls.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from ..experiment import BanditConfig
from .base import Bandit
from .exp3 import EXP3
from .progress import Progress
from .simplex import project_capped_simplex
from .ucb1 import UCB1
from .uniform import Uniform


def make_bandit(config: BanditConfig, arm_names: Sequence[str], caps: Mapping[str, float],
                floors: Mapping[str, float]) -> Bandit:
    if config.policy == "ucb1":
        return UCB1(arm_names, caps, floors, c=config.c, ema_alpha=config.ema_alpha,
                    reward_scale=config.reward_scale, temperature=config.temperature)
    if config.policy == "exp3":
        return EXP3(arm_names, caps, floors, smoothing=config.smoothing, ema_alpha=config.ema_alpha)
    if config.policy == "uniform":
        return Uniform(arm_names, caps, floors)
    if config.policy == "progress":
        return Progress(arm_names, caps, floors, ema_alpha=config.ema_alpha, window=config.window,
                        explore=config.explore, smoothing=config.smoothing, record_alpha=config.record_alpha)
    raise ValueError(f"unknown bandit policy {config.policy!r}")


__all__ = ["Bandit", "UCB1", "EXP3", "Progress", "Uniform", "make_bandit", "project_capped_simplex"]
