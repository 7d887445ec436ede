"""Bandits over data arms: the mixture each batch is drawn from.

`make_bandit(config, arm_names, caps, floors)` builds the configured policy;
`bandit_for_phase(experiment, phase)` a fresh one for a phase of a run.
Protocol: observe(step, arm_losses) once per step in step order, and
observe_eval(step, arm_losses) with each evaluation after the observe() of
its step; weights() gives the mixture (arm_names order, within caps and
floors, sum 1); state() is JSON-able. A bandit is a pure function of its
observe() and observe_eval() calls in order.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from ..config.caps import phase_bounds
from ..config.experiment import BanditConfig, Experiment
from .base import Bandit
from .exp3 import EXP3
from .learning_progress import Progress
from .simplex import project_capped_simplex
from .target import Target
from .ucb1 import UCB1
from .uniform import Uniform


def _ucb1(config: BanditConfig, arm_names: Sequence[str], caps: Mapping[str, float],
          floors: Mapping[str, float], targets: Sequence[str]) -> Bandit:
    return UCB1(arm_names, caps, floors, c=config.c, ema_alpha=config.ema_alpha,
                reward_scale=config.reward_scale, temperature=config.temperature)


def _exp3(config: BanditConfig, arm_names: Sequence[str], caps: Mapping[str, float],
          floors: Mapping[str, float], targets: Sequence[str]) -> Bandit:
    return EXP3(arm_names, caps, floors, smoothing=config.smoothing, ema_alpha=config.ema_alpha)


def _uniform(config: BanditConfig, arm_names: Sequence[str], caps: Mapping[str, float],
             floors: Mapping[str, float], targets: Sequence[str]) -> Bandit:
    return Uniform(arm_names, caps, floors)


def _progress(config: BanditConfig, arm_names: Sequence[str], caps: Mapping[str, float],
              floors: Mapping[str, float], targets: Sequence[str]) -> Bandit:
    return Progress(arm_names, caps, floors, ema_alpha=config.ema_alpha, window=config.window,
                    explore=config.explore, smoothing=config.smoothing, record_alpha=config.record_alpha)


def _target(config: BanditConfig, arm_names: Sequence[str], caps: Mapping[str, float],
            floors: Mapping[str, float], targets: Sequence[str]) -> Bandit:
    return Target(arm_names, caps, floors, targets=targets, ema_alpha=config.ema_alpha,
                  eval_window=config.eval_window, stall=config.stall, explore=config.explore,
                  max_move=config.max_move)


# One builder per policy in config/policies.py.
_BUILDERS = {"ucb1": _ucb1, "exp3": _exp3, "uniform": _uniform, "progress": _progress, "target": _target}


def make_bandit(config: BanditConfig, arm_names: Sequence[str], caps: Mapping[str, float],
                floors: Mapping[str, float], targets: Optional[Sequence[str]] = None) -> Bandit:
    """The configured policy over `arm_names`; `targets`: the arms whose validation loss is the objective
    (default: all of them; only the target policy reads it)."""
    build = _BUILDERS.get(config.policy)
    if build is None:
        raise ValueError(f"unknown bandit policy {config.policy!r}")
    return build(config, arm_names, caps, floors, list(arm_names) if targets is None else list(targets))


def bandit_for_phase(experiment: Experiment, phase) -> tuple[Bandit, dict[str, float], dict[str, float]]:
    """A new bandit for `phase` (its policy, the caps and floors in force) and those caps and floors."""
    caps, floors = phase_bounds(experiment, phase)
    config = experiment.bandit
    if config.policy != phase.policy:
        config = config.model_copy(update={"policy": phase.policy})
    return make_bandit(config, experiment.arm_names, caps, floors, experiment.target_arms), caps, floors


__all__ = ["Bandit", "UCB1", "EXP3", "Progress", "Target", "Uniform", "make_bandit", "bandit_for_phase",
           "project_capped_simplex"]
