"""The mixture schedule a launch rebuilds from `.loss.json` (launcher._rebuild_bandit) is the live one: for a
resume at every step of a phase, before and after a pivot, each step's mixture is the same bits as the live
run's, and so is every mixture after it when the run goes on."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from proxy.bandit import Bandit, make_bandit
from proxy.bandit.schedule import MixtureSchedule
from proxy.config.policies import EXP3Config, PolicyConfig, TargetConfig
from proxy.formats.loss_log import EvalEntry, LossLogIndex, LossLogWriter, StepEntry
from proxy.supervision import launcher

ARMS = ["code", "prose", "noise"]
LAG = 2
EVAL_EVERY = 5


@dataclass
class PhaseStandIn:
    """The two fields of rundir.phases.Phase the replay reads."""

    phase: int
    start_step: int


@dataclass
class ReportStandIn:
    dropped_arms: set[str] = field(default_factory=set)

    def drop_arms(self, names) -> None:
        self.dropped_arms |= set(names)


@dataclass
class ContextStandIn:
    """What _rebuild_bandit reads of RunContext; new_bandit makes the phase's fresh bandit, as RunContext's."""

    phase: PhaseStandIn
    new_bandit: Callable[[], Bandit]
    lag: int = LAG
    arm_names: list[str] = field(default_factory=lambda: list(ARMS))
    report: ReportStandIn = field(default_factory=ReportStandIn)
    warnings: list[str] = field(default_factory=list)

    def warn(self, line: str) -> None:
        self.warnings.append(line)


def step_losses(step: int, mixture: dict[str, float]) -> dict[str, float]:
    """Losses that depend on the mixture, so a wrong mixture anywhere changes every one after it."""
    return {arm: 4.0 - 0.01 * step + 0.3 * math.sin(step * 0.7 + i) - 0.5 * mixture[arm] for i, arm in enumerate(ARMS)}


def eval_losses(step: int) -> dict[str, float]:
    """Code learns, prose has stalled (the target policy moves its rows to code), noise learns slowly."""
    return {"code": 4.5 - 0.03 * step, "prose": 4.0 + 0.001 * math.sin(step), "noise": 5.0 - 0.01 * step}


def run_live(
    schedule: MixtureSchedule,
    first: int,
    last: int,
    phase: PhaseStandIn,
    launch: int,
    writer: LossLogWriter | None,
    skip_evals: frozenset[int] = frozenset(),
) -> dict[int, bytes]:
    """Steps first..last as the event handlers take them (events.py on_step, _eval_entry): W(t) read from the
    schedule when step t is drawn, logged, observed, then the step's evaluation. Returns each W(t)'s bytes."""
    drawn = {}
    for t in range(first, last + 1):
        mixture = schedule.named(t)  # a KeyError: the step's mixture was not known in time
        drawn[t] = schedule.mixture_for(t).tobytes()
        arms = step_losses(t, mixture)
        if writer is not None:
            writer.append(
                StepEntry(
                    step=t,
                    loss=sum(arms.values()) / 3,
                    lr=0.1,
                    grad_norm=1.0,
                    tokens=t,
                    time=0.0,
                    ms=1.0,
                    arms=arms,
                    mixture=mixture,
                    phase=phase.phase,
                    segment=launch,
                )
            )
        schedule.observe(t, arms, mixture=mixture)
        if t % EVAL_EVERY == 0 and t not in skip_evals:
            evaluation = eval_losses(t)
            if writer is not None:
                writer.append(
                    EvalEntry(
                        step=t,
                        loss=sum(evaluation.values()) / 3,
                        arms=evaluation,
                        time=0.0,
                        phase=phase.phase,
                        segment=launch,
                    )
                )
            if t >= phase.start_step:
                schedule.observe_eval(t, evaluation)
    return drawn


def fresh(config: PolicyConfig, max_steps: int = 0) -> Callable[[], Bandit]:
    """The phase's bandit: code and prose are the target arms, noise an easy arm (fed in the opening)."""
    return lambda: make_bandit(
        config,
        ARMS,
        {"noise": 0.5},
        {"code": 0.05},
        targets=["code", "prose"],
        max_steps=max_steps,
        unigram_gap={"noise": 10.0},
    )


