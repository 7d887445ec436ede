"""A bandit rebuilt from `.loss.json` (bandit/__init__.py: bandit_for_phase) gives the live one's weights."""

from __future__ import annotations

import json

import numpy as np
import pytest

from proxy.bandit import make_bandit
from proxy.config.policies import bandit_config

from .four_arms import ARMS, CAPS, FLOORS, curation_losses


@pytest.mark.parametrize("policy", ["uniform", "progress"])
def test_replay_from_the_log_is_exact(policy):
    """A bandit rebuilt from .loss.json entries (JSON round trip, with their mixtures) gives the
    live bandit's weights before every step, bit for bit, and the same state."""
    cfg = bandit_config(policy)
    live = make_bandit(cfg, ARMS, CAPS, FLOORS)
    logged = []
    for step, losses in curation_losses(7, 300):
        mix = live.mixture()
        logged.append(json.loads(json.dumps({"step": step, "arms": losses, "mixture": mix})))
        live.observe(step, losses, mixture=mix)
    for cut in (0, 137, 300):  # a resume at any step: replay up to it, then go on live
        rebuilt = make_bandit(cfg, ARMS, CAPS, FLOORS)
        for e in logged[:cut]:
            rebuilt.observe(e["step"], e["arms"], mixture=e["mixture"])
        for e in logged[cut:]:
            assert np.array_equal(rebuilt.weights(), np.array([e["mixture"][a] for a in ARMS]))
            rebuilt.observe(e["step"], e["arms"], mixture=e["mixture"])
        assert np.array_equal(rebuilt.weights(), live.weights())
        assert rebuilt.state() == live.state()
    assert json.loads(json.dumps(live.state())) == live.state()
