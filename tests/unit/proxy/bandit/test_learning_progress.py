"""The learning-progress policy (bandit/learning_progress.py, policy "progress")."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.bandit import LearningProgress, make_bandit, project_capped_simplex
from proxy.bandit.learning_progress import allocate
from proxy.config.policies import bandit_config

from .four_arms import ARMS, CAPS, FLOORS, curation_losses, run


def test_progress_speed_is_the_slope_of_the_record_low():
    b = LearningProgress(
        ["a", "b"], {"a": 1, "b": 1}, {"a": 0, "b": 0}, record_alpha=1.0, window=20, explore=0.0, smoothing=0.0
    )
    for t in range(1, 41):  # a falls by 0.03 per step; b falls for 10 steps, then rises
        b.observe(t, {"a": 6.0 - 0.03 * t, "b": 5.0 - 0.1 * min(t, 10) + 0.05 * max(0, t - 10)})
    np.testing.assert_allclose(b.speed(), [0.03, 0.0], atol=1e-12)  # b's record has not moved in 20 pulls
    np.testing.assert_allclose(b.weights(), [1.0, 0.0])
    assert list(b.record) == pytest.approx([6.0 - 0.03 * 40, 4.0])


def test_progress_allocation_keeps_caps_floors_and_explore():
    floors, caps = np.array([0.02] * 4), np.array([0.5] * 4)
    w = allocate(np.array([3.0, 1.0, 0.0, 0.0]), floors, caps, explore=0.05)
    spare = 0.05 * (1 - floors.sum()) / 4
    np.testing.assert_allclose(w[2:], 0.02 + spare)  # no progress: floor and a part of explore, no more
    np.testing.assert_allclose(w[0], 0.5)  # capped; its excess went to b, not evenly
    np.testing.assert_allclose(w.sum(), 1.0)
    # the Euclidean projection would have lifted the arms without progress above that
    v = floors + spare + (1 - 4 * (0.02 + spare)) * np.array([0.75, 0.25, 0, 0])
    assert project_capped_simplex(v, floors, caps)[2] > w[2] + 0.05
    # all capped but one: the caps leave nowhere else to go
    np.testing.assert_allclose(
        allocate(np.array([1.0, 1.0, 1.0, 0.0]), floors, np.array([0.3, 0.3, 0.3, 1.0]), 0.0), [0.3, 0.3, 0.3, 0.1]
    )
    np.testing.assert_allclose(allocate(np.zeros(4), floors, caps, 0.05), 0.25)  # nothing known: uniform


def test_progress_starts_uniform_and_stays_without_evidence():
    b = make_bandit(bandit_config("progress"), ARMS, CAPS, FLOORS)
    np.testing.assert_allclose(b.weights(), 0.25)
    for t in range(1, 60):
        b.observe(t, {a: 5.0 for a in ARMS}, mixture=b.mixture())
    np.testing.assert_allclose(b.speed(), 0.0)
    np.testing.assert_allclose(b.weights(), 0.25)


def test_progress_curates_junk_and_learned_duplicates():
    b = make_bandit(bandit_config("progress"), ARMS, CAPS, FLOORS)
    w = run(b, curation_losses(1, 400))
    junk, dup, real, slow = (ARMS.index(a) for a in ("junk", "dup", "real", "slow"))
    assert w[80:, junk].max() <= FLOORS["junk"] + 0.05  # junk: about its floor (the goal)
    assert w[10:50, dup].mean() > 0.3  # duplicates while they are being learned...
    assert w[250:, dup].max() <= 0.1  # ... and not once they are
    assert w[250:, real].mean() > w[250:, slow].mean() > 0.15
    st = b.state()["arms"]
    assert st["real"]["reward"] > st["slow"]["reward"] > 0 == st["junk"]["reward"] and st["real"]["pulls"] == 400


def test_progress_is_not_fooled_by_noise_or_recovery():
    """ucb1's max(0, EMA - loss) pays a noisy flat arm; progress does not, nor an arm whose loss
    rose and falls back to where it was (random tokens while the model sharpens elsewhere)."""
    rng = np.random.default_rng(5)
    history = [
        (
            s,
            {
                "flat_noisy": 6.0 + rng.normal(0, 0.5),
                "learning": 6.0 - 0.002 * s,
                "recovering": 7.6 + 0.4 * np.sin(np.pi * min(s, 400) / 400),
            },
        )
        for s in range(1, 601)
    ]
    names = ["flat_noisy", "learning", "recovering"]
    caps, floors = {n: 1.0 for n in names}, {n: 0.02 for n in names}
    ucb = run(make_bandit(bandit_config("ucb1"), names, caps, floors), history)
    prog = run(make_bandit(bandit_config("progress"), names, caps, floors), history)
    assert ucb[300:, 0].mean() > 0.5  # the noisy arm wins under ucb1
    assert prog[300:, [0, 2]].max() < 0.1  # both get about their floor under progress
    assert prog[300:, 1].mean() > 0.9


def test_progress_window_must_fit_a_line():
    with pytest.raises(ValueError, match="window"):
        bandit_config("progress", window=2)
