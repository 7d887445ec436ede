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

from collections.abc import Mapping, Sequence
from typing import Protocol

from ..config.caps import PhaseBounds, phase_bounds
from ..config.experiment import Experiment
from ..config.policies import (
    EXP3Config,
    PolicyConfig,
    ProgressConfig,
    TargetConfig,
    UCB1Config,
    UniformConfig,
    switched,
)
from .base import Bandit
from .exp3 import EXP3
from .learning_progress import LearningProgress
from .simplex import project_capped_simplex
from .target import Target
from .ucb1 import UCB1
from .uniform import Uniform

# One bandit class per policy model of config/policies.py; each constructor takes the model's params() by name.
_CLASSES: dict[type[PolicyConfig], type[Bandit]] = {
    UCB1Config: UCB1,
    EXP3Config: EXP3,
    UniformConfig: Uniform,
    ProgressConfig: LearningProgress,
    TargetConfig: Target,
}


def make_bandit(
    config: PolicyConfig,
    arm_names: Sequence[str],
    caps: Mapping[str, float],
    floors: Mapping[str, float],
    targets: Sequence[str] | None = None,
    row_spread: Mapping[str, float] | None = None,
    max_steps: int = 0,
    unigram_gap: Mapping[str, float] | None = None,
) -> Bandit:
    """The configured policy over `arm_names`; `targets`: the arms whose validation loss is the objective
    (default: all of them), `row_spread`: each target arm's row spread (data/row_spread.py; default none:
    the targets' even share), `max_steps`: the run's steps when this bandit starts it at step 0, else 0
    (no opening), `unigram_gap`: each other arm's (data/row_spread.py; default none: no arm fed in the
    opening). Only the target policy reads them."""
    cls = _CLASSES.get(type(config))
    if cls is None:
        raise ValueError(f"unknown bandit policy {config.policy!r}")
    if cls is Target:
        return Target(
            arm_names,
            caps,
            floors,
            targets=list(arm_names) if targets is None else list(targets),
            row_spread=row_spread,
            max_steps=max_steps,
            unigram_gap=unigram_gap,
            **config.params(),
        )
    return cls(arm_names, caps, floors, **config.params())


class PhaseStart(PhaseBounds, Protocol):
    """A phase (rundir/phases.py's Phase, a layer above this one) as a bandit is made for it."""

    @property
    def start_step(self) -> int: ...


def bandit_for_phase(
    experiment: Experiment,
    phase: PhaseStart,
    row_spread: Mapping[str, float] | None = None,
    unigram_gap: Mapping[str, float] | None = None,
) -> tuple[Bandit, dict[str, float], dict[str, float]]:
    """A new bandit for `phase` (its policy, the caps and floors in force) and those caps and floors;
    `row_spread` and `unigram_gap` as make_bandit's; a phase that starts at step 0 starts the run (the
    target policy's opening)."""
    caps, floors = phase_bounds(experiment, phase)
    config = switched(experiment.bandit, phase.policy)
    max_steps = experiment.train.max_steps if phase.start_step == 0 else 0
    bandit = make_bandit(
        config, experiment.arm_names, caps, floors, experiment.target_arms, row_spread, max_steps, unigram_gap
    )
    return bandit, caps, floors


__all__ = [
    "Bandit",
    "UCB1",
    "EXP3",
    "LearningProgress",
    "Target",
    "Uniform",
    "make_bandit",
    "bandit_for_phase",
    "project_capped_simplex",
]
