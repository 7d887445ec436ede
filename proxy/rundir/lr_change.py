"""What a changed experiment does to a started run's learning rate, said in one line.

Raising max_steps under a cosine stretches the whole curve: the step after
the last one trained jumps to a higher rate (issue: 0.0003 -> 0.00105 at
step 201 of a 200-step run extended to 400), which the user should see before
continuing. The rate is the engine's own (formats/lr_schedule.py), for the
step after the newest logged one, under the frozen experiment and the new one.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ..config.experiment import TrainConfig
from ..formats.lr_schedule import lr_at

# The train settings the learning rate of a step depends on.
SCHEDULE_KEYS = ("lr", "min_lr", "warmup", "max_steps", "lr_schedule", "decay_fraction")


def _rate(train: TrainConfig, step: int) -> float:
    return lr_at(
        step,
        lr=train.lr,
        min_lr=train.min_lr,
        warmup=train.warmup,
        steps=train.max_steps,
        schedule=train.lr_schedule,
        decay_fraction=train.decay_fraction,
    )


def lr_change_note(frozen: dict[str, Any], new: TrainConfig, next_step: int) -> str | None:
    """`the learning rate at step 201 goes from 0.0003 to 0.00105 (train.max_steps 200 -> 400)` when a
    setting the schedule reads differs between the frozen experiment (its JSON, defaults filled in) and
    the new one; None when none does or the frozen one no longer reads as an experiment."""
    try:
        old = TrainConfig.model_validate(frozen.get("train"))
    except ValidationError:
        return None
    changes = [
        f"train.{k} {getattr(old, k)} -> {getattr(new, k)}" for k in SCHEDULE_KEYS if getattr(old, k) != getattr(new, k)
    ]
    if not changes:
        return None
    before, after = _rate(old, next_step), _rate(new, next_step)
    what = f"stays {after:.6g}" if before == after else f"goes from {before:.6g} to {after:.6g}"
    return f"the learning rate at step {next_step} {what} ({', '.join(changes)})"
