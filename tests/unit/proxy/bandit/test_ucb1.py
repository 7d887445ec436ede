"""UCB1 (bandit/ucb1.py)."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.bandit import UCB1, make_bandit
from proxy.config.policies import bandit_config

from .three_arms import CAPS, FLOORS, NAMES, check_weights, losses


def test_ucb1_favors_the_arm_that_learns_fastest():
    b = make_bandit(bandit_config("ucb1"), NAMES, CAPS, FLOORS)
    for step, arm_losses in losses(0, 300):
        b.observe(step, arm_losses)
        check_weights(b)
    w = b.weights()
    assert w[1] == pytest.approx(0.8) and w[1] > w[0] and w[1] > w[2]
    st_ = b.state()["arms"]
    assert st_["b"]["reward"] > st_["a"]["reward"] > st_["c"]["reward"]
    assert st_["b"]["pulls"] == 300


def test_ucb1_reward_formula():
    b = UCB1(["x"], {"x": 1}, {"x": 0}, c=0.0, ema_alpha=0.1, reward_scale=1000.0)
    b.observe(1, {"x": 5.0})  # first: EMA := 5, reward 0
    b.observe(2, {"x": 4.0})  # reward (5 - 4) * 1000 = 1000; EMA = 0.1*4 + 0.9*5 = 4.9
    b.observe(3, {"x": 6.0})  # reward max(0, 4.9 - 6) = 0; EMA = 0.6 + 4.41 = 5.01
    s = b.state()["arms"]["x"]
    assert s["pulls"] == 3 and s["ema"] == pytest.approx(5.01) and s["reward"] == pytest.approx(1000 / 3)


def test_ucb1_temperature_zero_is_argmax():
    b = UCB1(NAMES, CAPS, FLOORS, temperature=0.0)
    for step, arm_losses in losses(1, 50):
        b.observe(step, arm_losses)
    np.testing.assert_allclose(b.weights(), [0.1, 0.8, 0.1])  # best at its cap, the rest shared evenly


def test_ucb1_explores_unseen_arms_first():
    b = UCB1(NAMES, {n: 1.0 for n in NAMES}, {n: 0.0 for n in NAMES})
    b.observe(1, {"a": 5.0, "b": 5.0})  # c absent from the step: not updated
    np.testing.assert_allclose(b.weights(), [0, 0, 1])
    assert b.state()["arms"]["c"]["pulls"] == 0 and b.state()["arms"]["c"]["ema"] is None
