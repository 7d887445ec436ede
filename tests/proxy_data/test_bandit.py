"""Bandits: the capped-simplex projection, UCB1 and EXP3 behaviour, determinism under replay."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from proxy.bandit import EXP3, UCB1, make_bandit, project_capped_simplex
from proxy.bandit.exp3 import exploration
from proxy.config.policies import bandit_config

TOL = 1e-9


@st.composite
def bounded_problem(draw):
    k = draw(st.integers(1, 8))
    floors = np.array(draw(st.lists(st.floats(0, 1), min_size=k, max_size=k)))
    if floors.sum() > 1:
        floors = floors / floors.sum() * draw(st.floats(0, 1))
    extra = np.array(draw(st.lists(st.floats(0, 1), min_size=k, max_size=k)))
    caps = np.minimum(1.0, floors + extra)
    assume(caps.sum() >= 1)
    v = np.array(draw(st.lists(st.floats(-1e3, 1e3), min_size=k, max_size=k)))
    return v, floors, caps


@given(bounded_problem())
@settings(max_examples=400, deadline=None)
def test_projection_within_bounds_and_sums_to_one(problem):
    v, floors, caps = problem
    w = project_capped_simplex(v, floors, caps)
    assert w.shape == v.shape
    assert np.all(w >= floors - TOL) and np.all(w <= caps + TOL)
    assert abs(w.sum() - 1.0) < TOL


@given(bounded_problem(), st.integers(0, 2**32 - 1))
@settings(max_examples=200, deadline=None)
def test_projection_is_nearest_point(problem, seed):
    v, floors, caps = problem
    w = project_capped_simplex(v, floors, caps)
    # any other feasible point (a random convex move towards another feasible point) is no closer
    rng = np.random.default_rng(seed)
    other = project_capped_simplex(rng.normal(size=v.size) * 3, floors, caps)
    for t in (0.01, 0.3, 1.0):
        u = (1 - t) * w + t * other
        assert np.sum((u - v) ** 2) >= np.sum((w - v) ** 2) - 1e-7


def test_projection_known_values():
    np.testing.assert_allclose(project_capped_simplex([1, 1, 1, 1], np.zeros(4), np.ones(4)), [0.25] * 4)
    np.testing.assert_allclose(project_capped_simplex([0.9, 0.05, 0.05], [0.1] * 3, [0.5, 1, 1]), [0.5, 0.25, 0.25])
    np.testing.assert_allclose(project_capped_simplex([5, 0, 0], [0.1, 0.1, 0.1], [1, 1, 1]), [0.8, 0.1, 0.1])
    np.testing.assert_allclose(project_capped_simplex([0.2, 0.3, 0.5], [0, 0, 0], [1, 1, 1]), [0.2, 0.3, 0.5])
    np.testing.assert_allclose(project_capped_simplex([0, 0], [0.5, 0.5], [1, 1]), [0.5, 0.5])
    with pytest.raises(ValueError, match="floors sum"):
        project_capped_simplex([0, 0], [0.6, 0.6], [1, 1])
    with pytest.raises(ValueError, match="caps sum"):
        project_capped_simplex([0, 0], [0, 0], [0.3, 0.3])


# --- policies ---------------------------------------------------------------

NAMES = ["a", "b", "c"]
CAPS = {"a": 0.8, "b": 0.8, "c": 0.8}
FLOORS = {"a": 0.05, "b": 0.05, "c": 0.05}


def losses(seed: int, steps: int):
    """a improves slowly, b fast, c not at all but stays highest."""
    rng = np.random.default_rng(seed)
    for s in range(1, steps + 1):
        yield s, {"a": 6 - 0.001 * s + rng.normal(0, 0.02),
                  "b": 6 - 0.005 * s + rng.normal(0, 0.02),
                  "c": 7 + rng.normal(0, 0.02)}


def check_weights(bandit):
    w = bandit.weights()
    assert abs(w.sum() - 1) < TOL
    assert np.all(w >= bandit.floors - TOL) and np.all(w <= bandit.caps + TOL)
    return w


@pytest.mark.parametrize("policy", ["ucb1", "exp3"])
def test_starts_uniform(policy):
    b = make_bandit(bandit_config(policy), NAMES, CAPS, FLOORS)
    np.testing.assert_allclose(b.weights(), [1 / 3] * 3)
    b = make_bandit(bandit_config(policy), NAMES, {"a": 0.2, "b": 1, "c": 1}, {"a": 0, "b": 0, "c": 0})
    np.testing.assert_allclose(b.weights(), [0.2, 0.4, 0.4])


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
    b.observe(1, {"x": 5.0})   # first: EMA := 5, reward 0
    b.observe(2, {"x": 4.0})   # reward (5 - 4) * 1000 = 1000; EMA = 0.1*4 + 0.9*5 = 4.9
    b.observe(3, {"x": 6.0})   # reward max(0, 4.9 - 6) = 0; EMA = 0.6 + 4.41 = 5.01
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


@pytest.mark.parametrize("policy", ["ucb1", "exp3"])
def test_replay_is_deterministic(policy):
    cfg = bandit_config(policy)
    history = list(losses(7, 200))
    # the "live" bandit, whose weights are read between steps as a supervisor does
    live = make_bandit(cfg, NAMES, CAPS, FLOORS)
    seen = []
    for step, arm_losses in history:
        seen.append(live.weights())
        live.observe(step, arm_losses)
    # a rebuild from the logged losses alone (round-tripped through JSON, as .loss.json is)
    logged = [json.loads(json.dumps({"step": s, "arms": a})) for s, a in history]
    rebuilt = make_bandit(cfg, NAMES, CAPS, FLOORS)
    for i, entry in enumerate(logged):
        assert np.array_equal(rebuilt.weights(), seen[i])
        rebuilt.observe(entry["step"], entry["arms"])
    assert np.array_equal(rebuilt.weights(), live.weights())
    assert rebuilt.state() == live.state()
    assert json.loads(json.dumps(live.state())) == live.state()


@pytest.mark.parametrize("policy", ["ucb1", "exp3", "uniform", "progress", "target"])
def test_state_format(policy):
    b = make_bandit(bandit_config(policy), NAMES, CAPS, FLOORS)
    st_ = b.state()
    assert st_["policy"] == policy
    assert set(st_["arms"]) == set(NAMES)
    for arm in st_["arms"].values():
        assert set(arm) == {"pulls", "ema", "reward", "weight", "cap", "floor"}


@pytest.mark.parametrize("policy", ["ucb1", "exp3", "uniform", "progress", "target"])
def test_observe_checks(policy):
    b = make_bandit(bandit_config(policy), NAMES, CAPS, FLOORS)
    b.observe(5, {"a": 1.0})
    with pytest.raises(ValueError, match="steps must increase"):
        b.observe(5, {"a": 1.0})
    with pytest.raises(ValueError, match="unknown arm 'zz'"):
        b.observe(6, {"zz": 1.0})
    b.observe(7, {"a": float("nan"), "b": 2.0})  # non-finite losses are ignored
    assert b.state()["arms"]["a"]["pulls"] == 1 and b.state()["arms"]["b"]["pulls"] == 1


def test_each_policy_model_is_its_bandit_s_arguments():
    """A policy's parameters are declared once, in its model (config/policies.py): the bandit class takes
    exactly those keywords, with the same defaults, and a pivot keeps the parameters two policies share."""
    import inspect  # noqa: PLC0415
    from proxy.bandit import _CLASSES  # noqa: PLC0415
    from proxy.config.policies import POLICY_MODELS, switched  # noqa: PLC0415
    assert set(_CLASSES) == set(POLICY_MODELS.values())
    for model, cls in _CLASSES.items():
        sig = inspect.signature(cls.__init__).parameters
        taken = {k: p.default for k, p in sig.items() if k not in ("self", "arm_names", "caps", "floors", "targets",
                                                                  "row_spread", "max_steps", "unigram_gap")}
        assert taken == model().params(), model.__name__
    b = make_bandit(bandit_config("ucb1", c=2.5, ema_alpha=0.3), NAMES, CAPS, FLOORS)
    assert b.c == 2.5 and b.ema_alpha == 0.3
    assert switched(bandit_config("ucb1", ema_alpha=0.3), "exp3") == bandit_config("exp3", ema_alpha=0.3)
    assert switched(bandit_config("progress", explore=0.1), "target").explore == 0.1
