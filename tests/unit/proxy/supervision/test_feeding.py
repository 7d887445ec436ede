"""FrameFeeder (proxy/supervision/feeding.py): a step is sent only once its mixture is known, drawn from the
schedule's very array, with the evaluations and audits due; the last step is followed by STOP."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from proxy.bandit import make_bandit
from proxy.bandit.schedule import MixtureSchedule
from proxy.config.experiment import TrainConfig
from proxy.config.policies import EXP3Config
from proxy.formats import frames
from proxy.rundir.resume import ResumePoint
from proxy.supervision.feeding import FrameFeeder, due, sample_seed
from proxy.supervision.launch import EngineLaunch

ARMS = ["a", "b"]


@dataclass
class EngineStandIn:
    sent: list[bytes] = field(default_factory=list)

    def send(self, frame: bytes) -> None:
        self.sent.append(frame)


@dataclass
class SamplerStandIn:
    drawn: list[tuple[int, np.ndarray]] = field(default_factory=list)
    row_len: int = 4  # ctx 3
    val: list[np.ndarray] = field(default_factory=lambda: [np.zeros(100, np.uint16)] * len(ARMS))

    def train_batch(self, step: int, weights: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
        self.drawn.append((step, weights))
        return np.zeros((rows, 4), dtype=np.uint16), np.zeros(rows, dtype=np.uint16)

    def eval_batch_all(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros((rows * 2, 4), dtype=np.uint16), np.repeat(np.arange(2, dtype=np.uint16), rows)


def launch_and_feeder(max_steps: int, eval_every: int) -> tuple[EngineLaunch, FrameFeeder, SamplerStandIn]:
    schedule = MixtureSchedule(make_bandit(EXP3Config(), ARMS, {}, {}), lag=2, start_step=0, first_step=1)
    launch = EngineLaunch(
        number=1,
        engine=EngineStandIn(),
        resume=ResumePoint(None, 0),
        next_step=1,
        last_step=0,
        schedule=schedule,
        replay_index=None,
        replay_through=0,
    )
    train = TrainConfig(max_steps=max_steps, batch=2, eval_rows=1, eval_every=eval_every, sample_every=0, seed=1)
    sampler = SamplerStandIn()
    return launch, FrameFeeder(sampler, train, SimpleNamespace(), []), sampler


def test_only_steps_whose_mixture_is_known_are_sent():
    launch, feeder, sampler = launch_and_feeder(max_steps=10, eval_every=0)
    feeder.feed(launch)
    assert [s for s, _w in sampler.drawn] == [1, 2] and launch.next_step == 3
    w1 = launch.schedule.mixture_for(1)
    assert sampler.drawn[0][1] is w1  # the schedule's own array: one value, nothing copied on the way
    launch.schedule.observe(1, {"a": 3.0, "b": 2.0}, mixture=launch.schedule.named(1))
    feeder.feed(launch)
    assert [s for s, _w in sampler.drawn] == [1, 2, 3]
    assert sampler.drawn[2][1] is launch.schedule.mixture_for(3)
    assert [item.key for item in launch.outstanding] == [1, 2, 3]


def test_evaluations_when_due_and_stop_after_the_last_step():
    launch, feeder, sampler = launch_and_feeder(max_steps=2, eval_every=2)
    feeder.feed(launch)
    kinds = [item.kind for item in launch.outstanding]
    assert kinds == ["step", "step", "eval", "stop"] and launch.stop_sent
    assert launch.engine.sent[-1] == frames.stop_frame()
    assert due(2, 2, 2) and not due(2, 1, 5) and not due(0, 4, 4)


def test_sample_seeds_are_pure_and_distinct():
    assert sample_seed(1337, 100, 0) == sample_seed(1337, 100, 0)
    seeds = {sample_seed(1337, s, i) for s in range(0, 1000, 100) for i in range(3)}
    assert len(seeds) == 30 and all(0 <= x < 2**64 for x in seeds)
