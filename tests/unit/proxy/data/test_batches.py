"""Batches: a pure function of (seed, step, weights); the mixture is obeyed; eval rows are fixed."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.data.batches import BatchError, BatchSampler
from proxy.formats.frames import HEADER, train_frame
from proxy.formats.shard import read_shard, write_shard

ROW = 33


@pytest.fixture
def shards(tmp_path):
    """Arm k's tokens are k*1000 + position % 1000, so a row tells its arm and contiguity."""
    train, val = {}, {}
    for k, (name, n) in enumerate([("a", 5000), ("b", 800), ("c", 40)]):
        tokens = (k * 1000 + np.arange(n) % 1000).astype(np.uint16)
        train[name] = tmp_path / f"{name}.train.tok"
        val[name] = tmp_path / f"{name}.val.tok"
        write_shard(train[name], tokens, 4000)
        write_shard(val[name], tokens[: max(ROW, n // 10)] + 500, 4000)
    return train, val


def arrays(shards):
    """The shards memory-mapped, as the sampler takes them: each arm's training runs, its validation ids."""
    return (
        {name: [read_shard(p)[0]] for name, p in shards[0].items()},
        {name: read_shard(p)[0] for name, p in shards[1].items()},
    )


def sampler(shards, seed=1):
    return BatchSampler(*arrays(shards), ["a", "b", "c"], seed=seed, row_len=ROW)


def test_shapes_and_rows_are_windows(shards):
    s = sampler(shards)
    tokens, groups = s.train_batch(3, [0.5, 0.3, 0.2], 16)
    assert tokens.shape == (16, ROW) and tokens.dtype == np.uint16
    assert groups.shape == (16,) and groups.dtype == np.uint16
    for row, g in zip(tokens, groups, strict=False):
        assert np.all(row // 1000 == g)  # row from its arm
        assert np.all(np.diff(row.astype(int) % 1000) % 1000 == 1)  # a contiguous window
    frame = train_frame(3, tokens, groups)
    assert len(frame) == HEADER.size + 16 * ROW * 2 + 16 * 2


def test_pure_function_of_seed_step_weights(shards):
    s1, s2 = sampler(shards), sampler(shards)
    w = [0.5, 0.3, 0.2]
    # a different history of calls on s1 changes nothing
    for step in (9, 2, 100, 7):
        s1.train_batch(step, [0.1, 0.1, 0.8], 8)
    for step in (1, 2, 1000, 2**40):
        a, ga = s1.train_batch(step, w, 8)
        b, gb = s2.train_batch(step, w, 8)
        assert np.array_equal(a, b) and np.array_equal(ga, gb)
    # and different inputs give different batches
    base = s1.train_batch(5, w, 8)[0]
    assert not np.array_equal(base, s1.train_batch(6, w, 8)[0])
    assert not np.array_equal(base, sampler(shards, seed=2).train_batch(5, w, 8)[0])


def test_known_generator(shards):
    """The draws come from Philox keyed by (seed, step): pin the first rows' arms and offsets."""
    s = sampler(shards, seed=1337)
    gen = np.random.Generator(np.random.Philox(key=[1337, 42]))
    u = gen.random()
    points = (u + np.arange(4)) / 4
    arms = gen.permutation(np.searchsorted(np.cumsum([0.25, 0.25, 0.5]), points, side="right"))
    tokens, groups = s.train_batch(42, [0.25, 0.25, 0.5], 4)
    assert groups.tolist() == arms.tolist()


def test_mixture_obeyed(shards):
    s = sampler(shards)
    w = np.array([0.6, 0.3, 0.1])
    counts = np.zeros(3)
    steps, rows = 400, 8
    for step in range(1, steps + 1):
        _, g = s.train_batch(step, w, rows)
        c = np.bincount(g, minlength=3)
        # systematic sampling: each arm gets floor or ceil of its expected rows
        assert np.all(c >= np.floor(w * rows)) and np.all(c <= np.ceil(w * rows))
        counts += c
    frac = counts / counts.sum()
    assert np.allclose(frac, w, atol=0.01)


def test_floors_respected_and_zero_weight_never_drawn(shards):
    s = sampler(shards)
    w = np.array([0.85, 0.15, 0.0])  # b at a floor of 0.15, c off
    for step in range(1, 200):
        _, g = s.train_batch(step, w, 20)
        c = np.bincount(g, minlength=3)
        assert c[1] >= 3 and c[2] == 0
    _, g = s.train_batch(1, [0.0, 0.0, 1.0], 10)
    assert np.all(g == 2)


def test_offsets_cover_the_shard(shards):
    s = sampler(shards)
    starts = []
    for step in range(1, 300):
        tokens, g = s.train_batch(step, [1.0, 0.0, 0.0], 8)
        starts += (tokens[:, 0].astype(int)).tolist()
    # the first token of a row ranges over the whole arm (values 0..999 repeat every 1000 positions)
    assert min(starts) < 50 and max(starts) > 950


def test_eval_batch_fixed(shards):
    s = sampler(shards)
    t1, g1 = s.eval_batch(0, 4)
    s.train_batch(5, [0.3, 0.3, 0.4], 8)
    t2, g2 = sampler(shards).eval_batch(0, 4)
    assert np.array_equal(t1, t2) and np.array_equal(g1, g2)
    assert t1.shape == (4, ROW) and np.all(g1 == 0)
    assert np.all(t1 // 1000 == 0) and np.all(t1 % 1000 >= 500)  # from the val shard
    starts = t1[:, 0].astype(int) - 500
    assert starts[0] == 0 and starts[-1] == 500 - ROW  # spread over the whole val shard
    t, g = s.eval_batch(2, 3)  # a short val shard: rows overlap, still valid
    assert t.shape == (3, ROW) and np.all(g == 2)


def test_errors(shards, tmp_path):
    with pytest.raises(BatchError, match="arm 'c'"):
        BatchSampler(*arrays(shards), ["a", "b", "c"], seed=1, row_len=41)
    with pytest.raises(BatchError, match="no train/val tokens"):
        BatchSampler(*arrays(shards), ["a", "zz"], seed=1, row_len=ROW)
    s = sampler(shards)
    with pytest.raises(ValueError):
        s.train_batch(1, [0.5, 0.5], 4)
    with pytest.raises(ValueError):
        s.train_batch(1, [0.0, 0.0, 0.0], 4)
