"""The experiment's `log` block: where a run's metrics go besides its own records (docs/EXPERIMENTS.md, "log").

    "log": {"tensorboard": true, "wandb": {"project": "microgpt", "mode": "offline"}}

Both are off by default. The tracker (proxy/tracking/) follows the run
directory's records from a process of its own, so nothing here can slow or
stop training.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .strict import MAX_NAME, StrictModel, Word


class WandbConfig(StrictModel):
    """A Weights & Biases run (the optional `wandb` extra). Offline runs are written under RUN/wandb/ and
    can be uploaded later with `wandb sync`."""

    project: Word = Field(min_length=1)
    entity: Word | None = None
    mode: Literal["offline", "online"] = "offline"
    name: Word | None = None  # the W&B run's display name (default: the experiment's name)
    tags: list[Word] = Field(default_factory=list, max_length=MAX_NAME)


class LogConfig(StrictModel):
    tensorboard: bool = False  # event files in RUN/tensorboard/
    wandb: WandbConfig | None = None

    @property
    def enabled(self) -> bool:
        return self.tensorboard or self.wandb is not None
