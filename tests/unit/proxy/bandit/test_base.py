"""What every bandit does (bandit/base.py, bandit/__init__.py): starts uniform, its state format and checks,
determinism under replay, one policy model per bandit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from proxy.bandit import make_bandit
from proxy.config.policies import bandit_config

from .three_arms import CAPS, FLOORS, NAMES, losses


@pytest.mark.parametrize("policy", ["ucb1", "exp3"])
def test_starts_uniform(policy):
    b = make_bandit(bandit_config(policy), NAMES, CAPS, FLOORS)
    np.testing.assert_allclose(b.weights(), [1 / 3] * 3)
    b = make_bandit(bandit_config(policy), NAMES, {"a": 0.2, "b": 1, "c": 1}, {"a": 0, "b": 0, "c": 0})
    np.testing.assert_allclose(b.weights(), [0.2, 0.4, 0.4])


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
        taken = {
            k: p.default
            for k, p in sig.items()
            if k not in ("self", "arm_names", "caps", "floors", "targets", "row_spread", "max_steps", "unigram_gap")
        }
        assert taken == model().params(), model.__name__
    b = make_bandit(bandit_config("ucb1", c=2.5, ema_alpha=0.3), NAMES, CAPS, FLOORS)
    assert b.c == 2.5 and b.ema_alpha == 0.3
    assert switched(bandit_config("ucb1", ema_alpha=0.3), "exp3") == bandit_config("exp3", ema_alpha=0.3)
    assert switched(bandit_config("progress", explore=0.1), "target").explore == 0.1
