"""MixtureSchedule (proxy/bandit/schedule.py): W(s) is fixed when step s - lag is observed, kept until s is."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.bandit import Bandit, make_bandit
from proxy.bandit.schedule import MixtureSchedule
from proxy.config.policies import EXP3Config

ARMS = ["a", "b", "c"]


def exp3() -> Bandit:
    return make_bandit(EXP3Config(), ARMS, {}, {})


def losses(step: int) -> dict[str, float]:
    return {"a": 3.0 + 0.1 * step, "b": 2.0, "c": 1.0 + 0.01 * step}


def test_a_fresh_phase_knows_the_first_lag_steps_and_no_more():
    bandit = exp3()
    initial = bandit.weights()
    schedule = MixtureSchedule(bandit, lag=3, start_step=0, first_step=1)
    for s in (1, 2, 3):
        assert np.array_equal(schedule.mixture_for(s), initial)
    assert schedule.mixture_for(4) is None
    with pytest.raises(KeyError):
        schedule.named(4)


def test_a_launch_past_the_first_lag_steps_knows_nothing_until_the_replay():
    """Resuming at c = 10 of a phase that started at 0: W(11..12) rest on steps 9 and 10, not on the initial
    weights."""
    schedule = MixtureSchedule(exp3(), lag=2, start_step=0, first_step=11)
    assert schedule.mixtures == {}
    schedule = MixtureSchedule(exp3(), lag=2, start_step=10, first_step=12)  # c = 11: only W(12) is initial
    assert sorted(schedule.mixtures) == [12]


def warmed_up(lag: int, steps: int) -> tuple[Bandit, MixtureSchedule]:
    """An exp3 schedule that observed steps 1..steps (exp3 keeps the mixture uniform for about ten)."""
    bandit = exp3()
    schedule = MixtureSchedule(bandit, lag=lag, start_step=0, first_step=1)
    for t in range(1, steps + 1):
        schedule.observe(t, losses(t), mixture=schedule.named(t))
    return bandit, schedule


def test_observing_step_t_fixes_w_of_t_plus_lag_and_forgets_w_of_t():
    bandit, schedule = warmed_up(lag=2, steps=12)
    assert sorted(schedule.mixtures) == [13, 14]
    assert np.array_equal(schedule.mixture_for(14), bandit.weights())
    assert not np.array_equal(schedule.mixture_for(14), schedule.mixture_for(13))  # exp3 moved
    schedule.observe(13, losses(13), mixture=schedule.named(13))
    assert schedule.mixture_for(13) is None and sorted(schedule.mixtures) == [14, 15]
    named = schedule.named(15)
    assert list(named) == ARMS and np.array_equal(np.array(list(named.values())), schedule.mixture_for(15))


def test_a_fixed_mixture_is_a_copy_that_later_observations_leave_alone():
    bandit, schedule = warmed_up(lag=2, steps=12)
    w14 = schedule.mixture_for(14).copy()
    schedule.observe_eval(12, {"a": 5.0, "b": 5.0, "c": 5.0})
    schedule.observe(13, losses(13), mixture=schedule.named(13))
    assert np.array_equal(schedule.mixture_for(14), w14)
    assert not np.array_equal(schedule.mixture_for(15), w14)


def test_the_bandit_gets_the_mixture_given_not_the_one_held():
    """The replay hands back the logged floats; the bandit must see exactly those (exp3 weights its reward by
    them)."""
    seen = []

    class Recorder:
        arm_names = ARMS

        def weights(self) -> np.ndarray:
            return np.full(3, 1 / 3)

        def observe(self, step, arm_losses, mixture=None) -> None:
            seen.append((step, dict(mixture)))

    schedule = MixtureSchedule(Recorder(), lag=1, start_step=0, first_step=1)
    schedule.observe(1, losses(1), mixture={"a": 0.5, "b": 0.25, "c": 0.25})
    assert seen == [(1, {"a": 0.5, "b": 0.25, "c": 0.25})]


def test_a_lag_below_one_is_refused():
    with pytest.raises(ValueError, match="lag"):
        MixtureSchedule(exp3(), lag=0, start_step=0, first_step=1)
