"""`proxy eval` (commands/evaluate.py): the tokens its rows predict."""

from __future__ import annotations

import numpy as np


def test_distinct_predicted_tokens_of_overlapping_rows():
    """`proxy eval` counts each position its rows predict once: a 1,041-token file (1,040 tokens and
    <|endoftext|>) in two rows of 1,025 at ctx 1024 predicts positions 1..1040, not 2,048."""
    from proxy.commands.evaluate import predicted_tokens
    from proxy.data.batches import evenly_spaced_starts

    assert predicted_tokens(evenly_spaced_starts(1041, 1025, 2), 1024) == 1040
    assert predicted_tokens(np.array([0, 64, 128]), 64) == 192  # rows end to end: no overlap
    assert predicted_tokens(np.array([0, 0]), 64) == 64  # the same row twice
    assert predicted_tokens(np.array([5]), 64) == 64
