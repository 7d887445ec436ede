"""Three arms a, b, c with their bounds and loss histories, which the tests of UCB1, EXP3 and every bandit share."""

from __future__ import annotations

import numpy as np

TOL = 1e-9
NAMES = ["a", "b", "c"]
CAPS = {"a": 0.8, "b": 0.8, "c": 0.8}
FLOORS = {"a": 0.05, "b": 0.05, "c": 0.05}


def losses(seed: int, steps: int):
    """a improves slowly, b fast, c not at all but stays highest."""
    rng = np.random.default_rng(seed)
    for s in range(1, steps + 1):
        yield (
            s,
            {
                "a": 6 - 0.001 * s + rng.normal(0, 0.02),
                "b": 6 - 0.005 * s + rng.normal(0, 0.02),
                "c": 7 + rng.normal(0, 0.02),
            },
        )


def check_weights(bandit):
    w = bandit.weights()
    assert abs(w.sum() - 1) < TOL
    assert np.all(w >= bandit.floors - TOL) and np.all(w <= bandit.caps + TOL)
    return w
