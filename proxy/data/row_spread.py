"""What the target policy knows of the data before the first step: each target arm's row spread, each
other arm's unigram gap.

Row spread: how much an arm's rows disagree with each other.

The target policy's prior (bandit/target.py) weights each target arm by the inverse square of its row
spread. Why: for its first hundred steps the model is close to a unigram model of what it is fed (its
validation loss there is about the data's unigram entropy), and those steps decide most of where the
run ends (docs/DATA-MIXING.md, "What a policy cannot see"). A batch holds a few rows, so the noise of
its gradient is the spread of its rows' losses; an arm whose rows' unigram losses spread widely (the
standard library's code: source files, data tables and tests side by side) makes the noisiest batches
per row, and 1/spread^2 is the inverse of that noise's variance.

Per target arm k, over ROWS training rows evenly spaced over all the rows it holds:

    p(t)     = the mean over the target arms of each arm's frequency of token t in those rows,
               smoothed (each count + 1/2), so every token the objective weighs has a probability
    loss(r)  = the mean of -log p(t) over row r's tokens
    spread_k = the standard deviation of loss(r) over arm k's rows

A pure function of the prepared tokens: the same data gives the same spreads, bit for bit, on every
launch, so the policy replayed from `.loss.json` is the policy that ran.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from .batches import BatchSampler

ROWS = 1024  # rows per arm: about 260K tokens at ctx 256, a fraction of a second to count


def _neg_log_p(arm_tokens: Iterable[np.ndarray], vocab: int) -> np.ndarray:
    """-log p(t) per token id, p the mean over the arms of each arm's token frequencies (each count + 1/2)."""
    frequency = np.zeros(int(vocab), dtype=np.float64)
    for tokens in arm_tokens:
        counts = np.bincount(tokens.reshape(-1), minlength=int(vocab)) + 0.5
        frequency += counts / counts.sum()
    return -np.log(frequency / frequency.sum())


def row_spread(sampler: BatchSampler, targets: Sequence[str], vocab: int, rows: int = ROWS) -> dict[str, float]:
    """Each target arm's row spread (module docstring), by name."""
    index = {n: i for i, n in enumerate(sampler.arm_names)}
    tokens = {name: sampler.spread_rows(index[name], rows).astype(np.int64) for name in targets}
    neg_log_p = _neg_log_p(tokens.values(), vocab)
    return {name: float(neg_log_p[arm_rows].mean(axis=1).std()) for name, arm_rows in tokens.items()}


def unigram_gap(sampler: BatchSampler, targets: Sequence[str], vocab: int, rows: int = ROWS) -> dict[str, float]:
    """Each arm not among `targets`: how far below the target arms its loss is at the unigram stage, over
    ROWS training rows of every arm evenly spaced over it (bandit/target.py's opening):

        p(t)    = the mean over all the arms of each arm's frequency of token t (each count + 1/2): what a
                  model that has learned only which tokens an even mix of the arms holds predicts
        loss_k  = the mean of -log p(t) over arm k's tokens
        gap_k   = the mean of loss over the target arms - loss_k

    Large for an arm of few distinct tokens (names repeated many times over), about 0 for text of the
    targets' kind, shuffled or not, negative for random tokens. A pure function of the prepared tokens."""
    tokens = {
        name: sampler.spread_rows(k, rows).astype(np.int64).reshape(-1) for k, name in enumerate(sampler.arm_names)
    }
    neg_log_p = _neg_log_p(tokens.values(), vocab)
    loss = {name: float(neg_log_p[arm_tokens].mean()) for name, arm_tokens in tokens.items()}
    target_loss = float(np.mean([loss[name] for name in targets]))
    return {name: target_loss - value for name, value in loss.items() if name not in targets}
