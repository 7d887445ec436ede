"""What the data says before training (data/row_spread.py): the row spread (how much an arm's rows disagree
under the targets' unigram; the target policy's prior weighs target arms by it) and the unigram gap (how far
below the targets an arm's loss is at the unigram stage; the target policy's opening feeds an arm by it)."""

from __future__ import annotations

import numpy as np

from proxy.data.batches import BatchSampler
from proxy.data.row_spread import row_spread, unigram_gap

VOCAB = 64
ROW = 33


def blocks(rng: np.random.Generator, n: int, alphabets: list[np.ndarray], block: int) -> np.ndarray:
    """`n` tokens in blocks of `block`, each block drawn from the next alphabet in turn."""
    parts = [rng.choice(alphabets[i % len(alphabets)], block) for i in range(n // block)]
    return np.concatenate(parts).astype(np.uint16)


def sampler(train: dict[str, list[np.ndarray]]) -> BatchSampler:
    val = {name: runs[0][: 4 * ROW] for name, runs in train.items()}
    return BatchSampler(train, val, list(train), seed=1, row_len=ROW)


def test_rows_that_disagree_spread_more_than_rows_alike():
    """`alike`: every row from the same 32 tokens; `mixed`: whole rows of prose-like tokens, then whole
    rows of table-like ones (the code arm's source files beside its data tables); `narrow`: every row
    from the same 8 tokens."""
    rng = np.random.default_rng(0)
    low, high = np.arange(32), np.arange(32, 64)
    arms = {
        "alike": [blocks(rng, 40_000, [np.arange(64)], 40_000)],
        "mixed": [blocks(rng, 40_000, [low, high[:4]], 4 * ROW)],
        "narrow": [blocks(rng, 40_000, [np.arange(8)], 40_000)],
    }
    spread = row_spread(sampler(arms), ["alike", "mixed", "narrow"], VOCAB)
    assert set(spread) == {"alike", "mixed", "narrow"}
    assert spread["mixed"] > 3 * spread["alike"] and spread["mixed"] > 3 * spread["narrow"]
    assert all(v > 0 for v in spread.values())


def test_only_the_target_arms_and_bit_for_bit_the_same_on_every_call():
    rng = np.random.default_rng(1)
    arms = {n: [blocks(rng, 20_000, [np.arange(64), np.arange(16)], 3 * ROW)] for n in ("a", "b", "c")}
    s = sampler(arms)
    first = row_spread(s, ["a", "c"], VOCAB)
    assert list(first) == ["a", "c"]
    again = row_spread(sampler({n: [r.copy() for r in runs] for n, runs in arms.items()}), ["a", "c"], VOCAB)
    assert first == again  # exact floats: the policy replayed at a relaunch starts from the same prior
    assert row_spread(s, ["a", "b", "c"], VOCAB)["a"] != first["a"]  # the unigram is the targets' own


def test_spread_rows_are_evenly_spaced_and_never_span_two_runs():
    """An arm of several token runs (token shards, files read in place): the measured rows are windows of
    one run each, spread over all of them."""
    runs = [np.full(50, 1, np.uint16), np.arange(100, dtype=np.uint16) % VOCAB, np.full(40, 7, np.uint16)]
    s = sampler({"a": runs, "b": [np.arange(200, dtype=np.uint16) % VOCAB]})
    rows = s.spread_rows(0, 30)
    assert rows.shape == (30, ROW)
    windows = {tuple(r[i : i + ROW]) for r in runs for i in range(r.size - ROW + 1)}
    assert all(tuple(row) in windows for row in rows)
    assert {int(row[0]) for row in rows} >= {1, 7}  # the first run's rows and the last's
    assert np.array_equal(rows, s.spread_rows(0, 30))


def test_unigram_gap_sets_few_repeated_tokens_apart():
    """Two target arms of text-like tokens (a skewed distribution over a vocabulary of 1,024); `same` drawn
    like them; `names`: a handful of tokens over and over; `random`: every token alike. Only the arms that
    are not targets get a gap, bit for bit the same on every call."""
    rng = np.random.default_rng(2)
    vocab = 1024
    skew = 1.0 / np.arange(1, vocab + 1)

    def text(n):
        return rng.choice(vocab, n, p=skew / skew.sum()).astype(np.uint16)

    arms = {
        "a": [text(30_000)],
        "b": [text(30_000)],
        "same": [text(30_000)],
        "names": [np.tile(np.arange(50, 56, dtype=np.uint16), 5_000)],
        "random": [rng.integers(0, vocab, 30_000).astype(np.uint16)],
    }
    gap = unigram_gap(sampler(arms), ["a", "b"], vocab)
    assert list(gap) == ["same", "names", "random"]
    assert abs(gap["same"]) < 0.1 and gap["names"] > 1.0 and gap["random"] < -0.5
    assert gap == unigram_gap(sampler({n: [r.copy() for r in runs] for n, runs in arms.items()}), ["a", "b"], vocab)
