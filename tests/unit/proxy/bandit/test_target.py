"""The target policy (bandit/target.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from proxy.bandit import bandit_for_phase, make_bandit
from proxy.bandit.target import EASY_GAP, OPENING_MOVE
from proxy.config.experiment import load_experiment
from proxy.config.policies import bandit_config
from proxy.rundir.phases import Phase

from .four_arms import ARMS, CAPS, FLOORS, check_bounds, curation_losses

REPO = Path(__file__).resolve().parents[4]
TARGETS = ["real", "slow"]


def target_history(seed: int, steps: int, every: int = 25, stall_at: int | None = None):
    """Steps and evaluations, as the supervisor gives them: (step, train losses, validation losses or None).
    `real` and `slow` are targets that keep learning (slow at half the pace; with `stall_at`, slow stops
    there); `junk` never learns; `dup` falls fast for 60 steps, then is flat."""
    rng = np.random.default_rng(seed)

    def held_out(s):
        slow_s = s if stall_at is None else min(s, stall_at)
        return {
            "real": 7.0 - 2.0 * np.log1p(s / 30) + rng.normal(0, 0.01),
            "slow": 7.0 - 1.0 * np.log1p(slow_s / 30) + rng.normal(0, 0.01),
            "junk": 7.62 + rng.normal(0, 0.01),
            "dup": max(2.0, 7.0 - 0.08 * s) + rng.normal(0, 0.01),
        }

    for s, losses in curation_losses(seed, steps):
        yield s, losses, (held_out(s) if s % every == 0 else None)


def run_target(bandit, history):
    """Feed `history` as the supervisor does; the mixture before every step."""
    weights = []
    for step, losses, evals in history:
        mix = bandit.mixture()
        weights.append(bandit.weights())
        bandit.observe(step, losses, mixture=mix)
        if evals is not None:
            bandit.observe_eval(step, evals)
        check_bounds(bandit)
    return np.array(weights)


def target_bandit(**params):
    return make_bandit(bandit_config("target", **params), ARMS, CAPS, FLOORS, targets=TARGETS)


def test_target_starts_from_the_declared_objective_and_stays_without_evidence():
    """Before any evaluation: the targets share the mass evenly, the other arms have their floors."""
    b = target_bandit()
    np.testing.assert_allclose(b.weights(), [0.48, 0.48, 0.02, 0.02])
    w = run_target(b, ((s, losses, None) for s, losses in curation_losses(0, 200)))
    assert np.array_equal(w[0], w[-1]) and np.array_equal(w[-1], b.weights())
    all_targets = make_bandit(bandit_config("target"), ARMS, CAPS, FLOORS)  # targets default to every arm
    np.testing.assert_allclose(all_targets.weights(), 0.25)


def test_target_prior_weighs_each_target_arm_by_its_quietness():
    """With row spreads (data/row_spread.py), the targets' mass above the floors and `explore` goes in
    proportion to (smallest spread / own spread)^2; a spread of a non-target arm plays no part. While both
    targets learn, the goal stays there; without a usable spread for every target, the even share."""
    caps = {a: 1.0 for a in ARMS}
    spread = {"real": 0.1, "slow": 0.2, "junk": 0.001}
    b = make_bandit(bandit_config("target"), ARMS, caps, FLOORS, targets=TARGETS, row_spread=spread)
    np.testing.assert_allclose(b.quiet, [1.0, 0.25, 0.0, 0.0])
    rest = 1 - 0.08 - 0.05 * 0.92
    np.testing.assert_allclose(b.weights(), [0.02 + 0.023 + rest * 0.8, 0.02 + 0.023 + rest * 0.2, 0.02, 0.02])
    w = run_target(b, target_history(1, 400))
    np.testing.assert_allclose(w[-1], w[0], atol=1e-12)  # both targets still learn: no evidence to move
    np.testing.assert_allclose(b.value, [1.0, 0.25, 0.0, 0.0])
    for partial in ({"real": 0.1}, {"real": 0.1, "slow": 0.0}, {"real": 0.1, "slow": float("nan")}, None):
        even = make_bandit(bandit_config("target"), ARMS, caps, FLOORS, targets=TARGETS, row_spread=partial)
        np.testing.assert_allclose(even.weights(), [0.48, 0.48, 0.02, 0.02])


def test_target_keeps_junk_at_its_floor_and_feeds_the_targets():
    b = target_bandit()
    w = run_target(b, target_history(1, 400))
    junk, dup = ARMS.index("junk"), ARMS.index("dup")
    assert w[:, junk].max() <= FLOORS["junk"] + 0.05 and w[:, dup].max() <= FLOORS["dup"] + 0.05
    assert w[:, :2].sum(axis=1).min() > 0.9
    st = b.state()["arms"]
    assert st["junk"]["reward"] == 0 and st["real"]["reward"] == 1.0 and st["slow"]["reward"] == 1.0


def test_target_gives_a_stalled_target_arm_s_rows_to_the_others():
    """A target arm whose validation loss stops falling (a small arm learned by heart) loses its share to
    the target that still learns; while both learn, they share evenly."""
    b = make_bandit(bandit_config("target"), ARMS, {a: 1.0 for a in ARMS}, FLOORS, targets=TARGETS)
    w = run_target(b, target_history(2, 600, stall_at=200))
    real, slow = ARMS.index("real"), ARMS.index("slow")
    np.testing.assert_allclose(w[150, [real, slow]], 0.48, atol=1e-9)
    assert w[500:, slow].max() < 0.1 and w[500:, real].min() > 0.85
    capped = target_bandit()  # real's cap 0.5: what it cannot take goes to the stalled target, not the junk
    w = run_target(capped, target_history(2, 600, stall_at=200))
    np.testing.assert_allclose(w[500:, real], 0.5)
    np.testing.assert_allclose(w[:, ARMS.index("junk")], 0.02)


def test_target_keeps_a_non_target_at_its_floor_however_its_loss_moves():
    """A non-target arm whose validation loss falls faster than the targets' still keeps its floor: its own
    rows at the floor can make it fall (a small arm learned quickly), which says nothing of the targets."""
    b = target_bandit()
    for i in range(1, 9):
        s = 25 * i
        b.observe(s, {a: 5.0 for a in ARMS})
        b.observe_eval(s, {"real": 6 - 0.01 * s, "slow": 6 - 0.004 * s, "junk": 7 - 0.02 * s, "dup": 7 - 0.005 * s})
    np.testing.assert_allclose(b.value, [1.0, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(b.goal[2:], 0.02)
    b = target_bandit(stall=0.5)  # a target arm between stall and twice stall of the objective's speed: in part
    for i in range(1, 9):
        b.observe(25 * i, {a: 5.0 for a in ARMS})
        b.observe_eval(25 * i, {"real": 6 - 0.01 * 25 * i, "slow": 6 - 0.004 * 25 * i, "junk": 7, "dup": 7})
    np.testing.assert_allclose(b.value, [1.0, 0.004 / (0.5 * 0.007) - 1, 0.0, 0.0])


@pytest.mark.parametrize("seed", [3, 4])
def test_target_mixture_moves_at_most_max_move_per_step(seed):
    """The steadiness bound: no arm's weight moves by more than 25 * max_move (0.15) within 25 steps,
    whatever the evidence does (here: the two targets take turns at learning and stalling, every 150
    steps, with noise)."""
    rng = np.random.default_rng(seed)
    b = make_bandit(bandit_config("target"), ARMS, {a: 1.0 for a in ARMS}, FLOORS, targets=TARGETS)
    level = {"real": 6.0, "slow": 6.0}
    history = []
    for s in range(1, 801):
        learning = "real" if (s // 150) % 2 else "slow"
        level[learning] -= 0.002
        evals = {**{a: v + rng.normal(0, 0.02) for a, v in level.items()}, "junk": 7.6, "dup": 3.0}
        history.append((s, {a: 5.0 for a in ARMS}, evals if s % 10 == 0 else None))
    w = run_target(b, history)
    assert np.abs(np.diff(w, axis=0)).max() <= 0.006 + 1e-12
    moved = max(np.abs(w[t + 25] - w[t]).max() for t in range(len(w) - 25))
    assert 0.05 < moved <= 0.15 + 1e-12  # it did move, within the bound


@pytest.mark.parametrize(
    "spread, max_steps", [(None, 0), ({"real": 0.17, "slow": 0.13}, 0), ({"real": 0.17, "slow": 0.13}, 700)]
)
def test_target_replay_with_evaluations_is_exact(spread, max_steps):
    """Rebuilt from .loss.json (steps and evaluations, JSON round trip, each evaluation after its step),
    the bandit gives the live bandit's weights before every step, bit for bit, from any resume point.
    (With max_steps 700, `dup` easy: the opening feeds it for 50 steps and gives it back by step 71.)"""
    cfg, caps = bandit_config("target"), {a: 1.0 for a in ARMS}
    live = make_bandit(
        cfg, ARMS, caps, FLOORS, targets=TARGETS, row_spread=spread, max_steps=max_steps, unigram_gap={"dup": 1.3}
    )
    logged = []
    for step, losses, evals in target_history(8, 700, stall_at=250):
        mix = live.mixture()
        logged.append(json.loads(json.dumps({"step": step, "arms": losses, "mixture": mix, "eval": evals})))
        live.observe(step, losses, mixture=mix)
        if evals is not None:
            live.observe_eval(step, evals)
    assert len({tuple(e["mixture"].values()) for e in logged}) > 50  # the evaluations did move it
    for cut in (0, 30, 60, 137, 250, 512, 700):  # 30, 60: within the opening of a 700-step run
        rebuilt = make_bandit(
            cfg, ARMS, caps, FLOORS, targets=TARGETS, row_spread=spread, max_steps=max_steps, unigram_gap={"dup": 1.3}
        )
        for e in logged[:cut]:
            rebuilt.observe(e["step"], e["arms"], mixture=e["mixture"])
            if e["eval"] is not None:
                rebuilt.observe_eval(e["step"], e["eval"])
        for e in logged[cut:]:
            assert np.array_equal(rebuilt.weights(), np.array([e["mixture"][a] for a in ARMS]))
            rebuilt.observe(e["step"], e["arms"], mixture=e["mixture"])
            if e["eval"] is not None:
                rebuilt.observe_eval(e["step"], e["eval"])
        assert np.array_equal(rebuilt.weights(), live.weights())
        assert rebuilt.state() == live.state()


def test_target_opening_feeds_an_arm_the_data_shows_easy_then_gives_it_back():
    """The opening of a 500-step run (its first 10%: 50 steps): `dup`, 1.3 nats below the targets at the
    unigram stage (data/row_spread.py's unigram gap), is at its cap from the first step; `junk` (below them)
    at its floor; from feed_until (40: a swing of 0.48 takes 10 steps at OPENING_MOVE) every arm heads back
    to the goal, there by step 51. Within the opening no arm moves more than OPENING_MOVE a step, after it
    no more than max_move. A gap between EASY_GAP and twice it feeds in part."""
    gap = {"junk": -1.6, "dup": 1.3}
    b = make_bandit(bandit_config("target"), ARMS, CAPS, FLOORS, targets=TARGETS, max_steps=500, unigram_gap=gap)
    assert (b.opening_steps, b.feed_until) == (50, 40)
    no_evals = ((s, losses, None) for s, losses in curation_losses(1, 200))
    w = run_target(b, no_evals)  # w[i]: the mixture step i + 1 is drawn from
    np.testing.assert_allclose(w[:40], [[0.24, 0.24, 0.02, 0.5]] * 40)
    np.testing.assert_allclose(w[50:], [[0.48, 0.48, 0.02, 0.02]] * 150)
    moves = np.abs(np.diff(w, axis=0)).max(axis=1)  # moves[i]: from step i + 1 to step i + 2
    assert moves[:49].max() == pytest.approx(OPENING_MOVE) and moves[49:].max() <= 0.006 + 1e-12
    half = make_bandit(
        bandit_config("target"), ARMS, CAPS, FLOORS, targets=TARGETS, max_steps=500, unigram_gap={"dup": 1.5 * EASY_GAP}
    )
    np.testing.assert_allclose(half.weights(), [0.36, 0.36, 0.02, 0.02 + 0.5 * 0.48])


@pytest.mark.parametrize("gap", [{"dup": 0.9 * EASY_GAP, "junk": -1.0}, {"dup": float("nan")}, {}, None])
def test_target_opening_feeds_no_arm_the_data_does_not_show_easy(gap):
    b = make_bandit(bandit_config("target"), ARMS, CAPS, FLOORS, targets=TARGETS, max_steps=500, unigram_gap=gap)
    assert b.has_opening is False
    np.testing.assert_allclose(b.weights(), [0.48, 0.48, 0.02, 0.02])


def test_target_opening_only_where_it_fits():
    """No opening (the prior from the first step): with `opening` 0, in a run too short to feed and give
    back within its opening (100 steps: 10, the way back alone), in a phase that starts after step 0 (a
    pivot's: the model has left its first steps behind), and for an arm marked `target` however easy."""
    gap = {"junk": -1.6, "dup": 1.3}
    for b in (
        make_bandit(
            bandit_config("target", opening=0), ARMS, CAPS, FLOORS, targets=TARGETS, max_steps=500, unigram_gap=gap
        ),
        make_bandit(bandit_config("target"), ARMS, CAPS, FLOORS, targets=TARGETS, max_steps=100, unigram_gap=gap),
        make_bandit(bandit_config("target"), ARMS, CAPS, FLOORS, targets=TARGETS, unigram_gap=gap),
        make_bandit(bandit_config("target"), ARMS, CAPS, FLOORS, max_steps=500, unigram_gap=gap),
    ):
        assert b.has_opening is False
        np.testing.assert_allclose(b.weights(), [0.48, 0.48, 0.02, 0.02] if b.is_target.sum() == 2 else 0.25)
    experiment = load_experiment(REPO / "experiments" / "MIXING-WORTHLESS.json", check_sources=False)  # 500 steps
    for start, opening in ((0, True), (100, False)):
        phase = Phase(phase=0, start_step=start, policy="target", caps={}, floors={})
        bandit, _caps, _floors = bandit_for_phase(experiment, phase, None, {"junk": -1.6, "duplicates": 1.3})
        assert bandit.has_opening is opening and bandit.opening_steps == (50 if opening else 0)


def test_target_checks_its_inputs():
    with pytest.raises(ValueError, match="targets must be some of the arms"):
        make_bandit(bandit_config("target"), ARMS, CAPS, FLOORS, targets=["nope"])
    b = target_bandit()
    b.observe_eval(25, {a: 5.0 for a in ARMS})
    with pytest.raises(ValueError, match="after the evaluation of step 25"):
        b.observe_eval(25, {a: 5.0 for a in ARMS})
    b.observe_eval(50, {"real": 5.0})  # incomplete: not evidence, not an error
    assert len(b.evals) == 1
    with pytest.raises(ValueError, match="eval_window"):
        bandit_config("target", eval_window=2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_target_keeps_two_arms_alike_even_where_progress_swings(seed):
    """Two target arms with the same learning curve, the evaluations noisy (0.02 nats each) and the
    training losses noisier (0.4): the target policy keeps them even (the noise never makes one look
    stalled); progress, which follows the noisy record lows, swings between its extremes (what a user
    saw in the dashboard's mixture chart)."""
    rng = np.random.default_rng(seed)
    names, caps, floors = ["a", "b"], {"a": 1.0, "b": 1.0}, {"a": 0.02, "b": 0.02}
    target = make_bandit(bandit_config("target"), names, caps, floors)
    progress = make_bandit(bandit_config("progress"), names, caps, floors)
    shares = {"target": [], "progress": []}
    for s in range(1, 3001):
        level = 7 - 1.5 * np.log1p(s / 50)
        losses = {a: level + rng.normal(0, 0.4) for a in names}
        evals = {a: level + rng.normal(0, 0.02) for a in names} if s % 20 == 0 else None
        for name, b in (("target", target), ("progress", progress)):
            shares[name].append(b.weights()[0])
            b.observe(s, losses, mixture=b.mixture())
            if evals is not None:
                b.observe_eval(s, evals)
    np.testing.assert_allclose(shares["target"], 0.5)
    assert min(shares["progress"][300:]) < 0.1 and max(shares["progress"][300:]) > 0.9
