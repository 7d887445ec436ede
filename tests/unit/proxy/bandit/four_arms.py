"""Four arms (real, slow, junk, dup) with their bounds and curation histories, which the policy tests share."""

from __future__ import annotations

import numpy as np

TOL = 1e-9
ARMS = ["real", "slow", "junk", "dup"]
CAPS = {a: 0.5 for a in ARMS}
FLOORS = {a: 0.02 for a in ARMS}


def check_bounds(bandit) -> np.ndarray:
    w = bandit.weights()
    assert abs(w.sum() - 1) < TOL
    assert np.all(w >= bandit.floors - TOL) and np.all(w <= bandit.caps + TOL)
    return w


def curation_losses(seed: int, steps: int):
    """`real` and `slow` keep learning (slow at a third of the pace), `junk` is flat noise around
    7.6, `dup` falls fast and is learned by step 60, then flat."""
    rng = np.random.default_rng(seed)
    for s in range(1, steps + 1):
        yield (
            s,
            {
                "real": 7.0 - 2.0 * np.log1p(s / 30) + rng.normal(0, 0.3),
                "slow": 7.0 - 0.7 * np.log1p(s / 30) + rng.normal(0, 0.3),
                "junk": 7.6 + rng.normal(0, 0.05),
                "dup": max(1.5, 7.0 - 0.1 * s) + rng.normal(0, 0.1),
            },
        )


def run(bandit, history):
    """Observe `history` as the supervisor does: each step with the mixture it was drawn from."""
    weights = []
    for step, losses in history:
        mix = bandit.mixture()
        weights.append(bandit.weights())
        bandit.observe(step, losses, mixture=mix)
        check_bounds(bandit)
    return np.array(weights)
