"""Test data for engines: token rows, TRAIN frames and token shards, written through proxy/formats/.

The data of a step depends on the step and the seed only, so a resumed run is fed exactly the frames
the uninterrupted run was fed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from proxy.formats import frames
from proxy.formats.shard import write_shard

from .shape import Shape


def random_rows(shape: Shape, n_rows: int, seed: int) -> np.ndarray:
    """[n_rows, T+1] uint16 token rows, uniform in [0, vocab)."""
    return np.random.default_rng(seed).integers(0, shape.vocab, size=(n_rows, shape.ctx + 1), dtype=np.uint16)


def random_groups(n_rows: int, seed: int, n_groups: int = 3) -> np.ndarray:
    """A group id per row (the per-group losses of a step event)."""
    return np.random.default_rng(seed + 10_000).integers(0, n_groups, size=n_rows, dtype=np.uint16)


def markov_rows(shape: Shape, n_rows: int, seed: int) -> np.ndarray:
    """[n_rows, T+1] tokens from a fixed sparse Markov chain (4 likely successors per token), so the
    loss has somewhere to go and learning curves mean something."""
    chain = np.random.default_rng(12345)
    succ = chain.integers(0, shape.vocab, size=(shape.vocab, 4))
    rng = np.random.default_rng(seed)
    rows = np.empty((n_rows, shape.ctx + 1), dtype=np.uint16)
    tok = rng.integers(0, shape.vocab, size=n_rows)
    for t in range(shape.ctx + 1):
        rows[:, t] = tok
        pick = rng.integers(0, 4, size=n_rows)
        noise = rng.random(n_rows) < 0.1
        tok = np.where(noise, rng.integers(0, shape.vocab, size=n_rows), succ[tok, pick])
    return rows


def step_seed(seed: int, step: int) -> int:
    return seed * 100_003 + step


def train_frames(shape: Shape, first_step: int, n: int, seed: int = 7) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(step, tokens, groups) for steps first_step .. first_step+n-1: uniform random tokens."""
    return [
        (s, random_rows(shape, shape.rows, step_seed(seed, s)), random_groups(shape.rows, step_seed(seed, s)))
        for s in range(first_step, first_step + n)
    ]


def markov_frames(shape: Shape, first: int, last: int, seed: int = 7) -> dict[int, bytes]:
    """TRAIN frames (bytes) for steps first..last of learnable Markov-chain data, by step."""
    groups = (np.arange(shape.rows) % 3).astype(np.uint16)
    return {
        s: frames.train_frame(s, markov_rows(shape, shape.rows, step_seed(seed, s)), groups)
        for s in range(first, last + 1)
    }


def make_shard(path: Path, vocab: int, n_tokens: int = 20_000, seed: int = 0) -> Path:
    """A token shard of uniform random tokens for `vocab` (its directory made if needed)."""
    tokens = np.random.default_rng(seed).integers(0, vocab, size=n_tokens, dtype=np.uint16)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_shard(path, tokens, vocab)
    return path
