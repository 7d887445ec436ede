"""EXP3 (bandit/exp3.py)."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.bandit import EXP3, make_bandit
from proxy.bandit.exp3 import exploration
from proxy.config.policies import bandit_config

from .three_arms import CAPS, FLOORS, NAMES, check_weights, losses


def test_exp3_favors_the_arm_with_highest_loss():
    b = make_bandit(bandit_config("exp3"), NAMES, CAPS, FLOORS)
    for step, arm_losses in losses(0, 300):
        b.observe(step, arm_losses, mixture=b.mixture())
        check_weights(b)
    w = b.weights()
    assert w[2] > w[0] > w[1]


def test_exp3_formula():
    assert exploration(1, 3) == pytest.approx(min(1 / 3, np.sqrt(np.log(3) / 3)))
    assert exploration(100, 3) == pytest.approx(np.sqrt(np.log(3) / 300))
    b = EXP3(["x", "y"], {"x": 1, "y": 1}, {"x": 0, "y": 0}, smoothing=0.9)
    b.observe(1, {"x": 4.0, "y": 2.0}, mixture={"x": 0.5, "y": 0.5})
    np.testing.assert_allclose(b.estimate, [0.1 * 8.0, 0.1 * 4.0])
    eps_t, eps_prev = exploration(2, 2), exploration(1, 2)
    z = eps_prev * b.estimate
    soft = np.exp(z) / np.exp(z).sum()
    np.testing.assert_allclose(b.weights(), (1 - 2 * eps_t) * soft + eps_t)
    b.observe(2, {"x": 4.0}, mixture={"x": 0.25, "y": 0.75})
    assert b.estimate[0] == pytest.approx(0.9 * 0.8 + 0.1 * 16.0) and b.estimate[1] == pytest.approx(0.4)
