"""What counts as a diverged run, written once (docs/OPERATIONS.md, "A run that diverges").

A training step's loss is *sane* when it is finite and at most
SANE_LOSS_FACTOR times ln(vocab), the cross-entropy of a uniform guess over
the vocabulary: a model twice as wrong as one that knows nothing has
diverged, and no healthy run's loss spike comes near that (every run starts
near ln(vocab) and goes down). A checkpoint is sane when the loss `.loss.json`
logged for its step is sane, and so is every step of its phase before it (the
last entry of each): a step the engine trained after a diverged one (a frame
already in flight when the proxy saw the loss) descends from diverged weights,
whatever its own loss.

The engine refuses to write a checkpoint whose weights or Adam moments are
not finite, and stops with exit 6 on a non-finite loss or gradient norm; the
proxy stops a run at its first step whose loss is not sane. Either way the
run ends with one line naming the step and the newest sane checkpoint, and a
relaunch resumes there (rundir/resume.py passes over checkpoints that are not
sane); checkpoint retention never deletes the newest sane checkpoint.
"""

from __future__ import annotations

import math

SANE_LOSS_FACTOR = 2.0
MIN_VOCAB = 258  # the smallest vocabulary a model has (config/experiment.py): the lowest bound of all


def loss_bound(vocab: int) -> float:
    """The largest sane training loss for a model over `vocab` tokens."""
    return SANE_LOSS_FACTOR * math.log(max(2, int(vocab)))


def lowest_bound() -> float:
    """A loss at or below this is sane for every model: the log's index keeps only the losses above it."""
    return loss_bound(MIN_VOCAB)


def sane_loss(loss: float, vocab: int) -> bool:
    return math.isfinite(loss) and loss <= loss_bound(vocab)


def insanity(loss: float, vocab: int) -> str:
    """Why a loss is not sane, for a message."""
    if not math.isfinite(loss):
        return f"loss {loss}"
    return (
        f"loss {loss:.6g}, above {loss_bound(vocab):.4g} ({SANE_LOSS_FACTOR:g} x ln(vocab {vocab}): "
        f"{SANE_LOSS_FACTOR:g} times the loss of a uniform guess)"
    )
