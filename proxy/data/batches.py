"""Batches: rows of ctx + 1 tokens drawn from the arms' token shards.

The batch for step s is a pure function of (seed, s, weights): a fresh
counter-based generator, Philox keyed by (seed, s), makes every draw of that
step, and nothing is carried from one step to the next. So a relaunch that
replays step s gets the same rows, whatever happened before.

Per step: one uniform u places `rows` evenly spaced points (u + i) / rows on
the cumulative mixture (systematic sampling), which gives each arm
floor(w * rows) or ceil(w * rows) rows (row_counts: never one past its share,
so never past its cap, whatever the float rounding), and each row marginally
the arm distribution `weights`; the rows are then shuffled, and each row's
start is uniform over its arm's shard. Group id = arm index.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..config.bounds import TOLERANCE
from ..formats.shard import read_shard

# A share of rows within this fraction of the rows of a whole number counts as that number (row_counts):
# above the rounding of a float sum, and above the tolerance caps and floors may sum to 1 with.
SHARE_TOLERANCE = 4 * TOLERANCE


class BatchError(ValueError):
    """Shards that cannot give rows of the requested length; the message says which."""


def evenly_spaced_starts(n_tokens: int, row_len: int, rows: int) -> np.ndarray:
    """`rows` row starts evenly spaced over `n_tokens` tokens, the first at 0 and the last ending at the end
    (overlapping only when the tokens are too few): the rule of the eval rows."""
    return np.linspace(0, n_tokens - row_len, rows).round().astype(np.int64) if rows > 1 else np.zeros(1, np.int64)


def row_counts(weights: np.ndarray, rows: int, u: float) -> np.ndarray:
    """How many of `rows` rows each arm gets: systematic sampling, `rows` points (u + i) / rows on the
    cumulative mixture, which gives arm i floor or ceil of its share weights_i / sum * rows.

    The rounding rule, exactly: a share within SHARE_TOLERANCE * rows of a whole number is that number.
    Float rounding in the cumulative sum (or weights summing to 1 only within the bounds' tolerance) can
    otherwise move a point across a boundary and give an arm one row past its share, so past its cap
    when the cap is a whole number of rows; the counts are held to [floor, ceil] of the shares as the
    rule reads them, a row moving to the arm furthest below its share (or from the one furthest above).
    """
    if not np.all(np.isfinite(weights)) or np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError(f"weights must be finite, non-negative and not all zero: {weights}")
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    points = (u + np.arange(rows)) / rows
    arms = np.searchsorted(cdf, points, side="right")
    np.minimum(arms, int(np.flatnonzero(weights > 0)[-1]), out=arms)
    counts = np.bincount(arms, minlength=weights.size)
    share = weights / weights.sum() * rows
    tol = SHARE_TOLERANCE * rows
    low, high = np.floor(share + tol).astype(np.int64), np.ceil(share - tol).astype(np.int64)
    while True:
        gap = share - counts  # > 0: the arm has fewer rows than its share
        over, under = np.flatnonzero(counts > high), np.flatnonzero(counts < low)
        if over.size:
            takers = np.flatnonzero(counts < high)
            if not takers.size:
                break
            counts[over[0]] -= 1
            counts[takers[np.argmax(gap[takers])]] += 1
        elif under.size:
            givers = np.flatnonzero(counts > low)
            if not givers.size:
                break
            counts[under[0]] += 1
            counts[givers[np.argmin(gap[givers])]] -= 1
        else:
            break
    return counts


class BatchSampler:
    def __init__(self, train_shards: Mapping[str, str | os.PathLike], val_shards: Mapping[str, str | os.PathLike],
                 arm_names: Sequence[str], seed: int, row_len: int):
        self.arm_names = list(arm_names)
        self.seed = int(seed)
        self.row_len = int(row_len)
        if self.row_len < 2:
            raise BatchError(f"row_len {row_len} must be at least 2")
        missing = [n for n in self.arm_names if n not in train_shards or n not in val_shards]
        if missing:
            raise BatchError(f"no train/val shard for arm(s) {', '.join(missing)}")
        self.train = [read_shard(Path(train_shards[n]))[0] for n in self.arm_names]
        self.val = [read_shard(Path(val_shards[n]))[0] for n in self.arm_names]
        for name, tr, va in zip(self.arm_names, self.train, self.val):
            if tr.size < self.row_len or va.size < self.row_len:
                raise BatchError(f"arm {name!r}: {tr.size} train / {va.size} val tokens, "
                                 f"fewer than one row of {self.row_len}")
        # Windows over each shard (views, no copies): row i of arm k is windows[k][offset].
        self._windows = [sliding_window_view(t, self.row_len) for t in self.train]
        self._n_offsets = np.array([t.size - self.row_len + 1 for t in self.train], dtype=np.float64)
        self._eval_cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._eval_all_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # rows per arm -> all arms' rows

    @property
    def k(self) -> int:
        return len(self.arm_names)

    def generator(self, step: int) -> np.random.Generator:
        """The counter-based generator of one step: Philox keyed by (seed, step)."""
        return np.random.Generator(np.random.Philox(key=[self.seed & 0xFFFFFFFFFFFFFFFF, int(step) & 0xFFFFFFFFFFFFFFFF]))

    def assign_arms(self, weights, rows: int, gen: np.random.Generator) -> np.ndarray:
        """Systematic sampling of `rows` arm indices from `weights` (row_counts), shuffled."""
        w = np.asarray(weights, dtype=np.float64).reshape(-1)
        if w.size != self.k:
            raise ValueError(f"weights has {w.size} entries for {self.k} arms")
        counts = row_counts(w, rows, gen.random())
        return gen.permutation(np.repeat(np.arange(self.k), counts))

    def train_batch(self, step: int, weights, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens uint16 [rows, row_len], groups uint16 [rows]) for `step`."""
        gen = self.generator(step)
        arms = self.assign_arms(weights, rows, gen)
        n_off = self._n_offsets[arms]
        offsets = np.minimum(gen.random(rows) * n_off, n_off - 1).astype(np.int64)
        tokens = np.empty((rows, self.row_len), dtype=np.uint16)
        for k in np.unique(arms):
            sel = arms == k
            tokens[sel] = self._windows[k][offsets[sel]]
        return tokens, arms.astype(np.uint16)

    def eval_offsets(self, arm_index: int, rows: int) -> np.ndarray:
        """Evenly spaced row starts over the arm's val shard (overlapping only when it is short)."""
        return evenly_spaced_starts(self.val[arm_index].size, self.row_len, rows)

    def eval_batch(self, arm_index: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """The fixed val rows of one arm: the same every call, whatever the step."""
        if not 0 <= arm_index < self.k:
            raise IndexError(f"arm index {arm_index} out of range for {self.k} arms")
        key = (int(arm_index), int(rows))
        if key not in self._eval_cache:
            offsets = self.eval_offsets(arm_index, rows)
            val_windows = sliding_window_view(self.val[arm_index], self.row_len)
            tokens = np.ascontiguousarray(val_windows[offsets], dtype=np.uint16)
            groups = np.full(rows, arm_index, dtype=np.uint16)
            tokens.setflags(write=False)
            groups.setflags(write=False)
            self._eval_cache[key] = (tokens, groups)
        return self._eval_cache[key]

    def eval_batch_all(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Every arm's fixed val rows in one batch, arm after arm (group id = arm index): one EVAL frame
        for the whole evaluation. Each arm's rows are the ones `eval_batch` gives it."""
        rows = int(rows)
        if rows not in self._eval_all_cache:
            parts = [self.eval_batch(arm, rows) for arm in range(self.k)]
            tokens = np.concatenate([t for t, _g in parts])
            groups = np.concatenate([g for _t, g in parts])
            tokens.setflags(write=False)
            groups.setflags(write=False)
            self._eval_all_cache[rows] = (tokens, groups)
        return self._eval_all_cache[rows]

    def tokens_per_arm(self) -> dict[str, int]:
        return {n: int(t.size) for n, t in zip(self.arm_names, self.train)}