def assert_replay_matches(
    log: Path,
    ctx: ContextStandIn,
    live: dict[int, bytes],
    first_c: int,
    last_c: int,
    end: int,
    skip_evals: frozenset[int] = frozenset(),
) -> None:
    """For every resume step c: the rebuilt schedule holds W(c+1..c+lag) as live, and going on from it (with the
    live run's evaluations, `skip_evals` not logged) gives every later W as live."""
    index = LossLogIndex.load(log)
    for c in range(first_c, last_c + 1):
        schedule = launcher._rebuild_bandit(ctx, index, c)
        assert sorted(schedule.mixtures) == [s for s in range(c + 1, c + LAG + 1)], c
        for s in range(c + 1, c + LAG + 1):
            assert schedule.mixture_for(s).tobytes() == live[s], (c, s)
        again = run_live(schedule, c + 1, end, ctx.phase, 3, None, skip_evals)
        assert again == {s: live[s] for s in range(c + 1, end + 1)}, c


@pytest.mark.parametrize("config", [TargetConfig(eval_window=3), EXP3Config()], ids=["target", "exp3"])
def test_a_resume_at_any_step_draws_every_step_from_the_live_mixture(tmp_path: Path, config: PolicyConfig):
    log = tmp_path / ".loss.json"
    writer = LossLogWriter(log)
    phase = PhaseStandIn(0, 0)
    new_bandit = fresh(config, max_steps=40)
    live = run_live(MixtureSchedule(new_bandit(), LAG, 0, 1), 1, 40, phase, 1, writer)
    writer.close()
    assert len(set(live.values())) > 10  # the mixture moves: the comparison below can fail
    ctx = ContextStandIn(phase, new_bandit)
    assert_replay_matches(log, ctx, live, 0, 38, 40)
    assert ctx.warnings == []


@pytest.mark.parametrize("config", [TargetConfig(eval_window=3), EXP3Config()], ids=["to-target", "to-exp3"])
def test_after_a_pivot_the_new_phase_replays_as_it_ran_live(tmp_path: Path, config: PolicyConfig):
    """Phase 0 (target) trained to step 30 and evaluated at 30; the pivot went back to step 20 and phase 1
    (target or exp3) starts there: its launch gets phase 0's evaluation at 20 first, never phase 0's at 30 (left in the
    log; phase 1's own evaluation of step 30 was not logged, as when its loss is not finite)."""
    log = tmp_path / ".loss.json"
    writer = LossLogWriter(log)
    phase0 = PhaseStandIn(0, 0)
    run_live(MixtureSchedule(fresh(TargetConfig(eval_window=3), 40)(), LAG, 0, 1), 1, 30, phase0, 1, writer)
    writer.fsync()
    phase1 = PhaseStandIn(1, 20)
    ctx = ContextStandIn(phase1, fresh(config))
    start = launcher._rebuild_bandit(ctx, LossLogIndex.load(log), 20)  # the new phase's first launch
    live = run_live(start, 21, 40, phase1, 2, writer, skip_evals=frozenset({30}))
    writer.close()
    assert len(set(live.values())) > 2  # the mixture moves (the target policy only after a few evaluations)
    assert_replay_matches(log, ctx, live, 20, 38, 40, skip_evals=frozenset({30}))


