"""The uniform policy (bandit/uniform.py): losses ignored, stratified batches."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.bandit import Uniform, make_bandit
from proxy.config.policies import bandit_config
from proxy.data.batches import BatchSampler
from proxy.formats.shard import read_shard, write_shard

from .four_arms import ARMS, CAPS, FLOORS, curation_losses, run


def test_uniform_ignores_losses_and_keeps_bounds():
    b = make_bandit(bandit_config("uniform"), ARMS, CAPS, FLOORS)
    assert isinstance(b, Uniform)
    w = run(b, curation_losses(0, 50))
    np.testing.assert_allclose(w, 0.25)
    st = b.state()
    assert st["policy"] == "uniform" and st["arms"]["junk"]["pulls"] == 50 and st["arms"]["dup"]["reward"] == 0.0
    capped = make_bandit(
        bandit_config("uniform"), ["a", "b", "c"], {"a": 0.1, "b": 1, "c": 1}, {"a": 0, "b": 0, "c": 0}
    )
    np.testing.assert_allclose(capped.weights(), [0.1, 0.45, 0.45])  # the cap holds, the rest shared evenly


@pytest.mark.parametrize("rows", [5, 8, 13])
def test_uniform_batches_are_stratified(tmp_path, rows):
    """Equal weights give every arm floor(rows / K) or ceil(rows / K) rows in every batch."""
    shards = {}
    for i, name in enumerate(ARMS):
        shards[name] = tmp_path / f"{name}.tok"
        write_shard(shards[name], np.full(100, i + 1, dtype=np.uint16), 64)
    ids = {name: read_shard(path)[0] for name, path in shards.items()}
    sampler = BatchSampler({name: [t] for name, t in ids.items()}, ids, ARMS, seed=3, row_len=9)
    w = make_bandit(bandit_config("uniform"), ARMS, {a: 1.0 for a in ARMS}, {a: 0.0 for a in ARMS}).weights()
    for step in range(1, 60):
        _tokens, groups = sampler.train_batch(step, w, rows)
        counts = np.bincount(groups, minlength=len(ARMS))
        assert set(counts) <= {rows // len(ARMS), -(-rows // len(ARMS))}, counts
        again = sampler.train_batch(step, w, rows)[1]
        assert np.array_equal(groups, again)  # a pure function of (seed, step)
