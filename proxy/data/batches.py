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
start is uniform over its arm's training tokens. Group id = arm index.

An arm's training tokens are one or more runs of ids (token files read in
place, formats/token_files.py), each memory-mapped; a row never spans two
of them, and a row's start is uniform over all the rows the arm's runs
hold. An arm of one run (any text arm) draws exactly as a single shard.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from ..config.bounds import TOLERANCE
from ..errors import EXIT_USAGE, ProxyError
from ..formats.token_files import TokenSegment

# A share of rows within this fraction of the rows of a whole number counts as that number (row_counts):
# above the rounding of a float sum, and above the tolerance caps and floors may sum to 1 with.
SHARE_TOLERANCE = 4 * TOLERANCE


class BatchError(ProxyError, ValueError):
    """Shards that cannot give rows of the requested length; the message says which."""

    code = EXIT_USAGE


def evenly_spaced(count: int, rows: int) -> np.ndarray:
    """`rows` indices evenly spaced over 0..count-1, the first 0 and the last count-1 (repeating when
    `count` is less than `rows`)."""
    return np.linspace(0, count - 1, rows).round().astype(np.int64) if rows > 1 else np.zeros(1, np.int64)


def evenly_spaced_starts(n_tokens: int, row_len: int, rows: int) -> np.ndarray:
    """`rows` row starts evenly spaced over `n_tokens` tokens, the first at 0 and the last ending at the end
    (overlapping only when the tokens are too few): the rule of the eval rows."""
    return evenly_spaced(n_tokens - row_len + 1, rows)


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


def eval_rows(val: np.ndarray, row_len: int, rows: int) -> np.ndarray:
    """The fixed validation rows of one arm: `rows` windows evenly spaced over its validation tokens."""
    offsets = evenly_spaced_starts(val.size, row_len, rows)
    return np.ascontiguousarray(sliding_window_view(val, row_len)[offsets], dtype=np.uint16)


def segment_arrays(segments: Sequence[TokenSegment]) -> list[np.ndarray]:
    """Each segment's ids, memory-mapped."""
    return [seg.array() for seg in segments]


class BatchSampler:
    """`train`: each arm's training runs of ids (arrays, memory-mapped); `val`: each arm's validation ids."""

    def __init__(
        self,
        train: Mapping[str, Sequence[np.ndarray]],
        val: Mapping[str, np.ndarray],
        arm_names: Sequence[str],
        seed: int,
        row_len: int,
    ):
        self.arm_names = list(arm_names)
        self.seed = int(seed)
        self.row_len = int(row_len)
        if self.row_len < 2:
            raise BatchError(f"row_len {row_len} must be at least 2")
        missing = [n for n in self.arm_names if n not in train or n not in val]
        if missing:
            raise BatchError(f"no train/val tokens for arm(s) {', '.join(missing)}")
        # each arm's runs long enough for a row, and the rows they hold
        self.train = [[t for t in train[n] if t.size >= self.row_len] for n in self.arm_names]
        self.val = [val[n] for n in self.arm_names]
        for name, runs, va in zip(self.arm_names, self.train, self.val, strict=False):
            if not runs or va.size < self.row_len:
                raise BatchError(
                    f"arm {name!r}: {sum(t.size for t in train[name])} train / {va.size} val tokens, "
                    f"fewer than one row of {self.row_len}"
                )
        # Windows over each run (views, no copies): row i of arm k is windows[k][run][offset].
        self._windows = [[sliding_window_view(t, self.row_len) for t in runs] for runs in self.train]
        counts = [np.array([t.size - self.row_len + 1 for t in runs], dtype=np.int64) for runs in self.train]
        self._run_starts = [np.concatenate([[0], np.cumsum(c)[:-1]]) for c in counts]
        self._n_offsets = np.array([c.sum() for c in counts], dtype=np.float64)
        self._eval_cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._eval_all_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # rows per arm -> all arms' rows

    @property
    def k(self) -> int:
        return len(self.arm_names)

    def generator(self, step: int) -> np.random.Generator:
        """The counter-based generator of one step: Philox keyed by (seed, step)."""
        return np.random.Generator(
            np.random.Philox(key=[self.seed & 0xFFFFFFFFFFFFFFFF, int(step) & 0xFFFFFFFFFFFFFFFF])
        )

    def assign_arms(self, weights: npt.ArrayLike, rows: int, gen: np.random.Generator) -> np.ndarray:
        """Systematic sampling of `rows` arm indices from `weights` (row_counts), shuffled."""
        w = np.asarray(weights, dtype=np.float64).reshape(-1)
        if w.size != self.k:
            raise ValueError(f"weights has {w.size} entries for {self.k} arms")
        counts = row_counts(w, rows, gen.random())
        return gen.permutation(np.repeat(np.arange(self.k), counts))

    def train_batch(self, step: int, weights: npt.ArrayLike, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens uint16 [rows, row_len], groups uint16 [rows]) for `step`."""
        gen = self.generator(step)
        arms = self.assign_arms(weights, rows, gen)
        n_off = self._n_offsets[arms]
        offsets = np.minimum(gen.random(rows) * n_off, n_off - 1).astype(np.int64)
        tokens = np.empty((rows, self.row_len), dtype=np.uint16)
        for k in np.unique(arms):
            sel = arms == k
            tokens[sel] = self._train_rows(int(k), offsets[sel])
        return tokens, arms.astype(np.uint16)

    def _train_rows(self, k: int, offsets: np.ndarray) -> np.ndarray:
        """Arm k's training rows at `offsets` (indices over all the rows its runs hold), [len, row_len]."""
        windows = self._windows[k]
        if len(windows) == 1:
            return windows[0][offsets]
        tokens = np.empty((offsets.size, self.row_len), dtype=np.uint16)
        run = np.searchsorted(self._run_starts[k], offsets, side="right") - 1
        for r in np.unique(run):
            mine = run == r
            tokens[mine] = windows[r][offsets[mine] - self._run_starts[k][r]]
        return tokens

    def spread_rows(self, arm_index: int, rows: int) -> np.ndarray:
        """`rows` training rows of one arm, evenly spaced over all the rows it holds (the rows whose
        unigram losses data/row_spread.py measures; the same every call)."""
        return self._train_rows(int(arm_index), evenly_spaced(int(self._n_offsets[arm_index]), int(rows)))

    def eval_offsets(self, arm_index: int, rows: int) -> np.ndarray:
        """Evenly spaced row starts over the arm's val shard (overlapping only when it is short)."""
        return evenly_spaced_starts(self.val[arm_index].size, self.row_len, rows)

    def eval_batch(self, arm_index: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """The fixed val rows of one arm: the same every call, whatever the step."""
        if not 0 <= arm_index < self.k:
            raise IndexError(f"arm index {arm_index} out of range for {self.k} arms")
        key = (int(arm_index), int(rows))
        if key not in self._eval_cache:
            tokens = eval_rows(self.val[arm_index], self.row_len, rows)
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
        return {n: int(sum(t.size for t in runs)) for n, runs in zip(self.arm_names, self.train, strict=False)}