def test_the_replay_leaves_out_arms_the_experiment_does_not_define(tmp_path: Path):
    """A step logged with an arm the experiment no longer has: warned of once, dropped from the replay, the
    mixtures as if the arm had never been logged."""
    log = tmp_path / ".loss.json"
    writer = LossLogWriter(log)
    phase = PhaseStandIn(0, 0)
    new_bandit = fresh(EXP3Config())
    live = run_live(MixtureSchedule(new_bandit(), LAG, 0, 1), 1, 12, phase, 1, None)
    replayed_schedule = MixtureSchedule(new_bandit(), LAG, 0, 1)
    for t in range(1, 11):
        mixture = replayed_schedule.named(t)
        arms = step_losses(t, mixture)
        writer.append(
            StepEntry(
                step=t,
                loss=1.0,
                lr=0.1,
                grad_norm=1.0,
                tokens=t,
                time=0.0,
                ms=1.0,
                arms={**arms, "gone": 9.0},
                mixture=mixture,
                phase=0,
                segment=1,
            )
        )
        replayed_schedule.observe(t, arms, mixture=mixture)
        if t % EVAL_EVERY == 0:
            evaluation = eval_losses(t)
            writer.append(EvalEntry(step=t, loss=1.0, arms=evaluation, time=0.0, phase=0, segment=1))
            replayed_schedule.observe_eval(t, evaluation)
    writer.close()
    ctx = ContextStandIn(phase, new_bandit)
    schedule = launcher._rebuild_bandit(ctx, LossLogIndex.load(log), 10)
    assert [schedule.mixture_for(s).tobytes() for s in (11, 12)] == [live[11], live[12]]
    assert len(ctx.warnings) == 1 and "gone" in ctx.warnings[0] and ctx.report.dropped_arms == {"gone"}
    np.testing.assert_array_equal(schedule.bandit.weights(), replayed_schedule.bandit.weights())


def test_bandit_replay_feeds_each_evaluation_of_the_phase_after_its_step(tmp_path, monkeypatch):
    """The rebuilt bandit gets the evaluation at the phase's start step first (logged by the phase before),
    then every step, each evaluation of this phase right after its step; an evaluation left in the log by
    the phase before the pivot, past its start, is not this phase's and is not given (live, this phase
    never gave it)."""
    from proxy.supervision import context  # noqa: PLC0415

    class Recorder:
        def __init__(self):
            self.calls = []

        def weights(self):
            return [0.5, 0.5]

        def observe(self, step, arms, mixture=None):
            self.calls.append(("step", step))

        def observe_eval(self, step, arms):
            self.calls.append(("eval", step, arms["a"]))

    log = tmp_path / ".loss.json"
    writer = LossLogWriter(log)

    def step(s, phase):
        writer.append(
            StepEntry(
                step=s,
                loss=1.0,
                lr=0.1,
                grad_norm=1.0,
                tokens=s,
                time=0.0,
                ms=1.0,
                arms={"a": 1.0, "b": 1.0},
                mixture={"a": 0.5, "b": 0.5},
                phase=phase,
                segment=1,
            )
        )

    def evaluation(s, phase, value):
        writer.append(EvalEntry(step=s, loss=value, arms={"a": value, "b": value}, time=0.0, phase=phase, segment=1))

    for s in range(1, 31):  # phase 0 trained to step 30, evaluated at 10, 20, 30; the pivot went back to 20
        step(s, 0)
        if s % 10 == 0:
            evaluation(s, 0, float(s))
    for s in range(21, 41):  # phase 1 from step 20: its evaluation at 30 was not logged (not finite), 40 was
        step(s, 1)
        if s == 40:
            evaluation(s, 1, 40.5)
    writer.close()
    recorder = Recorder()
    monkeypatch.setattr(
        context, "bandit_for_phase", lambda experiment, phase, row_spread, unigram_gap: (recorder, {}, {})
    )
    ctx = SimpleNamespace(
        phase=SimpleNamespace(phase=1, start_step=20),
        experiment=None,
        lag=2,
        arm_names=["a", "b"],
        report=SimpleNamespace(dropped_arms=set()),
        warn=lambda line: None,
        row_spread={},
        unigram_gap={},
    )
    ctx.new_bandit = lambda: context.RunContext.new_bandit(ctx)  # the real method, on this stand-in
    launcher._rebuild_bandit(ctx, LossLogIndex.load(log), 40)
    assert recorder.calls == [("eval", 20, 20.0)] + [("step", s) for s in range(21, 41)] + [("eval", 40, 40.5)]
    assert ctx.bandit is recorder
